"""Helpers shared by the tests (from sync/test_sync.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 2000) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        yield srv, conn
