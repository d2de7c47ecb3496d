"""The tasks of ``format("pgcdc")``: a micro-batch's events read from the slot
(:func:`read_batch`), in one Spark task per batch (a slot is one ordered stream: splitting a
batch would decode its start again in every task).

It streams the slot over the replication protocol (``START_REPLICATION`` from ``start``,
:class:`pgcdc.capture.logical.LogicalStream`, :func:`_open_stream`): the server skips what
commits before ``start`` and sends each transaction as it decodes it, so its decoding and this
process's typing run at the same time; the stream ends at the first transaction committing at
or past ``end``, or when a keepalive (asked for when the stream is quiet) says the server has
decoded past ``end``. The only position it reports to the server is ``start``, where Spark's
checkpoint already is. In a running query the task then holds the stream in its Python worker
for the next batch (:mod:`pgcdc.streaming.held`). ``transport=peek`` reads
``pg_logical_slot_peek_binary_changes(slot, end, NULL, ...)`` instead
(:func:`_peeked_parts`). The records are read in chunks by
:class:`pgcdc.events.reader.EventReader`, the catalog's questions asked on a connection of
their own (:class:`_SideConnection`), and the rows built a column at a time
(:mod:`pgcdc.streaming.event_rows`, or :mod:`pgcdc.streaming.typed` for one table's typed rows).

The driver's side, offsets and slot advances, is :mod:`pgcdc.streaming.slot`, which imports
this module only when a task reads.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from itertools import chain

import psycopg
from psycopg.conninfo import make_conninfo

from pgcdc.capture.files import raw_chunks
from pgcdc.capture.logical import LogicalStream
from pgcdc.capture.walsender import PINNED_GUCS, CaptureError, quote_literal
from pgcdc.events.gcpause import paused
from pgcdc.events.reader import EventReader, RawRun
from pgcdc.lsn import format_lsn
from pgcdc.runtime.capture_file import RECORD_HEADER
from pgcdc.streaming import json_runs
from pgcdc.streaming.held import (
    HELD_APP,
    SLOT_BUSY,
    SLOT_BUSY_PATIENCE,
    HeldStream,
    SlotError,
    end_holder,
    stream_tag,
    take,
    wait_if_busy,
)
from pgcdc.streaming.event_rows import RAW_RUN_ROWS, Batches, arrow_schema, events_batch
from pgcdc.streaming.typed import TypedBatches
from pgcdc.values import LiveCatalog

__all__ = ["read_batch"]


def read_batch(opts: dict, plugin_options, start: int, end: int, *, batch_rows: int = 10_000,
               keep: bool = False):  # fmt: skip
    """Arrow batches of the events whose transaction's commit record starts in
    [start, end), read from the slot without consuming (see the module docstring).
    ``keep``: the stream is held for a batch starting at ``end``."""
    with paused():  # a fifth of the read was the cycle collector walking new events
        yield from _read_batch(opts, plugin_options, start, end, batch_rows, keep)


def _read_batch(opts: dict, plugin_options, start: int, end: int, batch_rows: int,
                keep: bool = False):  # fmt: skip
    typed = None
    if opts.get("table_doc"):
        typed = TypedBatches(opts["table_doc"])
    # runs of changes are taken raw: typed by Arrow from their text, or rendered as JSON
    if opts.get("transport", "walsender") == "walsender":
        parts = _streamed_parts(opts, plugin_options, start, end, raw_runs=True, keep=keep)
    else:
        parts = _peeked_parts(opts, plugin_options, start, end, raw_runs=True)
    if typed is None:
        make, mine, run_batch = events_batch, None, partial(json_runs.run_batch,
                                                           schema=arrow_schema())  # fmt: skip
    else:
        make, mine, run_batch = typed.batch, typed.mine, typed.run_batch
    out = Batches(make, batch_rows)
    for part in parts:
        if type(part) is RawRun:
            if part.txn[0] < start or (typed is not None and not typed.mine_run(part)):
                continue
            made = run_batch(part) if part.m >= RAW_RUN_ROWS else None
            if made is not None:
                yield from out.add_batch(made)
                continue
            part = part.events()  # a value for the exact path: loaded, as events
        # a transaction whose commit record starts before `start` (a non-transactional
        # message that ends at or before it) was in an earlier batch; its Relation messages
        # were still fed to the reader
        if part[0].commit_lsn <= start or part[-1].commit_lsn <= start:
            part = [ev for ev in part if not _before(ev, start)]
            if not part:
                continue
        if mine is not None:
            part = mine(part)
        yield from out.add_events(part)
    yield from out.finish()


class _SideConnection:
    """A plain connection, opened when first asked: the catalog's questions (types that are
    not built in, a binary slot's reg* OIDs) while the slot streams on another. Autocommit:
    it stays open while a stream is held between batches, and one idle in a transaction holds
    its locks on the catalog and is ended by ``idle_in_transaction_session_timeout``."""

    NAME = "pgcdc stream catalog"

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.conn = None

    def _open(self):
        if self.conn is None:
            self.conn = psycopg.connect(self.dsn, autocommit=True, application_name=self.NAME)
            for name, value in PINNED_GUCS.items():
                self.conn.execute(f"SET {name} = {quote_literal(value)}")
        return self.conn

    def query(self, sql: str, params):
        return self._open().execute(sql, params).fetchall()

    def set_name(self, name: str | None) -> None:
        """Its ``application_name`` (None: :data:`NAME`): a held stream's quiet report
        (:mod:`pgcdc.streaming.held`)."""
        self._open().execute("SELECT set_config('application_name', %s, false)",
                             [name or self.NAME])  # fmt: skip

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _open_stream(opts: dict, protocol_version: int, start: int, held: bool = False):
    """A walsender stream of the slot from ``start``, waiting while the slot is busy; one
    that may be ``held`` (:mod:`pgcdc.streaming.held`) says so by its application_name. A slot that
    another worker's held stream holds is taken from it."""
    dsn = opts["dsn"]
    if held:
        dsn = make_conninfo(dsn, application_name=HELD_APP)
    deadline = time.monotonic() + SLOT_BUSY_PATIENCE
    conn = None  # to end a held stream that holds the slot: one for all the tries
    try:
        while True:
            stream = LogicalStream(
                dsn, opts["slot"], list(opts["publications"]),
                protocol_version=protocol_version, binary=opts["binary"],
                messages=opts["messages"], start_lsn=start, auto_idle_ack=False,
            )  # fmt: skip
            try:
                return stream.open()
            except CaptureError as e:
                busy = e.sqlstate == SLOT_BUSY or "is active for PID" in str(e)
                if not busy or time.monotonic() >= deadline:
                    raise SlotError(f"slot {opts['slot']!r}: stream from "
                                      f"{format_lsn(start)}: {str(e).strip()}") from None  # fmt: skip
            if conn is None:
                conn = psycopg.connect(opts["dsn"], autocommit=True,
                                       application_name="pgcdc stream")  # fmt: skip
            ended = end_holder(conn, opts["slot"])
            time.sleep(0.05 if ended else 0.5)
    finally:
        if conn is not None:
            conn.close()


