"""Build the driver JVM's class-data-sharing archive of :mod:`.cds`:
``python -m pgcdc.runtime.spark.build_cds`` builds it when there is none and prints its path,
``--rebuild`` builds it again.

A session of pgcdc's runs, in a child process, the kinds of work its sessions do (SQL and its
generated code, Parquet, Arrow to and from Python, a Python streaming source into a file sink
and into ``foreachBatch``), and its JVM writes the classes it loaded as it exits
(``-XX:ArchiveClassesAtExit``), under a temporary name; a JVM that maps it checks it, and
only then is it renamed into place, its size written beside it (:func:`.cds.whole`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pgcdc.runtime.spark import cds
from pgcdc.runtime.spark.local_session import driver_jvm_options, local_spark_session

__all__ = ["build", "ensure"]

# what build() runs in a child process: _dump into the path given
_CHILD = (
    "import sys; from pathlib import Path; from pgcdc.runtime.spark.build_cds import _dump; "
    "sys.exit(_dump(Path(sys.argv[1])))"
)


def ensure() -> Path | None:
    """The archive, built first when there is none; None when it is off or cannot be."""
    path = cds.archive_path()
    if path is None:
        return None
    return path if cds.whole(path) else build(path)


def build(path: Path | None = None) -> Path:
    """Build the archive: a session of pgcdc's runs the kinds of work its sessions do in a
    child process whose JVM writes the classes it loaded when it exits (15-40 s)."""
    path = path or cds.archive_path()
    if path is None:
        raise RuntimeError(f"no archive to build: {cds.ENV}=off, or no java or pyspark")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        env = {**os.environ, cds.ENV: "off"}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(tmp)],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not tmp.exists():
            raise RuntimeError(f"the archive was not written: {done.stderr.strip()[-2000:]}")
        # a JVM that maps it: an archive that cannot be used fails here, not in a session
        check = subprocess.run(
            [str(cds.java()), f"-XX:SharedArchiveFile={tmp}", "-version"], capture_output=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"the archive written cannot be mapped: {check.returncode}")
        path.with_suffix(".json").write_text(json.dumps({"size": tmp.stat().st_size}))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _prune(path.parent)
    return path


KEEP = 3  # archives kept in the cache (other Java runtimes or Spark installs), newest first


def _prune(folder: Path) -> None:
    """The archives of the cache but the KEEP newest (each is about 160-200 MB)."""
    found = sorted(folder.glob("spark-*.jsa"), key=lambda f: f.stat().st_mtime, reverse=True)
    for old in found[KEEP:]:
        old.with_suffix(".json").unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def _dump(tmp: Path) -> int:
    """In the child: the work whose classes go into the archive, then the JVM's exit."""
    from pyspark import SparkContext

    options = f"{driver_jvm_options()} -XX:ArchiveClassesAtExit={tmp} {cds.QUIET}"
    spark = local_spark_session("pgcdc cds", cores=2, spark__driver__extraJavaOptions=options)
    with tempfile.TemporaryDirectory(prefix="pgcdc-cds-") as work:
        _workload(spark, Path(work))
        spark.stop()
    gateway = SparkContext._gateway
    # the JVM exits when its standard input ends, and writes the archive as it does
    gateway.proc.stdin.close()
    code = gateway.proc.wait(timeout=600)
    return 0 if code == 0 and tmp.exists() else 1


def _workload(spark, work: Path) -> None:
    """SQL and its generated code, Parquet written and read, Arrow to and from Python, and
    a Python streaming source into a file sink and into foreachBatch, as the source, apply
    and sync run them."""
    from pgcdc.runtime.spark.cds_workload import TinySource  # lazy: pyspark

    df = spark.range(20_000).selectExpr(
        "id", "id % 7 AS k", "CAST(id AS STRING) AS s", "CAST(id AS DECIMAL(12,2)) AS n",
        "TIMESTAMP_MICROS(id) AS ts",
    )  # fmt: skip
    df.groupBy("k").count().collect()
    df.write.parquet(str(work / "p"))
    spark.read.parquet(str(work / "p")).where("k = 3").count()
    df.mapInArrow(lambda batches: batches, df.schema).count()
    df.toPandas()
    spark.dataSource.register(TinySource)
    rows = spark.readStream.format(TinySource.name()).load()
    query = (
        rows.writeStream.format("parquet")
        .option("checkpointLocation", str(work / "chk"))
        .trigger(availableNow=True)
        .start(str(work / "out"))
    )
    query.awaitTermination()
    query = (
        rows.writeStream.foreachBatch(lambda batch, _id: batch.count())
        .option("checkpointLocation", str(work / "chk2"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


USAGE = """usage: python -m pgcdc.runtime.spark.build_cds [--rebuild]

Build the driver JVM's class-data-sharing archive when there is none (every pgcdc session
then starts from it) and print its path; --rebuild builds it again."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args not in ([], ["--rebuild"]):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        path = build() if args else ensure()
    except RuntimeError as e:
        print(f"pgcdc cds: {e}", file=sys.stderr)
        return 1
    if path is None:
        print(f"pgcdc cds: off ({cds.ENV}=off, or no java or pyspark)", file=sys.stderr)
        return 0
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
