"""Helpers shared by the tests (from sync/test_sync_added.py)."""

from __future__ import annotations

import time
from tests.support.sync import CONVERGE_TIMEOUT, Sync, _table_rows  # noqa: E402


def _rows(conn, table: str) -> list[tuple]:
    return sorted(conn.execute(f"SELECT id, v FROM {table}").fetchall())


def _converge(conn, out, sync: Sync, table: str) -> None:
    want = _rows(conn, table)
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while _table_rows(out, f"public.{table}") != want:
        assert sync.proc.poll() is None, sync.log()
        got = _table_rows(out, f"public.{table}")
        assert time.monotonic() < deadline, (
            f"{table}: {len(got or [])} of {len(want)} rows\n{sync.log()}"
        )
        time.sleep(0.3)
