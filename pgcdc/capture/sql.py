"""The SQL-interface mode (``pgcdc capture --sql``), for environments without a replication
connection: ``pg_logical_slot_peek_binary_changes`` in batches, and
``pg_replication_slot_advance`` only after the batch is durable.

A peek always starts at the slot's confirmed position, so each batch is cut at its last
transaction boundary (what follows is peeked again next time), and the slot is advanced to
exactly what the capture directory holds. Same interface as
:class:`pgcdc.capture.logical.LogicalStream` (``open``, ``read``, ``ack``, ``idle_lsn``,
``stats``, ``close``), so the capture loop does not know which one it reads.
"""

from __future__ import annotations

import time
from collections import deque

import pgoutput_codec as pgc

from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.runtime.capture_file import RECORD_HEADER
from pgcdc.capture.checks import check_resume, check_slot_valid, current_identity, preflight
from pgcdc.capture.heartbeat import is_heartbeat
from pgcdc.capture.options import PluginOptions, max_protocol_version
from pgcdc.capture.logical import (
    Change,
    SlotSession,
    TransactionTracker,
    check_failover,
    record_flags,
)
from pgcdc.capture.walsender import (
    PINNED_GUCS,
    CaptureError,
    SlotInfo,
    _connect_error,
    _hint_for,
    _one_line,
    mask_dsn,
)

# the pgoutput tags (first payload byte) read_records looks at
_MESSAGE, _RELATION = ord(pgc.Message.TAG), ord(pgc.Relation.TAG)
_CHANGES = frozenset(ord(m.TAG) for m in (pgc.Insert, pgc.Update, pgc.Delete))


def _error(exc, what: str) -> CaptureError:
    diag = getattr(exc, "diag", None)
    state = getattr(exc, "sqlstate", None)
    text = _one_line(getattr(diag, "message_primary", None) or str(exc))
    hint = _hint_for(state, text)
    transient = state is None or state.startswith(("08", "57P"))
    return CaptureError(
        f"{what}: {text}" + (f" (fix: {hint})" if hint else ""), sqlstate=state, transient=transient
    )


