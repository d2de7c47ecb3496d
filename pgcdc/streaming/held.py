"""A running query's walsender stream, held in its task's Python worker for the next batch.

Each micro-batch's task used to open a walsender of its own and close it at the batch's end.
The server then decoded nothing while Spark committed the batch and planned the next, and
each new walsender started decoding again from the slot's ``restart_lsn``. In a burst, the
first batch took the few thousand rows committed when it was planned, and the rest waited
for the next task to start the server's decoding.

With a trigger other than ``AvailableNow`` (``_Batch.keep``), the task that ends a batch
keeps its stream in this process: the :class:`~pgcdc.events.reader.EventReader` that has seen its
Relation messages, and what it read past the batch's end. A thread reads on meanwhile, up to
:data:`HOLD_BYTES`, so the server decodes what comes while no task runs. The next batch's
task takes the stream when two things hold: Spark gives it to the same Python worker (one
task a batch: the worker that ran the last one is idle), and it starts where the held
stream's batch ended. Anything else closes the stream and opens one from the batch's start,
as before: another worker, a batch run again, another start. A stream held longer than the
source's option ``holdSeconds`` (10; 0: no stream is held) without a batch is closed, and so
is a held stream when its query stops between batches (the reader's ``stop``; a query
stopped in the middle of a batch leaves it to that timeout).

A held stream keeps the slot active between batches. A task that takes it confirms the
batch's start on it, as a new stream from that start did (Spark has committed every batch
before). The server refuses to advance an active slot, so the driver's ``commit`` leaves a
slot that a held stream holds to that stream. A task that finds the slot held by another
worker's held stream (:data:`HELD_APP`, its ``application_name``) ends it with
``pg_terminate_backend``: that worker is idle.

A held stream also says when the WAL past its batch's end holds nothing of the publication,
so that the driver plans no batch for it (the flush position moves with any write of the
database: another table's, autovacuum's). The walsender writes a transaction's messages
before it moves its sent position, and a keepalive after them on the same connection: a
stream that has received a keepalive of WAL end ``W`` and no message since its batch's end
``P`` knows that nothing of its publication commits in ``(P, W]``. It says so when the batch
ends (before the task does: the driver asks for the next offset right after) and at each
keepalive, asked for every :data:`QUIET_ASK` seconds while it has nothing, as the
``application_name`` of its side connection, ``pgcdc quiet TAG P W`` (:func:`quiet_tag`,
LSNs in hex), which ``pg_stat_activity`` shows to the driver wherever it runs
(:func:`quiet_reports`); the first message it receives takes it back. The driver only ever
delays a batch on it, never moves an offset past anything, so a stale or lost report costs
a batch's latency (:data:`QUIET_FRESH` at most), not a change.

What the driver (:mod:`pgcdc.streaming.slot`) and the tasks (:mod:`pgcdc.streaming.read`)
share about the slot is here too: :class:`SlotError`, the tag of a stream's quiet reports
(:func:`stream_tag`), and the wait while another process holds the slot
(:func:`execute_peek`).
"""

from __future__ import annotations

import threading
import time


HELD_APP = "pgcdc stream (held)"  # the application_name of a stream that may be held
HOLD_BYTES = 64 << 20  # records read ahead while held, at most
QUIET_APP = "pgcdc quiet"  # a quiet held stream's side connection: f"{QUIET_APP} TAG P W"
QUIET_ASK = 0.1  # seconds between the keepalives a quiet held stream asks for
# seconds a quiet report of the stream held for the batch's start is trusted for WAL written
# after its W (the stream would have taken it back on a message)
QUIET_FRESH = 0.5


def quiet_tag(slot: str, publications, protocol_version: int, binary: bool,
              messages: bool) -> str:  # fmt: skip
    """What a quiet report is about, in 8 hex digits: the slot and what its stream is asked
    to send (the same WAL gives the same messages)."""
    import zlib

    what = repr((slot, tuple(publications), int(protocol_version), bool(binary), bool(messages)))
    return f"{zlib.crc32(what.encode()):08x}"


