"""``pgcdc apply``: apply the change events of captures to Parquet table state with Spark.

``pgcdc apply CAPTURE... --out DIR [--scd 1|2] [--table PATTERN] [--snapshot DIR]`` writes
the current state (SCD1) or history (SCD2) of each table to ``DIR/<schema>.<table>/`` (see
:mod:`pgcdc.spark.apply`). Runs are incremental and atomic: run it again over new captures.
``--master`` picks the Spark master (default: local with every core); on any other master
pgcdc and the codecs are zipped and shipped to the executors (:mod:`pgcdc.spark.ship`), so the
workers' Python needs only pyspark, pyarrow and psycopg. ``PYSPARK_PYTHON`` names the
executors' interpreter (default: this one).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pgcdc apply",
        description="Apply the change events of capture files or directories (of one slot, "
        "in order) to Parquet table state under --out, with Spark.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture file or directory")
    p.add_argument("--out", required=True, metavar="DIR", help="state directory")
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
    p.add_argument("--lenient", action="store_true", help="keep values that do not load as text")
    p.add_argument(
        "--split-records",
        type=int,
        metavar="N",
        help="records per Spark task at most (default: 1000000; a capture file is split into "
        "units of about records / cores when that is fewer)",
    )
    return p


def _session(master: str):
    # Spark's JVM prints start-up notes on stderr before any log level can be set; these
    # options keep a normal run silent (the log level is set again once the session exists)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # executors run this interpreter unless told otherwise (on a cluster: PYSPARK_PYTHON)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .runtime.spark_quiet import driver_java_options, quiet_jvm_start

    quiet = driver_java_options()
    builder = (
        SparkSession.builder.appName("pgcdc-apply")
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.extraJavaOptions", quiet)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(max(2, 2 * (os.cpu_count() or 1))))
        .config("spark.sql.adaptive.enabled", "true")
    )
    with quiet_jvm_start():
        return builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import pyspark  # noqa: F401  (a missing extra is said first, with its pip command)

    from .capture.segments import CaptureDirError
    from .cli_spark import INTERRUPTED, interruptible, progress, stop_quietly
    from .sources import Captures, SourceError

    try:  # before Spark starts: input that may not be read is refused at once
        found = Captures.open(args.captures)
    except (CaptureDirError, SourceError) as e:
        print(f"pgcdc apply: error: {e}", file=sys.stderr)
        return 2
    if not found.files:
        print(f"pgcdc apply: error: no capture records in {' '.join(args.captures)} (a capture "
              "directory holds the NNNNNNNN-<lsn>.pgcap segments pgcdc capture writes)",
              file=sys.stderr)  # fmt: skip
        return 2
    for note in found.notes:
        print(f"pgcdc apply: note: {note}", file=sys.stderr)
    from .spark.apply import ApplyError, SourceMismatch, apply_changes

    spark = _session(args.master)
    interrupt = None
    try:
        with interruptible(spark) as interrupt, progress(spark, "pgcdc apply"):
            report = apply_changes(
                spark,
                args.captures,
                args.out,
                scd=args.scd,
                tables=args.table,
                snapshot=args.snapshot,
                lenient=args.lenient,
                split_records=args.split_records,
            )
    except BaseException as e:
        stop_quietly(spark)
        if interrupt is not None and interrupt.hit:
            print("pgcdc apply: interrupted; the state is unchanged (the last completed run "
                  "stands)", file=sys.stderr)  # fmt: skip
            return INTERRUPTED
        if isinstance(e, (CaptureDirError, SourceError, SourceMismatch)):  # nothing applied
            print(f"pgcdc apply: error: {e}", file=sys.stderr)
            return 2
        if isinstance(e, (ApplyError, ValueError, OSError)):
            print(f"pgcdc apply: {e}", file=sys.stderr)
            return 1
        raise
    stop_quietly(spark)
    for table, rows in sorted(report.items()):
        print(f"{table}: {rows} rows")
    state = _applied_lsn(args.out)
    if report:
        total = sum(report.values())
        print(f"pgcdc apply: {len(report)} table(s) written, {total:,} rows in their new "
              f"versions; applied up to {state}", file=sys.stderr)  # fmt: skip
    else:
        print(f"pgcdc apply: nothing new to apply; the state is at {state}", file=sys.stderr)
    return 0


def _applied_lsn(out) -> str:
    import json
    from pathlib import Path

    try:
        doc = json.loads((Path(out) / "_pgcdc_state.json").read_text())
    except (OSError, ValueError):
        return "no applied position"
    lsn = doc.get("applied_lsn")
    return f"commit LSN {lsn}" if lsn else "no applied position"
