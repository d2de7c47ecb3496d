"""Crash test: ``pgcdc capture`` killed with SIGKILL at random instants, and the server restarted
twice, while a workload of 200k+ changes runs. The final capture directory must equal, record
for record, an uninterrupted capture of a twin slot created at the same point, but for where the
server put its Relation and Type messages (below); after each kill the durable prefix must be
intact and end with nothing open, and the server's confirmed_flush_lsn must not be past the
directory's durable position.

The workload ANALYZEs the table now and then, as autovacuum does: a catalog change committed
while a transaction is streamed invalidates the walsender's cache, and pgoutput sends the
Relation message again. Which walsender saw which invalidation depends on where it started, so
a restarted capture may hold a Relation message more or fewer (the same one) than the twin;
a reader of either directory sees the same events.

One server (PostgreSQL 18, which the harness runs with logical_decoding_work_mem = 64kB and
debug_logical_replication_streaming = immediate: every change is streamed as it is decoded, so
kills land inside open streamed transactions; one kill waits for a transaction the test holds
open until its Stream Start is in the capture's files)."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgcdc.capture import files, segments
from pgcdc.cli import capture as cli
from pgoutput_codec import capture as capfmt
from pgcdc.capture.logical import TransactionTracker
from pgcdc.events.reader import read_captures
from pgcdc.lsn import parse_lsn
from tests.support.events import described
from tests.postgres import servers
from tests.support.relaunch import _relaunch  # noqa: E402
from tests.wait import until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TXNS, ROWS = 200, 1000  # 200k inserts, plus the held-open transaction's
KILLS = 12
SERVER_RESTARTS_AT = (3, 8)  # after these kills
PAUSE = 0.1  # seconds between the workload's transactions: it runs while the kills happen
ANALYZE_EVERY = 7  # transactions: catalog changes committed while others are streamed
HELD_KILL = 5  # this kill waits for a transaction held open, and lands while it is streamed


class Workload(threading.Thread):
    """Inserts in 1,000-row transactions and an ANALYZE every few; survives server restarts by
    redoing the transaction."""

    def __init__(self, srv):
        super().__init__(daemon=True)
        self.srv = srv
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            i = 0
            conn = None
            while i < TXNS:
                try:
                    if conn is None:
                        conn = psycopg.connect(self.srv.conninfo(), autocommit=True)
                    conn.execute(
                        "INSERT INTO bulk SELECT g, md5(g::text) "
                        "FROM generate_series(%s::int, %s::int) g",
                        [i * ROWS, i * ROWS + ROWS - 1],
                    )
                    i += 1
                    if i % ANALYZE_EVERY == 0:
                        conn.execute("ANALYZE bulk")
                    time.sleep(PAUSE)
                except psycopg.OperationalError:
                    conn = None  # the server restarts: redo this transaction
                    time.sleep(0.3)
        except BaseException as e:  # reported by the test
            self.error = e


def _confirmed(srv, slot: str) -> int:
    def confirmed():
        with srv.connect() as conn:
            (lsn,) = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                [slot],
            ).fetchone()
            return (parse_lsn(lsn),)

    # the server may be restarting: until it answers
    (lsn,) = until(f"{slot}'s confirmed_flush_lsn", confirmed, 30, 0.1,
                   ignore=(psycopg.OperationalError,))  # fmt: skip
    return lsn


def _records_upto(out: Path, state) -> list:
    """The records of the capture directory up to its durable position (state.json)."""
    if state is None:
        return []
    records = []
    for path in segments.list_segments(out):
        data = path.read_bytes()
        if path.name == state.segment:
            data = data[: state.offset]
        records.extend(capfmt.iter_records(data))
        if path.name == state.segment:
            return records
    raise AssertionError(f"state.json names {state.segment}, which is missing")


def _open_streams(out: Path) -> set:
    """The streams open in a capture directory that a running capture is writing. The capture
    started after a kill is recovering meanwhile: it deletes the segments past the durable
    position, which may vanish between listing and reading; read again then."""
    while True:
        try:
            return _tracker(segments.iter_written(out)).open_streams
        except FileNotFoundError:
            time.sleep(0.05)


_SCHEMA_TAGS = (b"R", b"Y")  # Relation, Type: sent again wherever the walsender's cache says


def _schema(records) -> tuple[list, set]:
    """The records without the Relation and Type messages, and those messages' contents (the
    xid a streamed one starts with left out)."""
    rest, schema = [], set()
    for r in records:
        if r.data[:1] in _SCHEMA_TAGS:
            schema.add(r.data[:1] + r.data[5 if r.in_stream else 1 :])
        else:
            rest.append(r)
    return rest, schema


def _tracker(records) -> TransactionTracker:
    tracker = TransactionTracker(4, "parallel")
    for r in records:
        tracker.feed(r.lsn, r.data)
    return tracker


@pytest.fixture
def spawned():
    """Processes a test starts: killed at teardown if still running, so that a failed test
    leaves no capture behind, retrying its connection for ever."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill_and_restart_equals_uninterrupted(tmp_path, capsys, spawned):
    """The guarantee (README, "pgcdc capture"): after any number of SIGKILLs and server
    restarts, the capture directory holds exactly the records an uninterrupted capture of the
    same slot holds (same order, LSN, flags and payload bytes): the durable position is always
    the end of a transaction with nothing open, anything after it is truncated before the
    server sends it again, and the server was never told more than is durable."""
    seed = int(os.environ.get("PGCDC_CRASH_SEED", time.time_ns() % 1_000_000))
    rnd = random.Random(seed)
    # a server of its own: restarted twice under the capture
    with servers.running_server("pg18") as srv:
        with srv.connect() as conn:
            settings = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('logical_decoding_work_mem', 'debug_logical_replication_streaming')"
            ).fetchall())  # fmt: skip
            # every change is streamed as it is decoded: kills land inside open streams
            assert settings == {"logical_decoding_work_mem": "64",
                                "debug_logical_replication_streaming": "immediate"}, settings  # fmt: skip
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
        log_path = Path(os.environ.get("PGCDC_CRASH_LOG") or tmp_path / "capture.log")

        def started() -> int:  # sessions the captures have started so far (JSON log lines)
            return log_path.read_text().count('"event": "started"') if log_path.exists() else 0

        sessions_before_launch = [0]

        def launch():
            sessions_before_launch[0] = started()
            with open(log_path, "a") as log:
                spawned.append(subprocess.Popen(argv, cwd=ROOT, stderr=log))
            return spawned[-1]

        work = Workload(srv)
        work.start()
        proc = launch()
        advanced = 0
        kills_in_open_stream = 0
        held_xid = None
        for k in range(KILLS):
            if k == HELD_KILL:  # inside a transaction held open, once it was streamed
                held = psycopg.connect(srv.conninfo())
                held.execute("INSERT INTO bulk SELECT -g, 'held' FROM generate_series(1, 1000) g")
                (held_xid,) = held.execute("SELECT txid_current() % 4294967296").fetchone()
                # the capture hands what it has to the OS when idle: the open stream's chunks
                # are in the files (past the durable position) before the kill
                until(f"seed {seed}: the held transaction streamed while open",
                      lambda: held_xid in _open_streams(out), 60)  # fmt: skip
                time.sleep(rnd.uniform(0.0, 0.5))
            else:
                time.sleep(rnd.uniform(0.3, 1.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # what the killed capture had written (nothing when killed during start-up)
            seen = list(segments.iter_written(out)) if out.exists() else []
            state = segments.read_state(out)
            durable_records = _records_upto(out, state)
            assert seen[: len(durable_records)] == durable_records
            # the durable position is a transaction boundary: nothing open before it
            assert _tracker(durable_records).quiescent, f"seed {seed}, kill {k}"
            open_at_kill = _tracker(seen).open_streams
            kills_in_open_stream += bool(open_at_kill)
            if k == HELD_KILL:
                assert held_xid in open_at_kill, f"seed {seed}: kill {k} missed the held stream"
                starts = [r for r in seen[len(durable_records) :] if r.data[:1] == b"S"]
                assert any(struct.unpack_from(">I", r.data, 1)[0] == held_xid for r in starts)
            durable = state.lsn if state else start_point
            confirmed = _confirmed(srv, "crash")
            assert confirmed <= durable, (
                f"seed {seed}, kill {k}: the server was told {confirmed:X} is flushed, "
                f"the directory is durable only to {durable:X}"
            )
            advanced += confirmed > start_point
            if k == HELD_KILL:
                held.execute("INSERT INTO bulk VALUES (-1, 'after the kill')")
                held.commit()
                held.close()
            if k in SERVER_RESTARTS_AT:
                proc = launch()
                time.sleep(rnd.uniform(0.3, 1.0))
                servers._stop(srv)
                time.sleep(0.5)
                _relaunch(srv)
                continue
            proc = launch()
        work.join(180)
        assert not work.is_alive() and work.error is None, f"seed {seed}: {work.error!r}"
        with srv.connect() as conn:
            (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()

        # streaming (so its signal handlers are in place), caught up, the idle position acked
        def caught_up():
            assert proc.poll() is None, f"seed {seed}: the capture ended"
            return started() != sessions_before_launch[0] and _confirmed(srv, "crash") >= parse_lsn(
                end
            )

        until(f"seed {seed}: the capture caught up", caught_up, 120, 0.1)
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

        got, got_schema = _schema(files.iter_records(out))
        want, want_schema = _schema(files.iter_records(ref))
        inserts = sum(r.data[:1] == b"I" for r in want)
        assert inserts >= TXNS * ROWS, inserts
        # every other message, stream blocks included, is the same (LSN, flags, bytes)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"seed {seed}: message {i} differs: {g!r:.200} vs {w!r:.200}"
        assert len(got) == len(want), f"seed {seed}: {len(got)} vs {len(want)} messages"
        # the same table described the same way, however often
        assert got_schema == want_schema and len(want_schema) == 1, (got_schema, want_schema)
        # and a reader sees the same events (a relation's description, not its cache epoch)
        got_events, want_events = (list(map(described, read_captures([d]))) for d in (out, ref))
        assert got_events == want_events, f"seed {seed}: the events differ"
        assert held_xid in {struct.unpack_from(">I", r.data, 1)[0] for r in want
                            if r.data[:1] == b"c"}, "the held transaction committed"  # fmt: skip
        assert len(segments.list_segments(out)) > 1  # rotation happened
        assert kills_in_open_stream >= 1
        final = json.loads((out / "state.json").read_text())
        assert _confirmed(srv, "crash") == parse_lsn(final["lsn"])