_QUIET_SQL = (
    "SELECT application_name, extract(epoch FROM now() - state_change)::float8"
    " FROM pg_stat_activity WHERE application_name LIKE %s"
)


def quiet_reports(conn, tag: str) -> list[tuple[int, int, float]]:
    """The quiet reports of held streams of ``tag`` now: ``(P, W, age in seconds)``, each
    saying that nothing of the slot's publication commits in ``(P, W]``."""
    reports = []
    for name, age in conn.execute(_QUIET_SQL, [f"{QUIET_APP} {tag} %"]).fetchall():
        try:
            p, w = (int(x, 16) for x in name.split()[3:5])
        except ValueError:
            continue
        reports.append((p, w, float("inf") if age is None else age))
    return reports


_held: dict = {}  # key: HeldStream, in this process
_lock = threading.Lock()


class HeldStream:
    """A stream, its reader and side connection, ``position`` (the end of the batch it last
    served) and ``queue``: iterators of parts read past ``position``, in stream order."""

    def __init__(self, key, stream, reader, side, position: int, queue, parse,
                 tag: str | None = None):  # fmt: skip
        self.key, self.stream, self.reader, self.side = key, stream, reader, side
        self.position, self.queue = position, queue
        self.parse = parse  # raw records -> an iterator of their parts (by this reader)
        self.tag = tag  # quiet_tag of its stream; None: it says nothing (module docstring)
        self.quiet_to = 0  # the W it last said, 0: none
        self.next_ask = 0.0
        self.raw = bytearray()  # records read while held, after the queue's
        self.lock = threading.Lock()  # the stream: the thread, or the task taking it
        self.taken = self.closed = False
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._read_ahead, name="pgcdc-held", daemon=True)

    def hold(self, seconds: float) -> None:
        """Held for a batch that comes within ``seconds``, then closed."""
        self.seconds = seconds
        with _lock:
            old = _held.pop(self.key, None)
            _held[self.key] = self
        if old is not None:
            old.take_and_close()
        if self.tag is not None:
            try:  # said before the task ends, so the driver's next offset finds it
                self._say_quiet()
            except Exception:  # noqa: BLE001 - the stream is broken: the thread drops it
                self.tag = None
        self.thread.start()

    def _read_ahead(self) -> None:
        deadline = time.monotonic() + self.seconds
        while not self.taken:
            with self.lock:
                if self.taken:
                    return
                if time.monotonic() >= deadline:
                    self._drop()
                    return
                room = HOLD_BYTES - len(self.raw)
                if room > 0:
                    try:
                        self.stream.read_records(self.raw, 0.05, room)
                        if self.tag is not None:
                            self._say_quiet()
                    except Exception:  # noqa: BLE001 - the next batch opens a stream of its own
                        self._drop()
                        return
            if room <= 0:
                time.sleep(0.05)

    def _say_quiet(self) -> None:
        """While nothing came past ``position``: the keepalives' WAL end, as a quiet report
        (asked for every QUIET_ASK seconds). Something came: the report taken back, and no
        more (under ``self.lock``)."""
        if self.raw or self.queue:
            self.tag = None
            if self.quiet_to:
                self._name(None)
                self.quiet_to = 0  # taken back: take() need not again
            return
        wal_end = self.stream.stats.server_wal_end
        if wal_end > max(self.quiet_to, self.position):
            self._name(f"{QUIET_APP} {self.tag} {self.position:X} {wal_end:X}")
            self.quiet_to = wal_end
        now = time.monotonic()
        if self.tag is not None and now >= self.next_ask:
            self.stream.send_status(reply_requested=True)
            self.next_ask = now + QUIET_ASK

    def _name(self, name: str | None) -> None:
        """The side connection's application_name (None: its own again). A connection that
        fails says nothing more: the driver then plans batches as without it."""
        try:
            self.side.set_name(name)
        except Exception:  # noqa: BLE001 - the report is an optimisation, the stream goes on
            self.tag = None

    def _drop(self) -> None:
        """Closed here (under ``self.lock``), and no longer held."""
        self.closed = True
        with _lock:
            if _held.get(self.key) is self:
                del _held[self.key]
        self.close()

    def close(self) -> None:
        for part in (self.stream, self.side):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - a broken connection is closed all the same
                pass

    def _take(self) -> bool:
        """Stop the thread; whether the stream is still open."""
        self.taken = True
        with self.lock:
            closed = self.closed
        self.thread.join()
        return not closed

    def take_and_close(self) -> None:
        if self._take():
            self.close()


