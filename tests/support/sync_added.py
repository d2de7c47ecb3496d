"""A table's rows on the server and in its Delta table, waited for equal
(tests/sync/test_sync_added.py, test_sync_aside.py)."""

from __future__ import annotations

from tests.support.sync import CONVERGE_TIMEOUT, Sync, _table_rows  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402


def _rows(conn, table: str) -> list[tuple]:
    return sorted(conn.execute(f"SELECT id, v FROM {table}").fetchall())


def _converge(conn, out, sync: Sync, table: str) -> None:
    want = _rows(conn, table)

    def equal():
        assert sync.proc.poll() is None, sync.log()
        return _table_rows(out, f"public.{table}") == want

    try:
        until(f"{table}'s {len(want)} rows in its Delta table", equal, CONVERGE_TIMEOUT, 0.1)
    except WaitTimeout as e:
        got = _table_rows(out, f"public.{table}")
        raise AssertionError(f"{e}: {len(got or [])} of {len(want)} rows\n{sync.log()}") from None