class SqlSlotReader(SlotSession):
    """Reads a slot through the SQL functions, one batch of up to ``batch_size`` changes."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        publications,
        *,
        batch_size: int = 10_000,
        poll_interval: float = 1.0,
        **options,
    ):
        """``options``: those of :class:`~pgcdc.capture.logical.SlotSession`; the walsender's
        own (status_interval, auto_idle_ack) are accepted and mean nothing here."""
        mine = {k: v for k, v in options.items() if k not in ("status_interval", "auto_idle_ack")}
        super().__init__(dsn, slot, publications, **mine)
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.idle_lsn: int | None = None
        self._queue: deque[Change] = deque()
        self._limit = batch_size
        self._must_ack: int | None = None  # the batch's last boundary, not yet acked

    def open(self) -> SqlSlotReader:
        import psycopg

        try:
            self.conn = psycopg.connect(self.dsn, autocommit=True, application_name="pgcdc")
        except psycopg.Error as e:
            raise _connect_error(_one_line(str(e)), mask_dsn(self.dsn)) from None
        try:
            for name, value in PINNED_GUCS.items():
                self.conn.execute(f"SET {name} = '{value}'")
            major = self.conn.info.server_version // 10000
            req = dict(self._requested)
            if req["protocol_version"] is None:
                req["protocol_version"] = max_protocol_version(major)
            self.options = PluginOptions(**req)
            try:
                self.options.check(major)
            except ValueError as e:
                raise CaptureError(str(e)) from None
            execute = lambda q: self.conn.execute(q).fetchall()  # noqa: E731
            system_id, timeline, database, wal_end = self._one(
                "SELECT s.system_identifier::text, c.timeline_id, current_database(), "
                "pg_current_wal_lsn()::text FROM pg_control_system() s, pg_control_checkpoint() c",
                [],
            )
            check_failover(self.failover, self.temporary, major)
            health = check_slot_valid(execute, self.slot, self.resume_of,
                                      self.start_lsn if self.resume_of else None)  # fmt: skip
            self.health = health if health.exists else None
            if self.resume_of is not None:
                here = current_identity(system_id, timeline, database, self.slot,
                                        self.recorded_source, None)  # fmt: skip
                warning = check_resume(execute, self.resume_of, self.recorded_source, here,
                                       self.start_lsn, parse_lsn(wal_end),
                                       temporary=self.temporary)  # fmt: skip
                self.warnings += [warning] if warning else []
            preflight(execute, self.slot, self.options.publications, self.create_slot)
            row = self._one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                [self.slot],
            )
            if row is None:
                if not self.create_slot:
                    raise CaptureError(
                        f"replication slot {self.slot!r} does not exist "
                        "(fix: create it with --create-slot, or check --slot)"
                    )
                failover = ", failover => true" if self.failover else ""
                name, lsn = self._one(
                    "SELECT slot_name::text, lsn::text FROM "
                    f"pg_create_logical_replication_slot(%s, 'pgoutput', %s, %s{failover})",
                    [self.slot, self.temporary, self.options.two_phase],
                )
                self.created_slot = SlotInfo(name, parse_lsn(lsn), None, "pgoutput")
                confirmed = parse_lsn(lsn)
            else:
                confirmed = parse_lsn(row[0])
                if self.failover and not self.health.failover:
                    raise CaptureError(
                        f"slot {self.slot!r} is not a failover slot, and the SQL interface "
                        "cannot make it one (fix: run once without --sql, which turns it on "
                        "with ALTER_REPLICATION_SLOT, or create the slot with --failover)"
                    )
            self.source = current_identity(system_id, timeline, database, self.slot,
                                           self.recorded_source, self.created_slot)  # fmt: skip
            if self.start_lsn > confirmed:
                self._advance(self.start_lsn)
        except CaptureError:
            self.close()
            raise
        except psycopg.Error as e:
            self.close()
            raise _error(e, "SQL capture set-up") from None
        self.tracker = TransactionTracker(self.options.protocol_version, self.options.streaming)
        self._flags = record_flags(self.options.streaming)
        self.flushed_lsn = max(confirmed, self.start_lsn)
        self._boundary = self.flushed_lsn  # what a Relation message is recorded at (the stream's)
        return self

    def _one(self, query: str, params):
        return self.conn.execute(query, params).fetchone()

    def _advance(self, lsn: int) -> None:
        self.conn.execute(
            "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [self.slot, format_lsn(lsn)]
        )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _peek(self) -> bool:
        """Peek one batch; True when it must be peeked again, larger."""
        import psycopg

        opts = self.options.as_list()
        args = "".join(", %s, %s" for _ in opts)
        params = [self.slot, self._limit] + [x for kv in opts for x in kv]
        try:
            (end,) = self._one("SELECT pg_current_wal_flush_lsn()::text", [])
            rows = self.conn.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes"
                f"(%s, %s::pg_lsn, %s{args})",
                [self.slot, end] + params[1:],
            ).fetchall()
        except psycopg.Error as e:
            err = _error(e, "pg_logical_slot_peek_binary_changes")
            if err.sqlstate == "55000":  # an invalidated slot: say so (SlotInvalidated)
                execute = lambda q: self.conn.execute(q).fetchall()  # noqa: E731
                check_slot_valid(execute, self.slot)
            raise err from None
        self.stats.server_wal_end = max(self.stats.server_wal_end, parse_lsn(end))
        # A fresh tracker per batch: every peek starts at a boundary (the slot's position).
        tracker = TransactionTracker(self.options.protocol_version, self.options.streaming)
        batch, last = [], -1
        for lsn_text, data in rows:
            lsn, payload = parse_lsn(lsn_text), bytes(data)
            ctx = tracker.feed(lsn, payload)
            batch.append(Change(lsn, payload, ctx))
            if ctx.ack_lsn is not None:
                last = len(batch)
        if last > 0:
            self._queue.extend(batch[:last])
            self._must_ack = batch[last - 1].context.ack_lsn
            self._limit = self.batch_size
        elif len(rows) >= self._limit:
            self._limit *= 2  # one transaction (or stream) larger than a batch: peek more
            return True
        elif not rows or tracker.quiescent:
            # Decoding went up to ``end`` and nothing is open: ``end`` is a safe position.
            self.idle_lsn = parse_lsn(end) if parse_lsn(end) > self.flushed_lsn else None
        return False

    def read(self, timeout: float) -> Change | None:
        """The next change, or None: the batch is done (commit and ack it, then read again)
        or nothing new arrived within ``timeout``."""
        if self._queue:
            change = self._queue.popleft()
            self.stats.messages += 1
            self.stats.bytes += len(change.payload)
            self.stats.received_lsn = max(self.stats.received_lsn, change.lsn)
            return change
        if self._must_ack is not None and self.flushed_lsn < self._must_ack:
            return None  # the caller must make the batch durable and ack it first
        self._must_ack = None
        if self.idle_lsn is not None:
            return None  # waiting for the caller to ack the idle position
        while self._peek():  # a batch too small for one transaction: peek more at once
            pass
        if self._queue:
            return self.read(timeout)
        time.sleep(min(timeout, self.poll_interval))
        return None

    def read_records(
        self, out: bytearray, timeout: float, max_bytes: int = 1 << 20, until: int | None = None
    ) -> tuple[int, int, int]:
        """:meth:`pgcdc.capture.logical.LogicalStream.read_records` for the SQL interface: the
        changes of the current batch as capture records."""
        pv = self.options.protocol_version
        flags = self._flags
        header = RECORD_HEADER.pack
        limit = len(out) + max_bytes
        count, end, ack = 0, -1, 0
        on_relation = self.on_relation
        change = self.read(timeout)
        while change is not None:
            lsn, payload, ctx = change
            tag = payload[0]
            if tag == _MESSAGE and not ctx.in_stream and is_heartbeat(payload):
                pass  # a heartbeat (--messages): its position, not its record
            else:
                out += header(pv, flags[ctx.in_stream], lsn, len(payload))
                out += payload
            if on_relation is not None and tag == _RELATION:
                on_relation(self._boundary, bytes(payload), ctx.in_stream)
            elif self.on_change is not None and tag in _CHANGES and self.watching():
                self.on_change(lsn, bytes(payload), ctx.in_stream)
            count += 1
            if ctx.ack_lsn is not None:
                end, ack = len(out), ctx.ack_lsn
                self._boundary = max(self._boundary, ack)
                if until is not None and ack >= until:
                    break
            if len(out) >= limit or not self._queue:
                break
            change = self.read(0)
        return count, end, ack

    def ack(self, lsn: int) -> None:
        """The capture is durable up to ``lsn``: advance the slot there."""
        if lsn <= self.flushed_lsn:
            return
        try:
            self._advance(lsn)
        except Exception as e:
            raise _error(e, "pg_replication_slot_advance") from None
        self.flushed_lsn = lsn
        if self.idle_lsn is not None and self.idle_lsn <= lsn:
            self.idle_lsn = None