_STREAM_CHUNK = 4 << 20  # bytes of records read from the stream before they are typed


_STREAM_GATHER = 1 << 20  # ... at least, while the server keeps sending


def _streamed_parts(opts: dict, plugin_options, start: int, end: int, raw_runs: bool = False,
                    keep: bool = False):  # fmt: skip
    """The events of the transactions committing in [start, end), in lists (or raw runs),
    streamed by a walsender from ``start``: the server skips what commits before ``start``
    and sends each transaction as it decodes it, while this process types the ones before.
    Ends at the first event committing at or past ``end``, or once the server says it has
    sent everything before ``end`` (a keepalive, asked for when the stream is quiet).

    ``keep``: the stream, and what was read past ``end``, are held for a batch starting at
    ``end`` (:mod:`pgcdc.streaming.held`); a stream held for ``start`` is taken rather than opened."""
    pv = int(dict(plugin_options)["proto_version"])
    key = (opts["dsn"], opts["slot"], opts["publications"], pv, opts["binary"],
           opts["messages"], opts["lenient"], raw_runs)  # fmt: skip
    held = take(key, start) if keep else None
    if held is not None:
        stream, reader, side, queue = held.stream, held.reader, held.side, held.queue
        # what a new stream from `start` would tell the server: Spark has the batches before
        stream.flushed_lsn = max(stream.flushed_lsn, start)
        try:
            stream.send_status()
        except Exception:  # noqa: BLE001 - it broke since its thread last read: a new one
            held.close()
            held = None
    if held is None:
        side = _SideConnection(opts["dsn"])
        stream = _open_stream(opts, pv, start, held=keep)
        reader = EventReader(lenient=opts["lenient"], catalog=LiveCatalog(side.query))
        queue = deque()  # iterators of parts read and not yet given, in stream order

    def parse(records: bytes):
        # a generator: nothing is read until its turn comes (the reader's state is in order)
        yield from reader.read_chunk_parts(raw_chunks(records), raw_runs)

    done = False
    try:
        while True:
            cut = False
            while queue and not cut:
                parts = queue[0]
                for part in parts:
                    if type(part) is RawRun:  # one transaction's changes
                        if part.txn[0] >= end:
                            queue[0], cut = chain([part], parts), True
                            break
                        yield part
                        continue
                    events = part if type(part) is list else list(part)
                    # commits are in order: only a part whose last event commits at or past
                    # the end is looked through, event by event
                    if events and events[-1].commit_lsn >= end:
                        at = next((i for i, ev in enumerate(events) if not _before(ev, end)),
                                  None)  # fmt: skip
                        if at is not None:
                            if at:
                                yield events[:at]
                            queue[0], cut = chain([events[at:]], parts), True
                            break
                    if events:
                        yield events
                else:
                    queue.popleft()
            if cut or stream.stats.server_wal_end >= end:
                done = True
                return
            out = bytearray()
            n, _, _ = stream.read_records(out, 0.2, _STREAM_CHUNK, end)
            while n and len(out) < _STREAM_GATHER and stream.stats.server_wal_end < end:
                # messages flowing: gather more before typing (a column is typed at once)
                n, _, _ = stream.read_records(out, 0.01, _STREAM_CHUNK - len(out), end)
            if out:
                queue.append(parse(bytes(out)))
            elif n == 0:
                stream.send_status(reply_requested=True)
    finally:
        if done and keep:
            tag = stream_tag(opts, pv)
            HeldStream(key, stream, reader, side, end, queue, parse, tag).hold(opts["hold_seconds"])
        else:
            stream.close()
            side.close()