def take(key, start: int) -> HeldStream | None:
    """The stream this process holds for ``key`` if it served the batch ending at ``start``,
    with what it read meanwhile at the end of its queue; else None (one held for another
    start is closed)."""
    with _lock:
        held = _held.pop(key, None)
    if held is None or not held._take():
        return None
    if held.position != start:
        held.close()
        return None
    if held.quiet_to:
        held._name(None)  # taken: no longer quiet at its old position
    if held.raw:
        held.queue.append(held.parse(bytes(held.raw)))
        held.raw = bytearray()
    return held


_HOLDER_SQL = (
    "SELECT s.active_pid FROM pg_replication_slots s"
    " JOIN pg_stat_activity a ON a.pid = s.active_pid"
    " WHERE s.slot_name = %s AND a.application_name = %s"
)


def holder(conn, slot: str) -> int | None:
    """The pid of the held stream (of any worker) that holds ``slot`` now, or None."""
    row = conn.execute(_HOLDER_SQL, [slot, HELD_APP]).fetchone()
    return row[0] if row else None


def end_holder(conn, slot: str, wait: bool = True, pid: int | None = None) -> bool:
    """End the walsender that holds ``slot`` when it is a held stream (another worker's, idle
    between batches, or one its query stopped with; ``pid`` when :func:`holder` said it);
    whether one was ended. With ``wait``, returns once the walsender has exited and the slot
    is free (within 5 s). ``conn``: an autocommit connection."""
    pid = pid or holder(conn, slot)
    if pid is None:
        return False
    # ms to wait for the backend's exit, PostgreSQL 14+
    wait_ms = ", 5000" if wait and conn.info.server_version >= 140000 else ""
    (ended,) = conn.execute(f"SELECT pg_terminate_backend(%s{wait_ms})", [pid]).fetchone()
    deadline = time.monotonic() + 5
    while wait and ended and holder(conn, slot) == pid and time.monotonic() < deadline:
        time.sleep(0.02)  # before 14, the terminated backend exits by itself
    return bool(ended)


# --- a busy slot --------------------------------------------------------------------------------


class SlotError(RuntimeError):
    """A slot that cannot be read, with the slot and what to do (``format("pgcdc")``)."""


SLOT_BUSY = "55006"  # the slot is in use by another process
SLOT_BUSY_PATIENCE = 60.0  # seconds: a killed query's backend may hold the slot a moment


def stream_tag(opts: dict, protocol_version: int) -> str:
    """The :func:`quiet_tag` of the stream the source's options ``opts`` read: one place, so
    the driver and the tasks that report to it name the same stream."""
    return quiet_tag(opts["slot"], opts["publications"], protocol_version, opts["binary"],
                     opts["messages"])  # fmt: skip


def wait_if_busy(e, deadline: float, slot: str, what: str) -> None:
    """After peek ``what`` failed with ``e``: wait a moment and return while the slot is busy
    (a killed run's backend may still hold it until the server notices the closed
    connection) and ``deadline`` (``time.monotonic()``) is ahead; else raise SlotError."""
    if getattr(e, "sqlstate", None) == SLOT_BUSY and time.monotonic() < deadline:
        time.sleep(0.5)
        return
    raise SlotError(f"slot {slot!r}: {what}: {str(e).strip()}") from None


def execute_peek(conn, query: str, params, slot: str, what: str):
    """Run a peek, waiting while the slot is busy (:func:`wait_if_busy`)."""
    import psycopg  # lazy: psycopg (the held stream's own code needs none)

    deadline = time.monotonic() + SLOT_BUSY_PATIENCE
    while True:
        try:
            return conn.execute(query, params)
        except psycopg.Error as e:
            wait_if_busy(e, deadline, slot, what)
            if not conn.autocommit:
                conn.rollback()
