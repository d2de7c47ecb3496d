"""The driver JVM's class-data-sharing archive (pgcdc.runtime.spark.cds, build_cds): built,
used only whole, and mapped by a session's JVM, as the kernel's memory maps of that JVM
show; a JVM whose classpath differs from the archive's starts without it, quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.runtime.spark import build_cds, cds
from pgcdc.runtime.spark.local_session import session_conf

# A session in a new process (a JVM of its own): its JVM's pid, and whether its memory maps
# hold the archive that session_conf names
SESSION = """
import sys
from pgcdc.runtime.spark.local_session import local_spark_session
extra = dict(arg.split("=", 1) for arg in sys.argv[1:])
spark = local_spark_session("cds-test", **extra)
assert spark.range(100).selectExpr("sum(id)").collect()[0][0] == 4950
pid = spark._jvm.java.lang.ProcessHandle.current().pid()
maps = open(f"/proc/{pid}/maps").read()
print("MAPPED" if ".jsa" in maps and "spark-" in maps else "NOT MAPPED", flush=True)
spark.stop()
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PGCDC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(cds.ENV, raising=False)
    return tmp_path


def _session(cache: Path, *conf: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGCDC_CACHE_DIR": str(cache)}
    env.pop(cds.ENV, None)
    return subprocess.run(
        [sys.executable, "-c", SESSION, *conf],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_no_archive_no_option(cache):
    assert cds.java_options() == ""
    assert "SharedArchiveFile" not in session_conf()["spark.driver.extraJavaOptions"]


def test_off_means_no_archive(cache, monkeypatch):
    monkeypatch.setenv(cds.ENV, "off")
    assert cds.archive_path() is None
    assert cds.java_options() == ""
    assert build_cds.ensure() is None


def test_an_archive_is_used_only_whole(cache):
    path = cds.archive_path()
    path.write_bytes(b"x" * 1000)
    assert cds.java_options() == ""  # no size written beside it: not known to be whole
    path.with_suffix(".json").write_text(json.dumps({"size": 4096}))
    assert cds.java_options() == ""  # cut short
    path.with_suffix(".json").write_text(json.dumps({"size": 1000}))
    assert cds.java_options().startswith(f"-XX:SharedArchiveFile={path} ")


@pytest.fixture
def built(monkeypatch):
    """The user's cache, where ``make test`` has built the archive (``make spark-cds``, about
    40 s; built here when it has not): a build of its own would cost this suite that again."""
    monkeypatch.delenv(cds.ENV, raising=False)
    path = build_cds.ensure()
    assert path is not None and path.parent == cds.cache_dir()
    return path.parent


def test_a_built_archive_is_mapped_and_another_classpath_starts_without_it(built, tmp_path):
    cache = built
    path = build_cds.ensure()
    assert path is not None and path.stat().st_size > 10 << 20
    assert cds.whole(path)  # its size written beside it once it was checked
    assert build_cds.ensure() == path  # there already: not built again
    # a session of pgcdc's maps it
    used = _session(cache)
    assert used.returncode == 0, used.stderr[-3000:]
    assert used.stdout.strip().splitlines()[-1] == "MAPPED"
    assert "cds" not in used.stdout + used.stderr.replace("pgcdc-cds", "")
    # a classpath of its own (the user's jars, say): the JVM cannot use it and says nothing
    other = tmp_path / "classes"
    other.mkdir()
    mine = _session(cache, f"spark.driver.extraClassPath={other}")
    assert mine.returncode == 0, mine.stderr[-3000:]
    assert mine.stdout.strip().splitlines()[-1] == "NOT MAPPED"
    assert "shared archive" not in (mine.stdout + mine.stderr).lower()
