"""``pgcdc status`` against a real server (PostgreSQL 18): what it reports is what the server's
catalog, the capture's state.json and the applied tables say, read here on their own; and a
slot the server invalidated is reported as such."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pgcdc.capture import segments
from pgcdc.cli import capture
from pgcdc.lsn import parse_lsn
from tests.postgres import servers


def _pgcdc(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _capture(srv, out) -> None:
    code = capture.main(["--dsn", srv.conninfo(), "--slot", "s", "--publication", "pub",
                         "--out", str(out), "--idle-exit", "0.5", "--log-format", "json"])  # fmt: skip
    assert code == 0


def test_status_reports_what_the_server_and_the_files_say(tmp_path):
    pytest.importorskip("pyspark")
    # a server of its own: retained_wal_bytes is checked against a quiet server's WAL end, and
    # the text's lag in bytes (an autovacuum ANALYZE of t meanwhile writes kilobytes of WAL)
    quiet = {"autovacuum": "off"}
    with servers.running_server("pg18", settings=quiet) as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 500) g")
        conn.execute("DELETE FROM t WHERE id <= 20")
        cap, out = tmp_path / "cap", tmp_path / "tables"
        _capture(srv, cap)
        run = _pgcdc("apply", str(cap), "--out", str(out), "--master", "local[1]")
        assert run.returncode == 0, run.stderr
        conn.execute("INSERT INTO t VALUES (1000, 'not captured yet')")
        run = _pgcdc("status", str(cap), "--state", str(out), "--dsn", srv.conninfo(), "--json")
        assert run.returncode == 0, run.stderr
        doc = json.loads(run.stdout)
        wal, confirmed, restart, active = conn.execute(
            "SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text, restart_lsn::text, "
            "active FROM pg_replication_slots WHERE slot_name = 's'"
        ).fetchone()
        (rows,) = conn.execute("SELECT count(*) FROM t WHERE id < 1000").fetchone()
        text = _pgcdc("status", str(cap), "--state", str(out), "--dsn", srv.conninfo())
    state = json.loads((cap / segments.STATE_FILE).read_text())
    applied = json.loads((out / "_pgcdc_state.json").read_text())
    server = doc["server"]
    assert server["exists"] and server["active"] is active is False
    assert (server["wal_lsn"], server["confirmed_flush_lsn"]) == (wal, confirmed)
    assert server["retained_wal_bytes"] == parse_lsn(wal) - parse_lsn(restart)
    assert server["wal_status"] == "reserved" and server["safe_wal_size"] is None
    assert doc["capture"]["durable_lsn"] == state["lsn"]
    assert doc["capture"]["slot"] == "s" and doc["capture"]["source"] == state["source"]
    assert doc["apply"]["applied_lsn"] == applied["applied_lsn"]
    assert doc["apply"]["tables"]["public.t"]["rows"] == rows == 480
    assert doc["lag"]["apply_bytes"] == parse_lsn(wal) - parse_lsn(applied["applied_lsn"]) > 0
    assert doc["warnings"] == []
    # the text form says the same for a person
    assert "slot s: inactive, wal_status reserved" in text.stdout, text.stderr
    assert f"durable up to {state['lsn']}" in text.stdout
    # the tables at a glance: version, rows, the position its own Delta commit records, lag
    row = [x.split() for x in text.stdout.splitlines() if x.split()[:1] == ["public.t"]]
    assert row[0][:4] == ["public.t", "0", "480", applied["applied_lsn"]] and row[0][5] == "B"
    assert int(row[0][4]) > 0  # the server's WAL moves between the two calls
    table = doc["apply"]["tables"]["public.t"]
    assert table["applied_lsn"] == applied["applied_lsn"]
    assert table["lag_bytes"] == parse_lsn(server["wal_lsn"]) - parse_lsn(applied["applied_lsn"])
    # a pgcdc sync directory (its capture in _capture/, beside the tables) is read as both
    shutil.copytree(cap, out / "_capture")
    run = _pgcdc("status", str(out), "--json")
    assert run.returncode == 0, run.stderr
    both = json.loads(run.stdout)
    assert both["capture"]["durable_lsn"] == state["lsn"]
    assert both["apply"]["applied_lsn"] == applied["applied_lsn"]


def test_an_invalidated_slot_is_reported(tmp_path):
    settings = {"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0"}
    # a server of its own: started with max_slot_wal_keep_size to invalidate a slot
    with servers.running_server("pg18", settings) as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        for _ in range(6):  # WAL past max_slot_wal_keep_size, then a checkpoint cuts the slot
            conn.execute("INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, 4000) g")
            conn.execute("DELETE FROM t")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")
        (status,) = conn.execute(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 's'"
        ).fetchone()
        assert status == "lost"  # what the server says; status must say the same
        run = _pgcdc("status", "--dsn", srv.conninfo(), "--slot", "s", "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["server"]["wal_status"] == "lost"
    assert any("invalidated" in w and "new snapshot" in w for w in doc["warnings"]), doc


def test_status_needs_something_to_look_at(tmp_path):
    run = _pgcdc("status")
    assert run.returncode == 2 and "give a capture directory" in run.stderr
    run = _pgcdc("status", str(tmp_path / "missing"))
    assert run.returncode == 2 and "no such capture directory" in run.stderr
