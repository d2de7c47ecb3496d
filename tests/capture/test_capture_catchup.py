"""A capture that starts with a backlog reads it with one peek, then streams
(:mod:`pgcdc.capture.catchup`): the events it captures are those of a twin slot read by the
walsender alone, none missing and none twice.

The backlog holds what the hand-off is sensitive to: a table altered half-way (a new
Relation), a non-transactional message inside a transaction left open across it, a
truncate, a large transaction (spilled to disk by the server: ``logical_decoding_work_mem``
is 64kB on the test servers), and a transaction still open when the capture starts, which
commits after the peek. A capture that streams large transactions (``--streaming``) is not
peeked for: its records stay those of the walsender. A second capture runs ahead of its slot (a confirm limit holds the
slot back, as sync's tables do), is stopped and started again on more backlog: its peek
starts at the slot's position and must pass over what the capture already holds.
"""

from __future__ import annotations

import io
import threading

import pytest

from pgcdc.capture import segments
from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.events.reader import EventReader
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.files import iter_records
from tests import wait  # noqa: E402

PUB = "cu_pub"


def _wal(conn) -> int:
    return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _backlog(conn, part: int) -> None:
    """About 2 MB of WAL in small transactions, with the awkward cases in between."""
    base = part * 100_000
    for i in range(0, 3000, 20):
        conn.execute(
            "INSERT INTO a SELECT g, repeat('x', 400) FROM generate_series(%s::int, %s::int) g",
            [base + i, base + i + 19],
        )
        if i == 1500:
            conn.execute(f"ALTER TABLE a ADD COLUMN c{part} int DEFAULT {part}")
            with conn.transaction():  # the message is sent before the insert it sits in
                conn.execute("INSERT INTO b VALUES (%s, 'around')", [base + 1])
                conn.execute("SELECT pg_logical_emit_message(false, 'cu', 'inside')")
            conn.execute("SELECT pg_logical_emit_message(false, 'cu', 'outside')")
            conn.execute("UPDATE a SET v = 'u' WHERE id BETWEEN %s AND %s", [base, base + 500])
        if i == 2000:
            conn.execute("TRUNCATE b")
            conn.execute("INSERT INTO b SELECT g, repeat('y', 200) FROM generate_series(1, 3000) g")


def _events(directory) -> list[tuple]:
    out = []
    for ev in EventReader().read(iter_records(directory)):
        out.append((ev.op, ev.table, ev.before, ev.after_dict(), ev.commit_lsn,
                    ev.tx_ordinal, ev.lsn, ev.detail))  # fmt: skip
    return out


class _Running:
    """A capture in a thread, until it has reached ``until``."""

    def __init__(self, srv, slot: str, out, catch_up: int, streaming: str, until: int,
                 confirm_limit=None):  # fmt: skip
        self.log = io.StringIO()
        config = CaptureConfig(dsn=srv.conninfo(), slot=slot, publications=[PUB], out=str(out),
                               messages=True, streaming=streaming, catch_up_bytes=catch_up,
                               until_lsn=until, flush_interval=0.1, status_interval=0.2,
                               fsync=False, confirm_limit=confirm_limit)  # fmt: skip
        self.capture = Capture(config, Log("json", stream=self.log))
        self.code = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.capture.run()

    def stop_at(self, lsn: int, directory) -> None:
        wait.until("durable", lambda: (st := segments.read_state(directory)) and st.lsn >= lsn)
        self.capture.stop = True

    def caught_up(self) -> bool:
        return '"catch_up"' in self.log.getvalue()

    def join(self, timeout: float = 60) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), self.log.getvalue()[-2000:]
        assert self.code == 0, self.log.getvalue()[-2000:]
        return self.log.getvalue()


def _setup(conn, slots) -> None:
    conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE b (id int, v text)")
    conn.execute("ALTER TABLE b REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE c (id int PRIMARY KEY, v text)")  # the open transaction's
    conn.execute(f"CREATE PUBLICATION {PUB} FOR TABLE a, b, c")
    for slot in slots:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])


@pytest.mark.parametrize("key", ["pg15", "pg18"])
def test_a_backlog_peeked_then_streamed_equals_the_walsender_alone(pg, key, tmp_path):
    streaming = "off"
    with pg.database(key) as srv, srv.connect() as conn, srv.connect() as other:
        _setup(conn, ["peeked", "twin"])
        _backlog(conn, 1)
        other.execute("BEGIN")  # open across the capture's start: commits after the peek
        other.execute("INSERT INTO c VALUES (-1, 'open across the start')")
        other.execute("INSERT INTO c SELECT g, 'big' FROM generate_series(-20000, -2) g")
        _backlog(conn, 2)
        peeked = _Running(srv, "peeked", tmp_path / "peeked", 128 << 20, streaming, None)
        wait.until("the peek", peeked.caught_up)
        other.execute("COMMIT")
        conn.execute("INSERT INTO b VALUES (-2, 'streamed after the peek')")
        until = _wal(conn)
        twin = _Running(srv, "twin", tmp_path / "twin", 0, streaming, until)
        peeked.stop_at(until, tmp_path / "peeked")
        log = peeked.join()
        assert not twin.join().count('"catch_up"')
    assert "read " in log and "with a peek" in log  # the backlog came by the peek
    got, want = _events(tmp_path / "peeked"), _events(tmp_path / "twin")
    assert {e[0] for e in want} >= {"c", "u", "t", "m"}, "the workload lost its cases"
    assert any(e[1] == "c" and e[3] and e[3].get("id") == -1 for e in want)  # the open one
    assert got == want


