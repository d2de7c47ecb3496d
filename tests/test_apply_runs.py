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
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.postgres import servers
from tests.delta_support import read_table
from tests.spark_support import spark  # noqa: F401
from tests.test_apply_postgres import _parquet_rows, _truth

pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")
pytest.importorskip("deltalake")

from pgcdc.cli import capture as capture_cli  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from pgcdc.apply import delta  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TABLES = ("acct", "bag", "note")
SCHEMA = [
    "CREATE TABLE acct (id int PRIMARY KEY, name text NOT NULL, bal numeric(12,2), tags text[])",
    "CREATE TABLE bag (v int, s text)",
    "ALTER TABLE bag REPLICA IDENTITY FULL",
    "CREATE TABLE note (id bigint PRIMARY KEY, body text, at timestamptz)",
    "CREATE PUBLICATION runs_pub FOR TABLE acct, bag, note",
    "SELECT pg_create_logical_replication_slot('runs', 'pgoutput')",
]
PHASE1 = [
    "INSERT INTO acct SELECT g, 'n' || g, g * 1.5, ARRAY['a', g::text] FROM generate_series(1, 300) g",
    "INSERT INTO bag SELECT g % 7, 's' || (g % 3) FROM generate_series(1, 60) g",
    "INSERT INTO note SELECT g, repeat('x', g), '2024-01-01'::timestamptz + g * interval '1 h'"
    " FROM generate_series(1, 50) g",
    "UPDATE acct SET bal = bal + 1 WHERE id % 3 = 0",
    "DELETE FROM acct WHERE id % 10 = 0",
    "UPDATE acct SET id = id + 1000 WHERE id % 25 = 1",  # key changes
    "DELETE FROM bag WHERE v = 3",
    "UPDATE bag SET s = 'changed' WHERE v = 2",
    "UPDATE note SET body = 'edited' WHERE id % 4 = 0",
]
PHASE2 = [
    "UPDATE acct SET name = 'again ' || id, bal = NULL WHERE id % 7 = 0",
    "DELETE FROM acct WHERE id % 11 = 0",
    "INSERT INTO acct SELECT g, 'new' || g, 'NaN', NULL FROM generate_series(2000, 2100) g",
    "UPDATE acct SET id = id + 5000 WHERE id BETWEEN 2000 AND 2010",
    "INSERT INTO acct VALUES (10, 'back', 1, '{}')",  # a deleted key comes back
    "INSERT INTO bag VALUES (3, 's0'), (3, 's0')",
    "DELETE FROM note WHERE id > 40",
    "UPDATE note SET at = 'infinity' WHERE id = 1",
]


def _capture(srv, capdir: Path, until: str) -> None:
    code = capture_cli.main(
        ["--dsn", srv.conninfo(), "--slot", "runs", "--publication", "runs_pub", "--out",
         str(capdir), "--until-lsn", until, "--log-format", "json", "--no-fsync"]
    )  # fmt: skip
    assert code == 0


def _phase(conn, statements) -> str:
    for stmt in statements:
        conn.execute(stmt)
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    cap = tmp / "cap"
    with servers.running_server("pg18") as srv, srv.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for stmt in SCHEMA:
            conn.execute(stmt)
        _capture(srv, cap, _phase(conn, PHASE1))
        truth1 = {t: _truth(conn, t) for t in TABLES}
        cap1 = tmp / "cap1"
        shutil.copytree(cap, cap1)
        _capture(srv, cap, _phase(conn, PHASE2))
        truth2 = {t: _truth(conn, t) for t in TABLES}
    return {"cap1": cap1, "cap": cap, "truth1": truth1, "truth2": truth2}


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
    commits: tests/test_delta_apply.py)."""
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
        deadline = time.monotonic() + 240
        while not due.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no commit came due"
            time.sleep(0.02)
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
