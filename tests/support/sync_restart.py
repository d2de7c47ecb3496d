"""A server restart under a running sync (tests/sync/test_sync_restart.py, bench/sync_matrix.py)."""

from __future__ import annotations

import time
import psycopg
from tests.postgres import servers
from tests.support.relaunch import _relaunch  # noqa: E402


def _restart(srv) -> psycopg.Connection:
    servers._stop(srv)
    time.sleep(1.0)
    _relaunch(srv)
    conn = srv.connect()
    conn.autocommit = True
    return conn
