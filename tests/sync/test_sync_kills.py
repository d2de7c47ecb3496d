"""``pgcdc sync`` when its processes are killed, with each engine (the Structured Streaming
query, the default, and ``--engine loop``), against a real PostgreSQL 18 and real Spark:

- its capture process SIGKILLed under writes (the OOM killer, an operator): sync says so
  (``capture_died``; both engines share what is done then, ``Sync.watch_capture``), starts
  the capture again from its durable position, and goes on;
- then sync itself SIGKILLed under writes, more writes while it is down, and a rerun, which
  goes on from the tables' positions (the query from its checkpoint; the loop writes none).

The tables equal the server's after each step, and SIGTERM exits 0.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.sync import (
    Sync,
    _converge,
    _killed_under_writes,
    _server_rows,
    _table_rows,
    _writes,
)  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def _capture_child(parent: int) -> int:
    """The pid of ``parent``'s capture child (``python -c "...capture_child()"``)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"capture_child" in cmd:
            return int(d.name)
    raise AssertionError(f"no capture child of {parent}")


@pytest.mark.parametrize("engine", ["streaming", "loop"])
def test_a_killed_capture_then_a_killed_sync_lose_nothing(server, tmp_path, engine):  # noqa: F811
    srv, conn = server
    base = {"streaming": 200_000, "loop": 400_000}[engine]  # the ids each run writes
    out = tmp_path / "sync"
    sync = Sync(srv, out, "--engine", engine, slot=f"died_{engine}")
    try:
        ready = sync.wait_for("ready")
        assert ("Structured Streaming" in ready["message"]) == (engine == "streaming"), sync.log()
        _writes(conn, base, 200)
        _converge(conn, out, sync)
        first = _capture_child(sync.proc.pid)
        os.kill(first, signal.SIGKILL)
        _writes(conn, base + 1000, 200)  # while it is down or coming back
        died = sync.wait_for("capture_died")
        assert str(-signal.SIGKILL) in died["message"], sync.log()
        _converge(conn, out, sync)
        again = until(f"a new capture child holding the slot\n{sync.log()}",
                      lambda: _capture_child(sync.proc.pid), 30, ignore=(AssertionError,))  # fmt: skip
        assert again != first
        conn.execute("INSERT INTO t VALUES (%s, 'after')", [base + 5000])
        _converge(conn, out, sync)

        _killed_under_writes(srv, sync, 3, first=base + 10_000)
        _writes(conn, base + 90_000, 200)
        sync = Sync(srv, out, "--engine", engine, slot=f"died_{engine}")
        sync.wait_for("ready")
        assert not sync.named("snapshot"), sync.log()
        _converge(conn, out, sync)
        assert sync.stop() == 0, sync.log()
        assert sync.named("stopped"), sync.log()
        assert _table_rows(out) == _server_rows(conn)
        assert (out / "_checkpoint").exists() == (engine == "streaming")  # the loop runs no query
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s AND NOT active",
            [f"died_{engine}"],
        )
