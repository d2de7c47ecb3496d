"""``pgcdc sync --engine loop``: the live path as the driver's own cycles, without a Structured
Streaming query (the default engine is the query: tests/test_sync.py runs it).

Checked against a real PostgreSQL 18: from empty (snapshot, then writes), a SIGKILL while
writes go on, writes while it is down, a rerun, SIGTERM: the Delta table equals
the server's table after each step, each change counted once in the cycles' lines, and no
query checkpoint is written.
"""

from __future__ import annotations

import pytest

from tests.test_sync import (
    Sync,
    _converge,
    _killed_under_writes,
    _server_rows,
    _table_rows,
    _writes,
)
from tests.test_sync import server  # noqa: F401 - table t (2,000 rows) published as pub

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def test_the_loop_engine_applies_each_change_once_across_a_kill(server, tmp_path):  # noqa: F811
    srv, conn = server
    out = tmp_path / "sync"
    sync = Sync(srv, out, "--engine", "loop")
    ready = sync.wait_for("ready")
    assert "Structured Streaming" not in ready["message"], sync.log()
    assert sync.named("snapshot_done")[0]["tables"] == {"public.t": 2000}
    _writes(conn, 10_000, 300)
    _converge(conn, out, sync)
    want = 300 + len(range(7, 2001, 7)) + len(range(11, 2001, 11))
    assert sum(a["events"] for a in sync.named("apply")) == want, sync.log()

    _killed_under_writes(srv, sync, 4)
    _writes(conn, 90_000, 200)
    sync = Sync(srv, out, "--engine", "loop")
    sync.wait_for("ready")
    assert not sync.named("snapshot"), sync.log()
    _converge(conn, out, sync)
    conn.execute("INSERT INTO t VALUES (99999, 'last')")
    _converge(conn, out, sync)
    assert sync.stop() == 0, sync.log()
    assert sync.named("stopped"), sync.log()
    assert _table_rows(out) == _server_rows(conn)
    assert not (out / "_checkpoint").exists()  # no query ran
