"""``pgcdc sync`` run as a subprocess (:class:`Sync`: its JSON log lines, waits for events) and
the table ``t`` workload helpers: tests/sync/, tests/apply/test_columns.py,
bench/sync_matrix.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import psycopg
import pytest
from tests.support.delta import read_table
from tests.postgres.slots import invalidate_slot
from tests.wait import until, WaitTimeout  # noqa: E402


CONVERGE_TIMEOUT = 60


# two workers each starting a sync's JVM on 2 cores: a first run's ready took over 60 s once
READY_TIMEOUT = 180


# sync's options for a test whose steps each wait for its next look at the publication's
# tables (added, dropped, created again, renamed): every 2 s rather than the default 30
QUICK_CHECKS = ("--tables-check", "2s")


class Sync:
    """A ``pgcdc sync`` process, its JSON log lines collected as they come."""

    def __init__(self, srv, out, *extra: str, slot: str = "s", publication: str = "pub",
                 group: bool = False):  # fmt: skip
        """``group``: in a process group of its own, which :meth:`stop` signals whole (as a
        terminal's Ctrl-C reaches every process of its foreground group)."""
        cmd = [sys.executable, "-m", "pgcdc", "sync", "--dsn", srv.conninfo(), "--publication",
               publication, "--slot", slot, "--out", str(out), "--trigger", "1s", "--master",
               "local[1]", "--log-format", "json", "--no-fsync", *extra]  # fmt: skip
        self.started = time.monotonic()
        self.group = group
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     start_new_session=group)  # fmt: skip
        self.events: list[dict] = []
        self.other: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.other.append(line)

    def named(self, event: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == event]

    def wait_for(self, event: str, timeout: float | None = None) -> dict:
        if timeout is None:  # a first run's ready waits for a cold JVM, its snapshot and load
            timeout = READY_TIMEOUT if event == "ready" else CONVERGE_TIMEOUT

        def found():
            said = self.named(event)
            assert said or self.proc.poll() is None, self.log()
            return said

        try:
            return until(f"a {event!r} event", found, timeout)[0]
        except WaitTimeout as e:
            pytest.fail(f"{e}\n{self.log()}")

    def wait_applied(self, lsn: str, timeout: float = CONVERGE_TIMEOUT) -> dict:
        """The first ``apply`` line whose tables are current up to ``lsn`` (a pg_lsn text)."""
        from pgcdc.lsn import parse_lsn

        def applied():
            for e in self.named("apply"):
                if parse_lsn(e["applied_lsn"]) >= parse_lsn(lsn):
                    return e
            assert self.proc.poll() is None, self.log()
            return None

        try:
            return until(f"an apply up to {lsn}", applied, timeout)
        except WaitTimeout as e:
            pytest.fail(f"{e}\n{self.log()}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # say what it was doing, not only that it hung
            self.proc.kill()
            self.proc.wait(30)
            self.reader.join(10)
            pytest.fail(f"sync did not exit {timeout:g}s after signal {sig}:\n{self.log()}")
        self.reader.join(10)
        return code

    def log(self) -> str:
        return "\n".join(map(json.dumps, self.events)) + "\n" + "".join(self.other[-40:])


def _server_rows(conn) -> list[tuple]:
    return sorted(conn.execute("SELECT id, v FROM t").fetchall())


def _table_rows(out, name: str = "public.t") -> list[tuple] | None:
    path = out / name
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path)
    return sorted(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


def _converge(conn, out, sync: Sync | None = None) -> list[tuple]:
    """Wait until the Delta table equals the server's table (sync keeps running)."""
    want = _server_rows(conn)

    def equal():
        if _table_rows(out) == want:
            return True
        assert sync is None or sync.proc.poll() is None, sync.log()
        return False

    try:
        until(f"the Delta table's {len(want)} rows", equal, CONVERGE_TIMEOUT, interval=0.1)
    except WaitTimeout as e:
        got = _table_rows(out)
        pytest.fail(f"{e}: not converged: {len(got or [])} rows, want {len(want)}; "
                    f"{sync.log() if sync else ''}")  # fmt: skip
    return want


def _writes(conn, start: int, n: int) -> None:
    """n inserts from id start, an update and a delete of older rows, in a few transactions."""
    for i in range(start, start + n, 50):
        conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(%s::int, %s::int) g",
                     [i, min(i + 49, start + n - 1)])  # fmt: skip
    conn.execute("UPDATE t SET v = v || '+' WHERE id %% 7 = 0 AND id < %s", [start])
    conn.execute("DELETE FROM t WHERE id %% 11 = 0 AND id < %s", [start])


def _killed_under_writes(srv, sync: Sync, seconds: float, first: int = 20_000) -> None:
    """SIGKILL the sync after ``seconds`` of :func:`_writes` going on from id ``first``."""
    stop = threading.Event()

    def workload():
        with srv.connect() as c:
            i = first
            while not stop.is_set():
                _writes(c, i, 100)
                i += 100
                time.sleep(0.05)

    writer = threading.Thread(target=workload)
    writer.start()
    try:
        time.sleep(seconds)
        assert sync.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        stop.set()
        writer.join()


def _drop_slot(conn, slot: str, terminate: bool = False) -> None:
    """Drop a slot as soon as no walsender holds it (ending the one that does, if asked)."""

    def dropped():
        if terminate:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE slot_name = %s AND active_pid IS NOT NULL", [slot])  # fmt: skip
        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        return True

    until(f"slot {slot} dropped (no walsender holding it)", dropped,
          ignore=(psycopg.errors.ObjectInUse,))  # fmt: skip


def _invalidate(conn, slot: str) -> None:
    if not invalidate_slot(conn, slot):
        pytest.fail(f"slot {slot} was not invalidated")