def _before(ev, lsn: int) -> bool:
    """Whether ``ev`` belongs to a batch that ends at ``lsn``: its transaction's commit record
    starts before it, or (a non-transactional message, ``tx_ordinal`` -1) its own record
    does. A message's LSN is where its record ends, so a message ending exactly at a
    batch's end is that batch's: the next batch's walsender, started there, skips it."""
    return ev.commit_lsn <= lsn if ev.tx_ordinal == -1 else ev.commit_lsn < lsn


_PEEK_ROWS = 10_000  # a peek's rows taken at a time, and typed together


def _peeked_parts(opts: dict, plugin_options, start: int, end: int, raw_runs: bool = False):
    """The events, in lists (or raw runs, as :func:`_streamed_parts` gives them), of
    ``pg_logical_slot_peek_binary_changes(slot, end, ...)``: its rows streamed in binary
    (libpq's chunked rows, no hex to parse), each ``_PEEK_ROWS`` of them laid out as capture
    records (no stream flags: a peek does not stream) and read in chunks."""
    pv = int(dict(plugin_options)["proto_version"])
    args = "".join(", %s, %s" for _ in plugin_options)
    params = [opts["slot"], format_lsn(end)] + [x for kv in plugin_options for x in kv]
    query = (
        "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM"
        f" pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL{args})"
    )
    pack = RECORD_HEADER.pack

    def rows(conn):
        """The peek's rows, waiting while the slot is busy (:func:`wait_if_busy`; that is
        said before any row)."""
        deadline = time.monotonic() + SLOT_BUSY_PATIENCE
        while True:
            try:
                yield from conn.cursor(binary=True).stream(query, params, size=_PEEK_ROWS)
                return
            except psycopg.Error as e:
                wait_if_busy(e, deadline, opts["slot"], f"peek up to {format_lsn(end)}")

    # types that are not built in, and a binary slot's reg* OIDs: asked on a connection of
    # their own, as the rows stream on this one
    side = _SideConnection(opts["dsn"])
    reader = EventReader(lenient=opts["lenient"], catalog=LiveCatalog(side.query))
    try:
        with psycopg.connect(opts["dsn"], autocommit=True,
                             application_name="pgcdc stream read") as conn:  # fmt: skip
            conn.execute("; ".join(f"SET {k} = {quote_literal(v)}"
                                   for k, v in PINNED_GUCS.items()))  # fmt: skip
            records, n = bytearray(), 0
            for lsn, data in rows(conn):
                records += pack(pv, 0, lsn, len(data))
                records += data
                n += 1
                if n == _PEEK_ROWS:
                    yield from _parts_of(reader, records, raw_runs)
                    records, n = bytearray(), 0
            if records:
                yield from _parts_of(reader, records, raw_runs)
    finally:
        side.close()


def _parts_of(reader, records: bytearray, raw_runs: bool):
    """The parts of ``records`` (capture records) as :func:`_streamed_parts` gives them."""
    for part in reader.read_chunk_parts(raw_chunks(bytes(records)), raw_runs):
        if type(part) is RawRun:
            yield part
            continue
        events = list(part)
        if events:
            yield events
