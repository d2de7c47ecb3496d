"""Runs of apply against a real PostgreSQL 18: incremental, killed midway, SCD2 history.

A workload of two phases (inserts, updates, deletes, key changes, a keyless table with
REPLICA IDENTITY FULL) is captured by ``pgcdc capture`` into one capture directory: after
phase 1 the directory is copied aside (``cap1``), then the same directory grows by phase 2's
segments (``cap``). The truth is the server's ``to_jsonb`` of its tables after each phase.

- incremental: apply ``cap1``, then ``cap``: the second run reads only units with new
  transactions (``ApplyReport.run`` / ``last_run`` in the state file), both states equal the
  server's; a re-run reads nothing and changes nothing;
- crash: ``pgcdc apply`` in a subprocess is SIGKILLed once its new version directory exists
  and before the state file names it; the previous state still reads (pyarrow, Spark) as it
  was, and a re-run completes to the server's state;
- SCD2: per key, versions do not overlap and chain (each ends where the next starts, or at a
  delete), ``_is_current`` iff open, and the current rows equal the server's table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.delta import read_table
from tests.support.truth import _parquet_rows  # noqa: E402

pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")

from pgcdc.apply.run import apply_changes  # noqa: E402
from tests.support.apply_runs import REPO, TABLES  # noqa: E402
from tests.wait import until  # noqa: E402


def _assert_state(out: Path, truth: dict, label: str) -> None:
    for table in TABLES:
        expected, rows = truth[table]
        assert _parquet_rows(out / f"public.{table}", rows) == expected, f"{label}: {table}"


def _written(out: Path, fmt: str) -> list:
    """What a run that writes nothing must leave as it was: the parquet layout's version
    directories, or each Delta table's log."""
    if fmt == "parquet":
        return sorted(str(p) for p in (out / "_versions").rglob("*"))
    return sorted(str(p) for p in out.glob("*/_delta_log/*"))


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_incremental_reads_only_new_units(runs, spark, tmp_path, fmt):  # noqa: F811
    out = tmp_path / "out"
    kw = {"split_records": 200, "format": fmt}
    first = apply_changes(spark, [str(runs["cap1"])], out, **kw)
    assert first.run["units_skipped"] == 0 and first.run["units_read"] > 1
    _assert_state(out, runs["truth1"], "phase 1")
    second = apply_changes(spark, [str(runs["cap"])], out, **kw)
    _assert_state(out, runs["truth2"], "phase 2")
    # phase 1's transactions are applied: their units are skipped (all but, at most, the one
    # in which phase 2 begins), and the state file records the run
    total = second.run["units_read"] + second.run["units_skipped"]
    assert second.run["units_skipped"] >= first.run["units_read"] - 1, second.run
    assert second.run["units_read"] < total
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    assert {k: v for k, v in doc["last_run"].items() if k != "finished_at"} == second.run
    # idempotent: nothing new, nothing read, nothing written
    state = (out / "_pgcdc_state.json").read_text()
    versions = _written(out, fmt)
    assert versions
    again = apply_changes(spark, [str(runs["cap"])], out, **kw)
    assert again == {} and again.run["units_read"] == 0
    assert (out / "_pgcdc_state.json").read_text() == state
    assert _written(out, fmt) == versions


def _snapshot(out: Path) -> dict:
    return {t: read_table(out / f"public.{t}").to_pylist() for t in TABLES}


def test_killed_run_leaves_previous_state(runs, spark, tmp_path):  # noqa: F811
    """The parquet layout (--format parquet); Delta's: tests/apply/test_delta_apply.py."""
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out, format="parquet")
    before_doc = (out / "_pgcdc_state.json").read_text()
    before = _snapshot(out)
    versions = {t: json.loads(before_doc)["tables"][f"public.{t}"]["version"] for t in TABLES}
    watch = [out / "_versions" / f"public.{t}" for t in TABLES]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc", "apply", str(runs["cap"]), "--out", str(out),
         "--master", "local[2]", "--format", "parquet"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:

        def new_version():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            return any(len(list(d.iterdir())) > 1 for d in watch if d.is_dir())

        until("a new version directory", new_version, 240, 0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    # killed before its commit point: the state file and links still name the old versions
    assert (out / "_pgcdc_state.json").read_text() == before_doc
    for t in TABLES:
        assert os.readlink(out / f"public.{t}").endswith(versions[t])
    assert _snapshot(out) == before
    assert spark.read.parquet(str(out / "public.acct")).count() == len(before["acct"])
    _assert_state(out, runs["truth1"], "after the kill")
    # a re-run cleans the dead run's versions and completes
    apply_changes(spark, [str(runs["cap"])], out, format="parquet")
    _assert_state(out, runs["truth2"], "after the re-run")
    for t in TABLES:
        assert len(list((out / "_versions" / f"public.{t}").iterdir())) == 1


def test_scd2_history(runs, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out, scd=2, tables=["acct", "note"])
    apply_changes(spark, [str(runs["cap"])], out, scd=2, tables=["acct", "note"])
    for table, key in (("acct", "id"), ("note", "id")):
        rows = read_table(out / f"public.{table}").to_pylist()
        by_key = defaultdict(list)
        for r in rows:
            assert r["_is_current"] == (r["_valid_to_lsn"] is None), r
            assert r["_valid_from_time"] is not None, r  # also for rows of an earlier run
            if r["_valid_to_lsn"] is not None:
                assert r["_valid_from_lsn"] < r["_valid_to_lsn"], r
                if r["_valid_to_time"] is not None:
                    assert r["_valid_from_time"] <= r["_valid_to_time"], r
            by_key[r[key]].append(r)
        for k, versions in by_key.items():
            versions.sort(key=lambda r: (r["_valid_from_lsn"], r["_tx_ordinal"]))
            assert sum(r["_is_current"] for r in versions) <= 1, (table, k)
            for a, b in zip(versions, versions[1:]):
                # non-overlapping: a version ends at or before the next one starts (equal
                # when one replaced the other; earlier when the key was deleted between)
                assert a["_valid_to_lsn"] is not None, (table, k)
                assert a["_valid_to_lsn"] <= b["_valid_from_lsn"], (table, k)
        # the current versions are the server's table
        expected, truth_rows = runs["truth2"][table]
        cur_path = tmp_path / f"current-{table}.parquet"
        t = read_table(out / f"public.{table}")
        t = t.filter(pc.equal(t["_is_current"], True))
        keep = [c for c in t.column_names if not c.startswith("_") or c == "_pg_text"]
        keep += ["_commit_lsn", "_tx_ordinal"]
        pq.write_table(t.select(keep), cur_path)
        assert _parquet_rows(cur_path, truth_rows) == expected, table
        # versions of deleted keys are closed; keys changed by UPDATE ... SET id moved
        assert len(by_key) > len(expected)
