"""``pgcdc sync`` across restarts of the server (real PostgreSQL 15 and 18, real Spark): the server
stopped and started again twice while sync runs and writes go on around the restarts; sync
keeps running (its capture reconnects, its cycles wait for the server), the tables end equal
to the server's, and SIGTERM then exits 0."""

from __future__ import annotations


import pytest

from tests.postgres import servers
from tests.support.sync import Sync, _converge, _writes  # noqa: E402
from tests.support.sync_restart import _restart  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


@pytest.mark.parametrize("key", ["pg15", "pg18"])
def test_sync_survives_server_restarts(key, tmp_path):
    # a server of its own: stopped and started again under sync
    with servers.running_server(key) as srv:
        conn = srv.connect()
        conn.autocommit = True
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 500) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        out = tmp_path / "sync"
        sync = Sync(srv, out)
        try:
            sync.wait_for("ready")
            for start in (10_000, 20_000):
                _writes(conn, start, 200)
                conn = _restart(srv)  # with changes maybe not yet captured or applied
                assert sync.proc.poll() is None, sync.log()
                _writes(conn, start + 5_000, 200)
                _converge(conn, out, sync)
            assert sync.stop() == 0, sync.log()
            assert sync.named("stopped"), sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()
            conn.close()
