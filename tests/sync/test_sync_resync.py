"""``pgcdc sync --on-invalid-slot resync`` against a real PostgreSQL 18 and real Spark: a
directory whose slot the server invalidated while sync was down is resynced from a new slot
and snapshot, each table replaced in one Delta commit (the old version still readable), and
sync goes on applying; then the slot dropped under the running sync: resynced in place, and on.
Both engines: the driver's loop and the Structured Streaming query (whose checkpoint starts
over with the new slot's capture).

(The default, ``fail``, exits 2: ``tests/sync/test_sync.py::test_invalidated_slot``.)
"""

from __future__ import annotations

import json

import pytest

from pgcdc.lsn import parse_lsn
from tests.support.delta import read_table
from tests.postgres import servers
from tests.support.sync import (
    CONVERGE_TIMEOUT,
    Sync,
    _converge,
    _drop_slot,
    _invalidate,
    _server_rows,
    _table_rows,
    _writes,
)  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")


@pytest.fixture(scope="module")
def server():
    # a server of its own: slots are invalidated with ALTER SYSTEM max_slot_wal_keep_size
    with servers.running_server("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 500) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        yield srv, conn


def _rows_at(path, version: int) -> list[tuple]:
    t = read_table(path, version)
    return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


@pytest.mark.parametrize("engine", ["loop", "streaming"])
def test_resync_after_invalidated_slot(server, tmp_path, engine):
    srv, conn = server
    out = tmp_path / "sync"
    table = out / "public.t"
    slot = f"s_{engine}"
    base = {"loop": 0, "streaming": 500_000}[engine]  # the ids each run writes
    options = ("--on-invalid-slot", "resync", "--engine", engine)

    # a directory in sync (its snapshot loaded), then stopped
    sync = Sync(srv, out, *options, slot=slot)
    sync.wait_for("ready")
    old = _converge(conn, out, sync)
    assert sync.stop() == 0, sync.log()
    before = deltalake.DeltaTable(str(table)).version()
    old_position = deltalake.DeltaTable(str(table)).transaction_version("pgcdc-apply")

    # writes, the slot invalidated while sync is down, more writes
    _writes(conn, base + 20_000, 100)
    _invalidate(conn, slot)
    _writes(conn, base + 30_000, 100)

    # a rerun resyncs: the table equals the server's, in exactly one new version
    sync = Sync(srv, out, *options, slot=slot)
    resync = sync.wait_for("resync")
    assert "invalidated" in resync["reason"] and resync["applied_lsn"], sync.log()
    done = sync.wait_for("resync_done")
    sync.wait_for("ready")
    assert _table_rows(out) == _server_rows(conn), sync.log()
    dt = deltalake.DeltaTable(str(table))
    assert dt.version() == before + 1, dt.history()
    assert dt.transaction_version("pgcdc-apply") > old_position
    assert done["consistent_point"] == dt.history(1)[0]["pgcdc.resync"]
    assert _rows_at(table, before) == old  # time travel: the state before the resync
    assert not (out / "_resync.json").exists() and not (out / "_resync_old").exists()
    state = json.loads((out / "_pgcdc_state.json").read_text())
    # applied up to just before the new point: a transaction committing at it is the slot's
    point = parse_lsn(done["consistent_point"])
    assert parse_lsn(state["applied_lsn"]) == point - 1

    # then it goes on: new writes applied from the new slot
    _writes(conn, base + 40_000, 100)
    _converge(conn, out, sync)
    sync.wait_for("apply")  # its line comes once the cycle is over, after the table's commit

    # the slot dropped under the running sync: its capture ends, sync resyncs in place (the
    # writes meanwhile in the new snapshot or the new slot's) and goes on; SIGTERM exits 0
    _drop_slot(conn, slot, terminate=True)
    _writes(conn, base + 50_000, 100)

    def resynced_twice():
        assert sync.proc.poll() is None, sync.log()
        return len(sync.named("resync_done")) >= 2

    until("a second resync_done", resynced_twice, CONVERGE_TIMEOUT)
    assert "does not exist" in sync.named("resync")[1]["reason"], sync.log()
    _writes(conn, base + 60_000, 100)
    _converge(conn, out, sync)
    assert sync.stop() == 0, sync.log()
    assert _table_rows(out) == _server_rows(conn)
    assert deltalake.DeltaTable(str(table)).version() >= before + 3
