"""``pgcdc apply``: apply the change events of captures to Delta Lake tables with Spark.

``pgcdc apply CAPTURE... --out DIR [--scd 1|2] [--table PATTERN] [--snapshot DIR]`` writes
the current state (SCD1) or history (SCD2) of each table as a Delta Lake table at
``DIR/<schema>.<table>/`` (``DIR`` a local path or ``s3://bucket/prefix``; see
:mod:`pgcdc.apply` and :mod:`pgcdc.apply.delta`). ``--format parquet`` (the layout of version
directories and links) was removed: it fails with a one-line error. Runs are incremental and
atomic per table: run it again over new captures.
``--master`` picks the Spark master (default: local with every core); on any other master
pgcdc and the codecs are zipped and shipped to the executors (:mod:`pgcdc.spark.ship`), so the
workers' Python needs only pyspark, pyarrow and psycopg. ``PYSPARK_PYTHON`` names the
executors' interpreter (default: this one).
"""

from __future__ import annotations

import argparse
import sys

from pgcdc.apply.delta import DeltaError, redact
from pgcdc.apply.run import apply_changes
from pgcdc.apply.state import ApplyError, SourceMismatch, applied_lsn
from pgcdc.capture.files import Captures, ReadError
from pgcdc.capture.segments import CaptureDirError
from pgcdc.cli._common import BAD_DATA, INTERRUPTED, OK, USAGE, Parser, command, error, note
from pgcdc.cli._spark import interruptible, progress
from pgcdc.spark.session import apply_session, stop_quietly
from pgcdc.spark.table_batches import ERRORS_KEPT

PROG = "pgcdc apply"


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="pgcdc apply",
        description="Apply the change events of capture files or directories (of one slot, "
        "in order) to Delta Lake tables under --out (a directory or s3://bucket/prefix), "
        "with Spark.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture file or directory")
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where the tables go: a directory, or s3://bucket/prefix (credentials and "
        "AWS_ENDPOINT_URL from the standard AWS environment variables)",
    )
    p.add_argument(
        "--format",
        choices=("delta", "parquet"),
        default="delta",
        help="delta: a Delta Lake table per table (the one layout; parquet, the layout of "
        "version directories and links, was removed)",
    )
    p.add_argument(
        "--scd", type=int, choices=(1, 2), default=1, help="1: current state (default), 2: history"
    )
    p.add_argument(
        "--table",
        action="append",
        metavar="PATTERN",
        help="only tables matching PATTERN (shell glob on schema.table or table; repeatable)",
    )
    p.add_argument("--snapshot", metavar="DIR", help="initial snapshot (Parquet per table)")
    p.add_argument("--master", default="local[*]", help="Spark master URL (default %(default)s)")
    p.add_argument(
        "--lenient",
        action="store_true",
        help="keep a value that does not load (a type no catalog describes) raw: null in its "
        "column, its text or \\x hex in _pg_text, counted in the run's summary; without it, "
        "such a value stops the run with its LSN, column and type",
    )
    p.add_argument(
        "--split-records",
        type=int,
        metavar="N",
        help="records per Spark task at most (default: 1000000; a capture file is split into "
        "units of about records / cores when that is fewer)",
    )
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.format == "parquet":
        return error(PROG, "--format parquet: the parquet layout was removed; pgcdc apply "
                     "writes Delta Lake tables (--format delta, the default)", USAGE)  # fmt: skip
    import pyspark  # noqa: F401  (a missing extra is said first, with its pip command)

    try:  # before Spark starts: input that may not be read is refused at once
        found = Captures.open(args.captures)
    except (CaptureDirError, ReadError) as e:
        return error(PROG, str(e))
    if not found.files:
        return error(PROG, f"no capture records in {' '.join(args.captures)} (a capture "
                     "directory holds the NNNNNNNN-<lsn>.pgcap segments pgcdc capture writes)")  # fmt: skip
    for text in found.notes:
        note(PROG, text)

    spark = apply_session(args.master)
    interrupt = None
    try:
        with interruptible(spark) as interrupt, progress(spark, PROG):
            report = apply_changes(spark, args.captures, args.out, scd=args.scd,
                                   tables=args.table, snapshot=args.snapshot,
                                   lenient=args.lenient,
                                   split_records=args.split_records)  # fmt: skip
    except BaseException as e:
        stop_quietly(spark)
        if interrupt is not None and interrupt.hit:
            print(f"{PROG}: interrupted; the state is unchanged (the last completed run "
                  "stands)", file=sys.stderr)  # fmt: skip
            return INTERRUPTED
        if isinstance(e, (CaptureDirError, ReadError, SourceMismatch)):  # nothing applied
            return error(PROG, str(e), USAGE)
        if isinstance(e, DeltaError):
            return error(PROG, str(e), BAD_DATA)
        if isinstance(e, (ApplyError, ValueError, OSError)):
            return error(PROG, redact(str(e)), BAD_DATA)
        raise
    stop_quietly(spark)
    for table, rows in sorted(report.items()):
        print(f"{table}: {rows} rows")
    for table, errors in sorted(report.errors.items()):
        more = "at least " if len(errors) >= ERRORS_KEPT else ""
        note(PROG, f"{table}: {more}{len(errors):,} value(s) did not load and are kept raw in "
                   f"_pg_text (--lenient); the first, at LSN {errors[0][0]}: {errors[0][1]}")  # fmt: skip
    lsn = applied_lsn(args.out)
    state = f"commit LSN {lsn}" if lsn else "no applied position"
    if report:
        print(f"{PROG}: {len(report)} table(s) written, {sum(report.values()):,} rows in their "
              f"new versions; applied up to {state}", file=sys.stderr)  # fmt: skip
    else:
        print(f"{PROG}: nothing new to apply; the state is at {state}", file=sys.stderr)
    return OK
