"""Runs of apply against a real PostgreSQL 18: incremental, killed midway, SCD2 history.

A workload of two phases (inserts, updates, deletes, key changes, a keyless table with
REPLICA IDENTITY FULL) is captured by ``pgcdc capture`` into one capture directory: after
phase 1 the directory is copied aside (``cap1``), then the same directory grows by phase 2's
segments (``cap``). The truth is the server's ``to_jsonb`` of its tables after each phase.

- incremental: apply ``cap1``, then ``cap``: the second run reads only units with new
  transactions (``ApplyReport.run`` / ``last_run`` in the state file), both states equal the
  server's; a re-run reads nothing and changes nothing;
- crash: ``pgcdc apply`` in a subprocess is SIGKILLed once a table's new files are written
  and before its commit; the summary and every table's version are the old ones, the
  previous state still reads (pyarrow, Spark) as it was, and a re-run completes to the
  server's state, its files in no version;
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
pytest.importorskip("deltalake")

from deltalake import DeltaTable  # noqa: E402

from pgcdc.apply import delta  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from tests.support.apply_runs import REPO, TABLES  # noqa: E402
from tests.wait import until  # noqa: E402


def _assert_state(out: Path, truth: dict, label: str) -> None:
    for table in TABLES:
        expected, rows = truth[table]
        assert _parquet_rows(out / f"public.{table}", rows) == expected, f"{label}: {table}"


def _written(out: Path) -> list:
    """What a run that writes nothing must leave as it was: each Delta table's log."""
    return sorted(str(p) for p in out.glob("*/_delta_log/*"))


def test_incremental_reads_only_new_units(runs, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    kw = {"split_records": 200}
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
    versions = _written(out)
    assert versions
    again = apply_changes(spark, [str(runs["cap"])], out, **kw)
    assert again == {} and again.run["units_read"] == 0
    assert (out / "_pgcdc_state.json").read_text() == state
    assert _written(out) == versions


def _snapshot(out: Path) -> dict:
    return {t: read_table(out / f"public.{t}").to_pylist() for t in TABLES}


# `pgcdc apply` whose commits never come: it signals (argv[1]) once a table's new files are
# written and its commit is due, then waits to be killed
_STALLED_APPLY = """
import sys, time
from pgcdc.apply import delta
def stalled(*args, **kwargs):
    open(sys.argv[1], "w").close()
    time.sleep(600)
delta.commit = stalled
from pgcdc.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _data_files(out: Path) -> set:
    return {p.name for p in out.glob("public.*/**/*.parquet")}


def test_killed_run_leaves_previous_state(runs, spark, tmp_path):  # noqa: F811
    """Killed after writing a table's files, before its commit (the dying between two tables'
    commits: tests/apply/test_delta_apply.py)."""
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out)
    before_doc = (out / "_pgcdc_state.json").read_text()
    before = _snapshot(out)
    versions = {t: json.loads(before_doc)["tables"][f"public.{t}"]["version"] for t in TABLES}
    files_before = _data_files(out)
    due = tmp_path / "commit-due"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALLED_APPLY, str(due), "apply", str(runs["cap"]), "--out",
         str(out), "--master", "local[2]"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:

        def commit_due():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            return due.exists()

        until("a commit came due", commit_due, 240, 0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    dead = _data_files(out) - files_before
    assert dead, "the killed run wrote no file"
    # killed before its commit: the summary and each table's version are the old ones
    assert (out / "_pgcdc_state.json").read_text() == before_doc
    for t in TABLES:
        assert DeltaTable(str(out / f"public.{t}")).version() == versions[t], t
    assert _snapshot(out) == before
    acct = delta.read_rows(spark, str(out / "public.acct"))
    assert acct.count() == len(before["acct"])
    _assert_state(out, runs["truth1"], "after the kill")
    # a re-run completes; the dead run's files are in no version
    apply_changes(spark, [str(runs["cap"])], out)
    _assert_state(out, runs["truth2"], "after the re-run")
    for t in TABLES:
        current = {Path(p).name for p, _s, _r in delta.current_files(str(out / f"public.{t}"))}
        assert not current & dead, t


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


def test_the_parquet_layout_is_refused(tmp_path):
    """The layout of version directories and links was removed: asking for it fails at once,
    in one line, saying that Delta Lake tables are written."""
    with pytest.raises(ValueError, match="parquet layout was removed"):
        apply_changes(None, [], tmp_path / "out", format="parquet")
    got = subprocess.run(
        [sys.executable, "-m", "pgcdc", "apply", str(tmp_path), "--out", str(tmp_path / "out"),
         "--format", "parquet"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "parquet layout was removed" in lines[0], got.stderr
    assert "Delta Lake" in lines[0]
    assert not (tmp_path / "out").exists()
