"""apply_changes on a real Spark standalone cluster (a master and a worker from pyspark's own
distribution, on 127.0.0.1) whose executors' Python does not have pgcdc: the job ships it.

Proof that nothing is pre-installed: the executors run :func:`tests.support.cluster.bare_python`
(the venv's dependencies without the editable pgcdc); a task that imports pgcdc fails before
the run, and after it pgcdc and the codecs come from the shipped zip, with the compiled
accelerator loaded from it. The state the cluster writes equals the local-mode state of the
same capture (a real PostgreSQL 18 capture, split into units so carried state crosses tasks).

Also, without Spark: the zip alone is enough for the bare interpreter, with and without the
compiled accelerators (pure-Python fallback), and decodes the same events either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import bare_python, standalone_cluster

pq = pytest.importorskip("pyarrow.parquet")

from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.spark.ship import build_zip  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests/captures/pg18/proto4-binary-streaming_parallel-two_phase-sql.pgcap.gz"
SPLIT = 130  # about two units


def _state(out: Path) -> dict:
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    tables = {}
    for name in doc["tables"]:
        rows = pq.read_table(out / name).to_pylist()
        tables[name] = sorted(json.dumps(r, sort_keys=True, default=repr) for r in rows)
    return {"applied_lsn": doc["applied_lsn"], "tables": tables}


@pytest.fixture(scope="module")
def python(tmp_path_factory):
    return bare_python(tmp_path_factory.mktemp("executor-python"))


def test_cluster_apply_ships_pgcdc_and_equals_local(spark, python, tmp_path):  # noqa: F811
    local = tmp_path / "local"
    apply_changes(spark, [str(CAPTURE)], local, split_records=SPLIT)
    remote = tmp_path / "remote"
    with standalone_cluster(tmp_path / "cluster", python=python) as cluster:
        run = subprocess.run(
            [sys.executable, "-m", "tests.support.cluster", "run", cluster.master_url,
             str(remote), str(SPLIT), str(CAPTURE)],
            cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-5000:]
    doc = json.loads(run.stdout.strip().splitlines()[-1])
    before, after = doc["before"], doc["after"]
    assert before["python"] == str(python)
    assert before["error"] == "ModuleNotFoundError: No module named 'pgcdc'"
    for module in ("pgcdc", "pgoutput_codec"):
        path = after[module]
        assert ".zip/" in path and path.split(".zip/")[0].rsplit("/", 1)[-1].startswith(
            "pgcdc-executors-"
        ), path
        assert str(REPO) not in path
    assert after["accelerated"] == [True, True]
    assert _state(remote) == _state(local)
    assert doc["report"]


def _events_with(python: Path, zip_path: Path) -> dict:
    code = (
        "import json, sys; sys.path.insert(1, sys.argv[1])\n"
        "import pgcdc.spark.changes as ch, pgoutput_codec\n"
        "from pgcdc.events.reader import EventReader\n"
        "from pgcdc.capture.files import Captures, iter_all\n"
        "catalog = Captures.open([sys.argv[2]]).catalog\n"  # the capture's catalog.jsonl
        "evs = [(e.op, e.commit_lsn, e.tx_ordinal, repr(e.after)) "
        "for e in EventReader(catalog=catalog).read(iter_all([sys.argv[2]]))]\n"
        "print(json.dumps({'file': ch.__file__, 'accelerated': pgoutput_codec.use_speedups(True),"
        " 'events': evs}))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"}
    out = subprocess.run(
        [str(python), "-c", code, str(zip_path), str(CAPTURE)],
        cwd="/", env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_shipped_zip_alone_with_and_without_accelerator(python, tmp_path):
    native = _events_with(python, build_zip(tmp_path / "n", native=True))
    pure = _events_with(python, build_zip(tmp_path / "p", native=False))
    assert native["file"].startswith(str(tmp_path / "n")) and ".zip/" in native["file"]
    assert native["accelerated"] is True
    assert pure["accelerated"] is False
    assert native["events"] and native["events"] == pure["events"]
