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
    from .capture.segments import CaptureDirError
    from .sources import SourceError
    from .spark.apply import ApplyError, apply_changes

    spark = _session(args.master)
    try:
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
    except (CaptureDirError, SourceError) as e:  # input that may not be read: nothing applied
        print(f"pgcdc apply: error: {e}", file=sys.stderr)
        return 2
    except (ApplyError, ValueError, OSError) as e:
        print(f"pgcdc apply: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    for table, rows in sorted(report.items()):
        print(f"{table}: {rows} rows")
    return 0
