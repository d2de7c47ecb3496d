"""A backlog read by one peek before the walsender streams: a restart catches up sooner.

A walsender sends every pgoutput message with a ``send()`` of its own, and over TCP that
is its bound: a backlog of 200,000 small changes takes it 0.53 s to send, where
``pg_logical_slot_peek_binary_changes`` decodes the same WAL into a result in 0.14-0.18 s
whose rows then arrive as one stream (0.3 s in all until they are records here). So a
capture that starts with a backlog first peeks up to ``catch_up_bytes`` of it on a plain
connection, writes the messages as the records the walsender's would have been, and
then starts the walsender after them.

Why the two give the same messages as the walsender alone would:

- a peek up to ``upto`` decodes WAL records until one ends at or past it, so it returns
  the transactions whose commit record starts before ``upto``, whole (the server spills a
  large transaction to disk, as it does for the walsender without streaming);
- the peek's last transaction ends at ``end`` (its commit's ack position), and nothing
  else commits or is sent between ``end`` and ``upto``: ``START_REPLICATION`` at ``end``
  skips exactly what the peek returned (a transaction whose commit record starts before
  the start position, a non-transactional message that starts before it);
- a peek starts at the slot's confirmed position, which may lie behind the capture's own
  (the capture holds more than sync has applied, after a kill): the transactions
  committing before the capture's position, and the non-transactional messages before
  it, are passed over, as the walsender would. Their Relation messages are not needed:
  the capture wrote them when it read those transactions first.

A peek does not move the slot: what it read is confirmed like anything else the capture
holds, once durable (and, under sync, applied). Nothing is peeked when the capture streams
large transactions in progress (``--streaming``) or reads two-phase (a peek would give
whole transactions, or no prepare, where the walsender gives what was asked for), nor when
the capture is more than the window ahead of the slot (the peek would send all that
again). If the
plain connection or the peek fails before anything was written, the walsender reads the
backlog, as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct

from pgcdc.lsn import format_lsn
from pgcdc.capture.heartbeat import is_heartbeat
from pgcdc.capture.logical import (
    _BEGIN,
    _CHANGES,
    _CONTROL,
    _ENDS_TXN,
    _MESSAGE,
    _RELATION,
    TransactionTracker,
    record_flags,
)
from pgcdc.capture.walsender import PINNED_GUCS, quote_literal

__all__ = ["CATCH_UP_MIN", "CatchUp", "catch_up_range", "peek_backlog"]

_FINAL_LSN = Struct(">Q")  # a Begin message's first field: where its commit record starts

CATCH_UP_MIN = 1 << 20  # bytes of WAL: a smaller backlog streams as fast as it peeks
FETCH_ROWS = 10_000  # rows the client takes at a time (libpq's chunked rows)


@dataclass
class CatchUp:
    """What a peek from ``start`` read: ``messages`` (``bytes`` of payload) of the
    transactions committing in ``[start, end)``; ``end`` is the last one's end (``start``
    when there was none), and nothing else commits between it and the peek's ``upto``."""

    end: int
    messages: int
    bytes: int


def catch_up_range(src, window: int) -> tuple[int, int] | None:
    """``(start, upto)`` of the backlog worth peeking before ``src`` (an opened
    :class:`pgcdc.capture.logical.LogicalStream`, not streaming yet) streams, or None."""
    health, opts = src.health, src.options
    if window <= 0 or health is None or health.confirmed_flush_lsn is None:
        return None  # no slot before this session: nothing behind it
    if src.temporary or src.created_slot is not None:
        return None  # a slot of this session's own: active in it, and nothing behind it
    if opts.two_phase or opts.streaming != "off":
        return None  # what was asked for comes as the walsender sends it
    confirmed = health.confirmed_flush_lsn
    start = max(src.start_lsn, confirmed)
    if start - confirmed > window:  # the peek would send that much again, to be passed over
        return None
    upto = min(src.system.xlogpos, start + window)
    if upto - start < CATCH_UP_MIN:
        return None
    return start, upto


def peek_backlog(src, writer, start: int, upto: int, *, commit_every: int | None = None,
                 on_commit=None) -> CatchUp:  # fmt: skip
    """Peek ``src``'s slot up to ``upto`` and append the messages of the transactions
    committing at or after ``start`` to ``writer``'s buffer as capture records
    (``src.on_relation``/``on_change`` called as the walsender's reading would), marking
    each transaction boundary; ``on_commit()`` after every ``commit_every`` messages and
    at the end (the caller makes them durable).

    A peek starts at the slot's confirmed position: with ``start`` past it (the capture
    holds what lies between), the transactions committing before ``start`` and the
    non-transactional messages before it are passed over, as ``START_REPLICATION`` at
    ``start`` would. Their Relation messages are not needed: the capture wrote them when it
    read those transactions.

    Raises ``psycopg.Error`` when the peek fails; ``writer`` then may hold records that
    were not committed (a new session recovers the directory without them)."""
    import psycopg

    opts = src.options
    pv = opts.protocol_version
    plugin = opts.as_list()  # streaming off, no two-phase (catch_up_range)
    args = "".join(", %s, %s" for _ in plugin)
    params = [src.slot, format_lsn(upto)]
    params += [x for kv in plugin for x in kv]
    tracker = TransactionTracker(pv, opts.streaming)
    flag = record_flags(opts.streaming)[0]
    on_relation, on_change, watching = src.on_relation, src.on_change, src.watching
    buf = writer.buf
    end = start
    count = size = since = 0
    with psycopg.connect(src.dsn, autocommit=True,
                         application_name="pgcdc capture catch-up") as conn:  # fmt: skip
        # the values' text as the walsender's session formats it
        conn.execute("; ".join(f"SET {k} = {quote_literal(v)}" for k, v in PINNED_GUCS.items()))
        cur = conn.cursor(binary=True)
        rows = cur.stream(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM"
            f" pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL{args})",
            params,
            size=FETCH_ROWS,
        )
        watch = on_change is not None and watching()
        skipping = False
        for lsn, data in rows:
            tag = data[0]
            if skipping:  # a transaction committing before start
                skipping = tag not in _ENDS_TXN
                continue
            if tag == _BEGIN and _FINAL_LSN.unpack_from(data, 1)[0] < start:
                skipping = True
                continue
            if tag == _MESSAGE and lsn <= start and not tracker.in_txn:
                continue  # a non-transactional message before start (its LSN is its end)
            count += 1
            since += 1
            size += len(data)
            if tag in _CONTROL:
                safe = tracker.control(tag, lsn, data)
                if not (tag == _MESSAGE and is_heartbeat(data)):  # its position, not its record
                    writer.append(pv, flag, lsn, data)
                if safe is not None:
                    writer.mark_end(safe)
                    end = safe
                    if commit_every is not None and since >= commit_every and on_commit:
                        on_commit()
                        since = 0
                continue
            writer.append(pv, flag, lsn, data)
            if tag == _RELATION and on_relation is not None:
                on_relation(end, data, False)  # recorded at the last boundary before it
                watch = on_change is not None and watching()
            elif watch and tag in _CHANGES:
                on_change(lsn, data, False)
            if len(buf) >= writer.buffer_bytes:
                writer.write_out()
    if not tracker.quiescent:  # cannot be: a peek returns whole transactions
        raise RuntimeError(f"the peek up to {format_lsn(upto)} ended inside a transaction")
    if on_commit is not None:
        on_commit()
    return CatchUp(end, count, size)
