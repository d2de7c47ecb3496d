"""``pgcdc sync``: the options of :mod:`pgcdc.sync` (which says what it does), and its exit
statuses.

::

    pgcdc sync --dsn "host=db dbname=app user=cdc" --publication app_pub --slot cdc \\
        --out tables/ [--trigger 5s] [--master URL] [--scd 1|2] [--heartbeat SECONDS] \\
        [--metrics [HOST:]PORT] [--log-format auto|text|json] [--on-invalid-slot fail|resync] \\
        [--tables-check 30s] [--once]

A table that cannot be applied is set aside while the others go on (pgcdc.sync.aside);
``pgcdc resnapshot --out DIR TABLE`` takes it up again. An error sync has no answer for is
one line on stderr; its traceback is in ``DIR/_sync.log``. ``--once``: stop, exit 0, once
the tables hold what the server had written when it started (the slot and DIR kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import signal
import sys

import psycopg

from pgcdc.capture.walsender import CaptureError, mask_dsn
from pgcdc.cli._common import BAD_DATA, OK, USAGE, Parser, command, exit_code, require, usage_error
from pgcdc.errors import SetupError
from pgcdc.snapshot.server import SnapshotError
from pgcdc.sync import PROG, SyncConfig
from pgcdc.sync.logfile import SyncLog
from pgcdc.sync.pace import TABLES_CHECK_SECONDS
from pgcdc.sync.pipeline import Sync


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 5s, 500ms, 1m)")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be positive: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Keep the tables a publication publishes current as Delta tables under "
        "--out: the initial snapshot when the slot is new, then a durable capture of the slot "
        "applied every --trigger by a Spark Structured Streaming query (SCD1 or SCD2), exactly "
        "once across kills and reruns.",
    )
    p.add_argument("--dsn", default="", help="libpq connection string or URI (default: PG* env)")
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--slot", required=True, help="logical replication slot (created with the "
                   "snapshot on the first run)")  # fmt: skip
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the pipeline's directory: _capture/, _snapshot/ and the Delta tables "
                   "<schema>.<table>/ (other characters than letters, digits, _ and - as ~XX)")  # fmt: skip
    p.add_argument("--trigger", type=_duration, default=5.0, metavar="DURATION",
                   help="apply what was captured this often (5s, 500ms, 1m; default 5s); "
                   "a burst or a backlog starts a cycle once 4 MiB of its WAL is captured, and is "
                   "applied in cycles back to back")  # fmt: skip
    p.add_argument("--tables-check", type=_duration, default=TABLES_CHECK_SECONDS,
                   metavar="DURATION",
                   help="compare the publication's tables with the snapshot's this often, "
                   "after a cycle: tables added, dropped, created again or renamed (default "
                   f"{TABLES_CHECK_SECONDS:g}s; each look is a catalog query)")  # fmt: skip
    p.add_argument("--master", default="local[*]", help="Spark master URL (default %(default)s)")
    p.add_argument("--scd", type=int, choices=(1, 2), default=1,
                   help="1: current state (default), 2: history")  # fmt: skip
    p.add_argument("--heartbeat", type=float, metavar="SECONDS",
                   help="the capture writes a heartbeat this often, so an idle slot's position "
                   "keeps moving (default off)")  # fmt: skip
    p.add_argument("--metrics", metavar="[HOST:]PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics: the capture's and "
                   "sync's (applied position, lag, cycles; host 127.0.0.1 unless given; default "
                   "off; needs prometheus-client)")  # fmt: skip
    p.add_argument("--failover", action="store_true",
                   help="make the slot a failover slot (PostgreSQL 17+)")  # fmt: skip
    p.add_argument("--retain", type=float, default=24.0, metavar="HOURS",
                   help="delete the data files versions older than this no longer use (Delta "
                   "vacuum: hourly, or every quarter of a shorter retention; fractions of an "
                   "hour from 0.1; 0: never; default 24): time travel reaches back this far")  # fmt: skip
    p.add_argument("--keep-segments", action="store_true",
                   help="keep the capture's segments once applied (default: deleted every minute, "
                   "as pgcdc prune does)")  # fmt: skip
    p.add_argument("--stop-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on Ctrl-C/SIGTERM, let the running apply finish this long before it is "
                   "cancelled (its tables then stay at their last commit; default 30)")  # fmt: skip
    p.add_argument("--on-invalid-slot", choices=("fail", "resync"), default="fail",
                   help="when the slot was invalidated (wal_status lost) or dropped: fail (exit "
                   "2, the default), or resync: create it again, take a new snapshot and swap "
                   "it into each table in one Delta commit, then go on (--scd 1 only)")  # fmt: skip
    p.add_argument("--engine", choices=("streaming", "loop"), default="streaming",
                   help="streaming: a Spark Structured Streaming query over the capture, a "
                   "cycle per micro-batch, its checkpoint in DIR/_checkpoint (default); loop: "
                   "the driver's own cycles, no query (ready without waiting for the JVM, a "
                   "third of the idle CPU)")  # fmt: skip
    p.add_argument("--once", action="store_true",
                   help="stop (exit 0) once the tables hold every change the server had written "
                   "when sync started: the snapshot if there is none, then the capture applied "
                   "up to that point by the driver's cycles (--engine loop); the slot and DIR "
                   "are kept, and the next pgcdc sync goes on from there")  # fmt: skip
    p.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                   help="stderr log: text on a TTY, JSON lines otherwise (default auto)")  # fmt: skip
    p.add_argument("--no-fsync", action="store_true", help=argparse.SUPPRESS)  # tests only
    return p


def config_from(args: argparse.Namespace) -> SyncConfig:
    names = {f.name for f in dataclasses.fields(SyncConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    return SyncConfig(fsync=not args.no_fsync, **given)


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from(args)
    try:
        config.check()
    except SetupError as e:
        return usage_error(PROG, str(e))
    # a missing extra is said first, with its pip command; pyspark is imported where it is
    # used: a rerun's capture process is started first (pyspark: when Spark starts)
    require("pyspark")

    # its messages say it all; DIR/_sync.log gets the errors whole (no traceback on stderr)
    log = SyncLog(args.log_format, config.out, prog=PROG)
    log.catch_the_rest()
    sync = Sync(config, log)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    code = BAD_DATA
    try:
        sync.run()
        code = OK
    except Exception as e:
        if e is not sync.said:
            _say(e, log, config.dsn)
        code = exit_code(e, USAGE if _is_server(e) else BAD_DATA)
    finally:
        try:
            sync.close()
        except Exception as e:  # noqa: BLE001 - said, the exit status stands
            log.unexpected(e, "while stopping")
        for s, h in old.items():
            signal.signal(s, h)
    return code


def _is_server(e: Exception) -> bool:
    return isinstance(e, (SnapshotError, CaptureError, psycopg.Error))


def _say(e: Exception, log, dsn: str) -> None:
    """One line for an error sync has not said: what the server refused (its DSN masked),
    what set-up refused, or an error it has no answer for (its traceback in the log file)."""
    if _is_server(e):
        log.event("error", "server", f"{str(e).strip()} ({mask_dsn(dsn)})")
    elif isinstance(e, SetupError):
        log.event("error", "setup", str(e))
    else:
        log.unexpected(e)


if __name__ == "__main__":
    sys.exit(main())
