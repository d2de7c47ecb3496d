"""The interpreter a local session gives Spark's Python processes (pgcdc.runtime.spark.pyworker):
the path it runs a module with, and, in a real session, where each kind of process (a task's
worker, a streaming query's offsets) finds pyspark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.runtime.spark.pyworker import SCRIPT, reordered, worker_python


def _package(root: Path) -> tuple[str, str, str]:
    """A site-packages with a pyspark whose python/lib holds Spark's two zips."""
    lib = root / "site" / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (root / "site" / "pyspark" / "__init__.py").write_text("")
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / name).write_bytes(b"")
    return str(root / "site"), str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_the_zips_of_the_installed_pyspark_go_after_it(tmp_path):
    site, zip_, py4j = _package(tmp_path)
    other = str(tmp_path / "mine")
    assert reordered(["", zip_, py4j, other, site]) == ["", other, site, zip_, py4j]


def test_the_zips_of_another_spark_install_stay_first(tmp_path):
    site, _, _ = _package(tmp_path)
    elsewhere = tmp_path / "opt" / "spark" / "python" / "lib"
    elsewhere.mkdir(parents=True)
    path = [str(elsewhere / "pyspark.zip"), str(elsewhere / "py4j-0.10.9.9-src.zip"), site]
    assert reordered(path) == path


def test_without_an_installed_pyspark_the_path_is_unchanged(tmp_path):
    zip_ = str(tmp_path / "pyspark.zip")
    path = [zip_, str(tmp_path / "empty")]
    assert reordered(path) == path


def test_the_launcher_runs_a_module_as_python_does(tmp_path):
    script = worker_python()
    if not script.endswith(SCRIPT):
        pytest.skip(f"{SCRIPT} is not installed beside {sys.executable}")
    (tmp_path / "here_mod.py").write_text(
        "import sys\nprint(__name__, sys.argv[1:], sys.path[0])\nsys.exit(3)\n"
    )
    run = subprocess.run([script, "-m", "here_mod", "a", "b"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    # found in the working directory, as `python -m` finds it; its arguments and exit code
    assert run.returncode == 3, run.stderr
    assert run.stdout.split() == ["__main__", "['a',", "'b']", str(tmp_path)]
    version = subprocess.run([script, "-c", "import sys; print(sys.version_info[0])"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert version.stdout.strip() == "3"


def test_a_local_sessions_python_processes_use_the_installed_pyspark(spark):  # noqa: F811
    """A task's worker and a streaming query's offsets process (started for every query, by the
    session's fork server) both import pyspark from the installed package, not from Spark's
    zip."""
    import pyarrow as pa
    import pyspark

    installed = os.path.dirname(os.path.realpath(pyspark.__file__))
    if ".zip" in installed or not worker_python().endswith(SCRIPT):
        pytest.skip("pyspark is not installed as a package here")

    def where(batches):
        import pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__]})

    def compiled(file: str) -> bool:  # the installed package's, not its zip's (inside it)
        return os.path.realpath(file).startswith(installed + os.sep) and ".zip" not in file

    task = spark.range(1).mapInArrow(where, "file string").collect()[0].file
    assert compiled(task), task

    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class WhereReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"file": ""}

        def latestOffset(self):  # in the query's offsets process
            import os

            import pyspark

            return {"file": f"{pyspark.__file__}|{os.getppid()}"}

        def partitions(self, start, end):
            return [InputPartition(end["file"])] if end["file"] != start["file"] else []

        def read(self, partition):
            yield (partition.value,)

    class Where(DataSource):
        @classmethod
        def name(cls):
            return "pgcdc_test_where"

        def schema(self):
            return "file string"

        def streamReader(self, schema):
            return WhereReader()

    spark.dataSource.register(Where)
    query = (
        spark.readStream.format("pgcdc_test_where").load().writeStream.format("memory")
        .queryName("pgcdc_test_where").trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(120)
    offsets, parent = spark.table("pgcdc_test_where").collect()[0].file.split("|")
    assert compiled(offsets), offsets
    # started by the session's fork server, not from nothing (pgcdc.runtime.spark.forkserver)
    from pgcdc.runtime.spark import forkserver

    assert forkserver._started, "the session started no fork server"
    assert int(parent) == forkserver._started["proc"].pid
