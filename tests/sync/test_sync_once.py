"""``pgcdc sync --once`` against a real PostgreSQL 18 and real Spark: it takes the snapshot when
the directory has none, applies the capture up to the server's WAL position read at its start,
and exits 0 with the slot and the directory kept; a second ``--once`` after more writes picks
them up from there (no snapshot again), as a plain ``pgcdc sync`` would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pgcdc.lsn import parse_lsn
from tests.support.delta import read_table

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

ONCE_TIMEOUT = 300  # a cold JVM on 2 shared cores, the snapshot and its load


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 1000) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        yield srv, conn


def _once(srv, out) -> tuple[int, list[dict], str]:
    cmd = [sys.executable, "-m", "pgcdc", "sync", "--dsn", srv.conninfo(), "--publication",
           "pub", "--slot", "once", "--out", str(out), "--trigger", "1s", "--master",
           "local[1]", "--log-format", "json", "--no-fsync", "--once"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=ONCE_TIMEOUT)
    events = []
    for line in run.stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return run.returncode, events, run.stderr


def _named(events, name: str) -> list[dict]:
    return [e for e in events if e.get("event") == name]


def _rows(conn) -> list[tuple]:
    return sorted(conn.execute("SELECT id, v FROM t").fetchall())


def _table(out) -> list[tuple]:
    t = read_table(out / "public.t")
    return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


def test_once_applies_up_to_the_start_and_a_second_run_goes_on(server, tmp_path):
    srv, conn = server
    out = tmp_path / "sync"
    conn.execute("UPDATE t SET v = v || '!' WHERE id <= 10")  # before the run: in the snapshot

    code, events, err = _once(srv, out)
    assert code == 0, err
    assert _named(events, "snapshot_done")[0]["tables"] == {"public.t": 1000}, err
    (stopped,) = _named(events, "stopped")
    assert parse_lsn(stopped["applied_lsn"]) >= parse_lsn(stopped["once_lsn"]), stopped
    assert _table(out) == _rows(conn)
    slot = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'once'")
    assert slot.fetchall() == [(False,)]  # kept, and let go
    # status says the tables are current to where sync stopped, not "nothing applied yet"
    # (no change came after the snapshot: no transaction was applied)
    status = subprocess.run([sys.executable, "-m", "pgcdc", "status", str(out), "--json"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert status.returncode == 0, status.stderr
    apply = json.loads(status.stdout)["apply"]
    assert apply["applied_lsn"] == stopped["applied_lsn"], apply
    assert apply["tables"]["public.t"]["applied_lsn"] == stopped["applied_lsn"], apply

    # more writes, then a second run: a rerun (no snapshot) that applies them and stops
    conn.execute("INSERT INTO t SELECT g, 'b' || g FROM generate_series(2001, 2300) g")
    conn.execute("UPDATE t SET v = v || '+' WHERE id % 7 = 0 AND id < 1000")
    conn.execute("DELETE FROM t WHERE id % 11 = 0 AND id < 1000")
    want = _rows(conn)
    code, events, err = _once(srv, out)
    assert code == 0, err
    assert not _named(events, "snapshot"), err
    assert sum(a["events"] for a in _named(events, "apply")) > 300, err
    assert _named(events, "stopped"), err
    assert _table(out) == want

    # nothing new: a third run applies nothing and stops as well
    code, events, err = _once(srv, out)
    assert code == 0, err
    assert _table(out) == want
