"""Local SparkSessions for runs on one machine: quiet (see quiet), on loopback, in UTC, with
Arrow on.

Importing this module needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

import os
import sys

from pgcdc.runtime.spark import cds
from pgcdc.runtime.spark.pyworker import worker_python
from pgcdc.runtime.spark.quiet import driver_java_options, quiet_jvm_start

__all__ = [
    "driver_jvm_options",
    "local_spark_conf",
    "local_spark_session",
    "session_conf",
    "start_forkserver",
]


CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def driver_jvm_options(cpus: int | None = None) -> str:
    """The driver JVM's options: quiet logging, and on a machine of two cores or fewer
    (``cpus``, default this one's) the serial garbage collector. The JVM picks G1 there, whose
    concurrent threads compete for the cores that PostgreSQL's walsender and the Python
    workers use (docs/performance.md, "The driver's garbage collector"); a local driver's heap
    (Spark's default 1 GB) is small enough for the serial collector's pauses."""
    if cpus is None:
        cpus = os.cpu_count() or 1
    options = driver_java_options()
    return f"{options} -XX:+UseSerialGC" if cpus <= 2 else options


def session_conf() -> dict:
    """What every session of pgcdc's sets, on any master: no UI, UTC, INT64 timestamps,
    Arrow, column names that differ in case told apart, the driver JVM's options (with the class-data-sharing archive of :mod:`.cds`
    when there is one), and the checkpoint file manager below."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        # Parquet timestamps as INT64 microseconds (Spark's default is the deprecated INT96).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # PostgreSQL's "Id" and id are two columns, which Spark by default takes as one name
        # (an ambiguous reference in a table that has both): see pgcdc.spark.names
        "spark.sql.caseSensitive": "true",
        # with the class-data-sharing archive once built (python -m pgcdc.runtime.spark.build_cds)
        "spark.driver.extraJavaOptions": f"{driver_jvm_options()} {cds.java_options()}".rstrip(),
        # A streaming query's offset and commit logs through FileSystem rather than FileContext:
        # without Hadoop's native library, FileContext's rename starts a `readlink` process
        # for every path it checks, about 14 per micro-batch here. A batch of 1,000 rows into
        # Parquet took a median 272-282 ms instead of 324-390 (walCommit and commitOffsets
        # 11-15 ms instead of 32-36). A local rename is atomic either way.
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
    }


def local_spark_conf(cores: int = 2) -> dict:
    """Settings for quiet, reliable local runs on a small machine without network:
    :func:`session_conf` and a local master on loopback."""
    return {
        **session_conf(),
        "spark.master": f"local[{cores}]",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(max(2, cores)),
        "spark.default.parallelism": str(max(2, cores)),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.pyspark.python": worker_python(),
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.PYTHONHASHSEED": "0",
    }


def start_forkserver() -> None:
    """The fork server of :mod:`.forkserver`, when this process has no JVM yet (the JVM
    inherits the variable that names it) and its Python processes are ``pgcdc-spark-python``."""
    from pyspark import SparkContext

    if SparkContext._gateway is None and os.environ.get("PYSPARK_PYTHON") == worker_python():
        from pgcdc.runtime.spark import forkserver  # lazy: runpy (run by `python -m`)

        forkserver.start()


def local_spark_session(app_name: str = "pgcdc", cores: int = 2, **conf):
    """A local SparkSession with local_spark_conf(cores) (plus conf overrides, `__` standing
    for `.` in keys), logging at ERROR. Sets SPARK_LOCAL_IP=127.0.0.1 and PYSPARK_PYTHON to
    this interpreter (its ``pgcdc-spark-python``: :mod:`.pyworker`) unless already set."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    from pyspark.sql import SparkSession

    start_forkserver()

    builder = SparkSession.builder.appName(app_name)
    for key, value in {**local_spark_conf(cores), **conf}.items():
        builder = builder.config(key.replace("__", "."), value)
    with quiet_jvm_start():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
