"""``server`` (module scope): table t (2,000 rows) published as pub, on a database of the session
PostgreSQL 18 (tests/sync/test_sync.py, test_sync_kills.py, test_sync_streaming.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 2000) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        yield srv, conn
