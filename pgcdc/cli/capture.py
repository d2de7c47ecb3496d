"""``pgcdc capture``: read a replication slot into a capture directory, durably, resumably.

    pgcdc capture --dsn DSN --slot NAME --publication PUB[,PUB] --out DIR [options]

Exit status: 0 when stopped (SIGINT/SIGTERM, --until-lsn, --idle-exit) with everything received
up to the last transaction boundary durable; 2 for bad options and errors that retrying cannot
fix (one line on stderr, naming the fix). Dropped connections and server restarts are retried
with backoff, resuming from the durable position.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys

from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.cli._common import Parser, command, usage_error

PROG = "pgcdc capture"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--dsn", default="", help="libpq connection string or URI (default: PG* env)")
    p.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--out", required=True, help="capture directory (created if missing)")
    p.add_argument("--create-slot", action="store_true", help="create the slot if it is missing")
    p.add_argument("--temporary", action="store_true", help="with --create-slot: temporary slot")
    p.add_argument("--two-phase", action="store_true", help="decode prepared transactions")
    p.add_argument("--protocol-version", type=int, help="pgoutput protocol (default: highest)")
    p.add_argument("--binary", action="store_true", help="binary column values")
    p.add_argument("--streaming", default="off", choices=("off", "on", "parallel"),
                   help="stream large transactions before they commit (protocol 2+; parallel: "
                   "protocol 4) (default off)")  # fmt: skip
    p.add_argument("--messages", action="store_true", help="include logical decoding messages")
    p.add_argument("--origin", choices=("any", "none"), help="origin filter (PostgreSQL 16+)")
    p.add_argument("--start-lsn", type=_lsn, help="start here when the directory is new")
    p.add_argument("--until-lsn", type=_lsn, help="stop at the first boundary at or past this")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS", help="stop after idle SECONDS")
    p.add_argument("--connect-attempts", type=int, default=3, metavar="N",
                   help="give up after N failed attempts at the first connection (default 3); "
                   "once connected, dropped connections are retried forever")  # fmt: skip
    p.add_argument("--status-interval", type=float, default=10.0, metavar="SECONDS",
                   help="send the server a status update at least this often")  # fmt: skip
    p.add_argument("--flush-interval", type=float, default=1.0, metavar="SECONDS",
                   help="make data durable (fsync) and acknowledge it this often")  # fmt: skip
    p.add_argument("--segment-bytes", type=int, default=64 << 20, metavar="BYTES",
                   help="start a new segment file past this size (default 64 MiB)")  # fmt: skip
    p.add_argument("--segment-seconds", type=float, default=600.0, metavar="SECONDS",
                   help="start a new segment file after this long (default 600)")  # fmt: skip
    p.add_argument("--catch-up-bytes", type=int, default=128 << 20, metavar="BYTES",
                   help="read a backlog of up to this much WAL with one peek before streaming "
                   "(faster than the walsender's message-by-message sends; default 128 MiB, "
                   "0: off)")  # fmt: skip
    p.add_argument("--sql", action="store_true", help="SQL-interface mode (no replication conn)")
    p.add_argument("--batch-size", type=int, default=10_000, help="--sql: changes per peek")
    p.add_argument("--retained-wal-warning", type=int, default=1 << 30, metavar="BYTES",
                   help="warn when the slot holds back more WAL than this")  # fmt: skip
    p.add_argument("--heartbeat", type=float, metavar="SECONDS",
                   help="write a heartbeat (pg_logical_emit_message, prefix pgcdc.heartbeat) this "
                   "often, so an idle slot's position keeps moving (default off)")  # fmt: skip
    p.add_argument("--metrics", metavar="[HOST:]PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (host 127.0.0.1 "
                   "unless given; default off; needs prometheus-client)")  # fmt: skip
    p.add_argument("--failover", action="store_true",
                   help="a failover slot, synchronized to standbys (PostgreSQL 17+): created so, "
                   "or turned on for an existing slot")  # fmt: skip
    p.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                   help="stderr log: text with a progress line on a TTY, JSON lines otherwise "
                   "(default auto)")  # fmt: skip
    p.add_argument("--no-fsync", action="store_true", help=argparse.SUPPRESS)  # tests only
    return p


def _lsn(text: str) -> int:
    try:
        return parse_lsn(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def config_from(args: argparse.Namespace) -> CaptureConfig:
    names = {f.name for f in dataclasses.fields(CaptureConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    return CaptureConfig(publications=args.publication, fsync=not args.no_fsync, **given)


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from(args)
    try:
        config.check()
    except ValueError as e:
        return usage_error(PROG, str(e))
    return run(config, args.log_format)


def run(config: CaptureConfig, log_format: str = "auto") -> int:
    """Capture until SIGINT/SIGTERM (or the config's stop conditions) and say what was
    captured; the exit code."""
    log = Log(log_format, prog=PROG)
    cap = Capture(config, log)

    def _stop(signum, frame):
        cap.stop = True

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = cap.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        log.end_progress()
    if code == 0:
        durable = cap.writer.state.lsn if cap.writer.state is not None else None
        log.event("info", "stopped", cap.summary(), messages=cap.messages, bytes=cap.bytes,
                  durable_lsn=None if durable is None else format_lsn(durable))  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
