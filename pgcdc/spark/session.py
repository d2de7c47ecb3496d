"""The SparkSession ``pgcdc apply`` and ``pgcdc sync`` run on, the settings apply needs on any
session, and a quiet stop. The session's configuration itself (quiet, loopback, UTC, Arrow,
the driver JVM's options) is :mod:`pgcdc.runtime.spark.local_session`'s, shared with the local
sessions of ``pgcdc snapshot`` and the tests.

Importing this module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import os
import sys

from pgcdc.runtime.spark.pyworker import worker_python
from pgcdc.runtime.spark.quiet import quiet_jvm_start
from pgcdc.runtime.spark.local_session import session_conf, start_forkserver

__all__ = ["apply_session", "quiet_spark", "stop_quietly"]


def apply_session(master: str = "local[*]", app_name: str = "pgcdc-apply", jvm_log=None):
    """The SparkSession ``pgcdc apply --master`` and ``pgcdc sync`` run on: what every session
    of pgcdc's sets (:func:`pgcdc.runtime.spark.local_session.session_conf`: quiet, UTC, INT64
    timestamps, Arrow, the driver JVM's options), with adaptive execution. On a master other
    than local, :func:`pgcdc.apply.run.apply_changes` ships pgcdc and the codecs to the
    executors; ``PYSPARK_PYTHON`` names their interpreter (default: this one; on a local
    master its ``pgcdc-spark-python``, :mod:`pgcdc.runtime.spark.pyworker`). ``jvm_log``:
    where the JVM's stderr (its log) goes, a callable given its bytes (default: this
    process's stderr)."""
    # Spark's JVM prints start-up notes on stderr before any log level can be set; these
    # options keep a normal run silent (the log level is set again once the session exists)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local = master.startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", worker_python() if local else sys.executable)
    from pyspark.sql import SparkSession  # lazy: pyspark

    if local:
        start_forkserver()
    conf = {
        **session_conf(),
        "spark.sql.shuffle.partitions": str(max(2, 2 * (os.cpu_count() or 1))),
        "spark.sql.adaptive.enabled": "true",
    }
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with quiet_jvm_start(jvm_log):
        return builder.getOrCreate()


def quiet_spark(spark) -> None:
    """Settings apply needs on any session: INT64 microsecond timestamps in Parquet, no
    _SUCCESS files, UTC, column names that differ in case told apart
    (:mod:`pgcdc.spark.names`), and only errors in the log."""
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.caseSensitive", "true")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    hconf.set("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
    hconf.set("parquet.enable.summary-metadata", "false")


def stop_quietly(spark) -> None:
    """Stop a session without the JVM's log of its shutdown (a run that ended, or failed)."""
    try:
        spark.sparkContext.setLogLevel("OFF")
        spark.stop()
    except Exception:
        pass
