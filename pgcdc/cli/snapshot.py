"""``pgcdc snapshot``: create a slot, write its tables' initial snapshot as Parquet (Spark
tasks reading at the slot's exported snapshot), then optionally capture the slot from its
consistent point.

::

    pgcdc snapshot --dsn "host=db dbname=app user=cdc" --slot cdc --publication app_pub \\
        --out snapshot/ --capture-dir capture/

Snapshot + the captured changes = the tables (``pgcdc apply capture/ --snapshot snapshot/``).
With ``--capture-dir`` the command goes on as ``pgcdc capture --slot NAME --out CAPDIR``
(same DSN and publication) once the snapshot is written, until SIGINT/SIGTERM or
``--capture-idle-exit``. Without it, start ``pgcdc capture`` yourself: the slot keeps every
change from the consistent point meanwhile. Exit 0 on success, 2 on a bad option or a server
error (one line saying what and how to fix it).
"""

from __future__ import annotations

import argparse
import json
import sys

from pgcdc.spark.session import stop_quietly
from pgcdc.capture.runner import CaptureConfig
from pgcdc.capture.walsender import CaptureError, mask_dsn
from pgcdc.cli import capture
from pgcdc.cli._common import INTERRUPTED, Parser, command, error, usage_error
from pgcdc.cli._spark import interruptible
from pgcdc.runtime.spark import local_spark_session
from pgcdc.snapshot.server import SnapshotError

PROG = "pgcdc snapshot"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Create a logical replication slot with an exported snapshot and write "
        "the published tables at that snapshot as Parquet under OUT/<schema>.<table>/ (other "
        "characters than letters, digits, _ and - as ~XX), read by Spark tasks; then optionally capture the slot from its consistent point.",
    )
    p.add_argument("--dsn", default="", help="libpq connection string or URI (default: PG* env)")
    p.add_argument("--slot", required=True, help="slot to create (must not exist)")
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--out", required=True, help="snapshot directory (Parquet per table)")
    p.add_argument("--capture-dir", metavar="CAPDIR", help="then run pgcdc capture into CAPDIR")
    p.add_argument("--capture-idle-exit", type=float, metavar="SECONDS",
                   help="with --capture-dir: stop the capture after idle SECONDS")  # fmt: skip
    p.add_argument("--two-phase", action="store_true", help="create the slot with two-phase")
    p.add_argument("--range-mb", type=int, metavar="MB",
                   help="table bytes (heap and TOAST) per Spark task (default 128)")  # fmt: skip
    p.add_argument("--blocks-per-range", type=int, metavar="N",
                   help="heap blocks per Spark task instead of --range-mb")  # fmt: skip
    p.add_argument("--cores", type=int, default=2, help="local Spark cores (default 2)")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pubs = [x.strip() for x in args.publication.split(",") if x.strip()]
    if not pubs:
        return usage_error(PROG, "--publication needs at least one name")
    if args.blocks_per_range is not None and args.blocks_per_range < 1:
        return usage_error(PROG, "--blocks-per-range must be at least 1")
    if args.range_mb is not None and args.range_mb < 1:
        return usage_error(PROG, "--range-mb must be at least 1")
    from pgcdc.snapshot.job import take_snapshot  # lazy: pyspark

    spark = local_spark_session("pgcdc snapshot", cores=args.cores)
    interrupt = None
    try:
        # take_snapshot shows its own progress on a TTY: rows, bytes, rate, ETA per table
        with interruptible(spark) as interrupt:
            result = take_snapshot(
                spark,
                args.dsn,
                args.slot,
                pubs,
                args.out,
                blocks_per_range=args.blocks_per_range,
                range_bytes=None if args.range_mb is None else args.range_mb << 20,
                two_phase=args.two_phase,
            )
    except BaseException as e:
        stop_quietly(spark)
        if interrupt is not None and interrupt.hit:
            print(f"{PROG}: interrupted; no snapshot was marked complete in {args.out} (the "
                  "slot it created stays: drop it, or use another --slot)",
                  file=sys.stderr)  # fmt: skip
            return INTERRUPTED
        if isinstance(e, (SnapshotError, CaptureError)):
            return error(PROG, f"{e} ({mask_dsn(args.dsn)})")
        raise
    stop_quietly(spark)
    summary = dict(result.manifest(), rows=result.rows, ranges=result.ranges)
    print(json.dumps(summary, sort_keys=True), flush=True)
    tables = summary.get("tables") or {}
    print(f"{PROG}: {len(tables)} table(s), {result.rows:,} rows at the slot's snapshot, in "
          f"{args.out}", file=sys.stderr)  # fmt: skip
    if not args.capture_dir:
        return 0

    config = CaptureConfig(dsn=args.dsn, slot=args.slot, publications=pubs,
                           out=args.capture_dir, two_phase=args.two_phase,
                           idle_exit=args.capture_idle_exit)  # fmt: skip
    return capture.run(config)


if __name__ == "__main__":
    sys.exit(main())