def test_a_capture_ahead_of_its_slot_peeks_past_what_it_holds(pg, tmp_path):
    limit = tmp_path / "applied.lsn"
    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn, ["ahead", "twin"])
        created = _wal(conn)
        limit.write_text(format_lsn(created) + "\n")  # the slot stays where it was made
        _backlog(conn, 1)
        first = _wal(conn)
        run = _Running(srv, "ahead", tmp_path / "ahead", 128 << 20, "off", first, str(limit))
        run.join()
        held = segments.read_state(tmp_path / "ahead").lsn
        (confirmed,) = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'ahead'"
        ).fetchone()
        assert parse_lsn(confirmed) <= created < held  # the capture is ahead of its slot
        _backlog(conn, 2)
        until = _wal(conn)
        log = _Running(srv, "ahead", tmp_path / "ahead", 128 << 20, "off", until,
                       str(limit)).join()  # fmt: skip
        _Running(srv, "twin", tmp_path / "twin", 0, "off", until).join()
    assert log.count("with a peek") == 1, log  # part two came by a peek from the slot's start
    got, want = _events(tmp_path / "ahead"), _events(tmp_path / "twin")
    assert len(got) == len({(e[4], e[5]) for e in got}), "events twice"
    assert got == want


def test_a_restart_durable_past_until_lsn_stops_at_once(pg, tmp_path):
    """--until-lsn already durable (here: the peek read up to it) ends the run where it is,
    not at the next WAL the server happens to write."""
    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn, ["s"])
        _backlog(conn, 1)
        until = _wal(conn)
        log = _Running(srv, "s", tmp_path / "s", 128 << 20, "off", until).join()
        assert "with a peek" in log
        held = segments.read_state(tmp_path / "s").lsn
        again = _Running(srv, "s", tmp_path / "s", 128 << 20, "off", until).join()
    assert held >= until
    reached = [line for line in again.splitlines() if '"until_lsn"' in line]
    assert len(reached) == 1 and format_lsn(held) in reached[0], again
    assert segments.read_state(tmp_path / "s").lsn == held


@pytest.mark.parametrize("written", [False, True], ids=["before-records", "after-records"])
def test_a_failed_peek_leaves_the_backlog_to_the_walsender(pg, tmp_path, monkeypatch, written):
    """The peek's connection breaks (before anything is written, or after records that were
    not committed): the walsender reads the backlog, and nothing is missing or twice."""
    import psycopg

    from pgcdc.capture import catchup

    real = catchup.peek_backlog

    def broken(src, writer, start, upto, **kw):
        if written:  # part of the backlog in the buffer, even on disk, but not durable
            real(src, writer, start, upto)
            writer.write_out()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(catchup, "peek_backlog", broken)
    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn, ["peeked", "twin"])
        _backlog(conn, 1)
        until = _wal(conn)
        log = _Running(srv, "peeked", tmp_path / "peeked", 128 << 20, "off", until).join()
        _Running(srv, "twin", tmp_path / "twin", 0, "off", until).join()
    if written:
        assert "catching up by a peek failed" in log, log
    else:
        assert "the walsender reads the backlog (a peek failed" in log, log
    assert "with a peek in" not in log
    got, want = _events(tmp_path / "peeked"), _events(tmp_path / "twin")
    assert len(want) > 3000 and got == want


def test_a_streaming_capture_is_not_peeked_for(pg, tmp_path):
    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn, ["s"])
        _backlog(conn, 1)
        log = _Running(srv, "s", tmp_path / "s", 128 << 20, "on", _wal(conn)).join()
    assert '"catch_up"' not in log
    assert sum(1 for r in iter_records(tmp_path / "s") if r.in_stream) > 0  # streamed


def test_a_busy_slot_is_waited_for_and_then_peeked(pg, tmp_path):
    """The slot is still held (a killed run's walsender) when the capture starts: the session
    is tried again until it is free (more often than a first connection that fails would
    be), and the backlog still comes by the peek."""
    from pgcdc.capture.logical import LogicalStream

    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn, ["s", "twin"])
        _backlog(conn, 1)
        until = _wal(conn)
        holder = LogicalStream(srv.conninfo(), "s", [PUB], auto_idle_ack=False).open()
        try:
            run = _Running(srv, "s", tmp_path / "s", 128 << 20, "off", until)
            # three tries: as many as --connect-attempts allows a first connection that
            # fails; a busy slot is not that, and is waited for (SLOT_BUSY_PATIENCE)
            wait.until("refused tries", lambda: run.log.getvalue().count("is active for PID") >= 3,
                   timeout=30)  # fmt: skip
        finally:
            holder.close()
        log = run.join()
        _Running(srv, "twin", tmp_path / "twin", 0, "off", until).join()
    assert "with a peek" in log and "the walsender reads the backlog" not in log, log
    assert _events(tmp_path / "s") == _events(tmp_path / "twin")
