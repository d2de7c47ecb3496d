"""The Python API: read a slot as an iterator of ``(lsn, payload, context)`` with explicit acks.

    from pgcdc.capture.logical import LogicalStream

    with LogicalStream("host=db user=cdc", slot="s", publications=["pub"]) as stream:
        for lsn, payload, ctx in stream:
            handle(payload, ctx)          # e.g. pgoutput_codec.decode(payload, **ctx.codec_args)
            if ctx.ack_lsn is not None:   # a transaction just ended: nothing is open
                make_durable()
                stream.ack(ctx.ack_lsn)   # the server may now forget everything before it

The stream answers keepalives and sends standby status updates on its own schedule; the flush
position it reports is only ever what was passed to :meth:`LogicalStream.ack` (or, when idle,
the server's WAL end once everything yielded has been acked, see :class:`TransactionTracker`).
"""

from __future__ import annotations

import os
import select
import socket
import time
from dataclasses import dataclass
from struct import Struct
from typing import NamedTuple

import pgoutput_codec as pgc
import replication_codec

from pgcdc.lsn import format_lsn
from pgcdc.runtime.capture_file import RECORD_HEADER
from pgcdc.capture.copyread import c_records
from pgcdc.capture.checks import (
    SlotHealth,
    SourceIdentity,
    check_resume,
    check_slot_valid,
    current_identity,
    preflight,
)
from pgcdc.capture.heartbeat import is_heartbeat
from pgcdc.capture.options import PluginOptions, max_protocol_version, pg_now_us
from pgcdc.capture.segments import FLAG_IN_STREAM, FLAG_PARALLEL
from pgcdc.capture.walsender import CaptureError, SlotInfo, WalsenderConnection


class Context(NamedTuple):
    """What a payload needs to be decoded, and where it is safe to acknowledge.

    ``ack_lsn``: set on the message that leaves no transaction open (a Commit, Prepare, Commit
    / Rollback Prepared, a top-level Stream Commit / Prepare / Abort with no other streamed
    transaction open, or a non-transactional Message outside any transaction). Once this
    message and everything before it are durable, ``ack(ack_lsn)`` is safe: a restart from that
    position neither loses nor repeats a message.
    """

    protocol_version: int
    streaming: str
    in_stream: bool
    ack_lsn: int | None = None

    @property
    def parallel_streaming(self) -> bool:
        return self.streaming == "parallel"

    @property
    def codec_args(self) -> dict:
        """Keyword arguments for ``pgoutput_codec.decode``."""
        return {
            "protocol_version": self.protocol_version,
            "streaming": self.streaming,
            "in_stream": self.in_stream,
        }


class Change(NamedTuple):
    lsn: int  # the XLogData start LSN the server sent with it (0 for Relation / Type)
    payload: bytes
    context: Context


# pgoutput tags (first payload byte) that open or close transactions or stream blocks
_BEGIN, _BEGIN_PREPARE = ord(pgc.Begin.TAG), ord(pgc.BeginPrepare.TAG)
_ENDS_TXN = frozenset(
    ord(m.TAG) for m in (pgc.Commit, pgc.Prepare, pgc.CommitPrepared, pgc.RollbackPrepared)
)
_STREAM_START, _STREAM_STOP = ord(pgc.StreamStart.TAG), ord(pgc.StreamStop.TAG)
_STREAM_ABORT = ord(pgc.StreamAbort.TAG)
_STREAM_ENDS = frozenset(ord(m.TAG) for m in (pgc.StreamCommit, pgc.StreamPrepare, pgc.StreamAbort))
_MESSAGE = ord(pgc.Message.TAG)
_RELATION = ord(pgc.Relation.TAG)
_CHANGES = frozenset(ord(m.TAG) for m in (pgc.Insert, pgc.Update, pgc.Delete))
_CONTROL = frozenset({_BEGIN, _BEGIN_PREPARE, _STREAM_START, _STREAM_STOP, _MESSAGE})
_CONTROL |= _ENDS_TXN | _STREAM_ENDS


def record_flags(streaming: str) -> tuple[int, int]:
    """The capture record's flag byte outside and inside a stream block."""
    base = FLAG_PARALLEL if streaming == "parallel" else 0
    return base, base | FLAG_IN_STREAM


def check_failover(failover: bool, temporary: bool, server_major: int) -> None:
    """CaptureError (never retried) when a failover slot is asked of a server without them."""
    if not failover:
        return
    if server_major < 17:
        raise CaptureError(
            f"--failover needs PostgreSQL 17 or later (server is {server_major}): failover "
            "slots are synchronized to standbys from 17 on (fix: drop --failover)"
        )
    if temporary:
        raise CaptureError("--failover cannot be used with --temporary (a temporary slot "
                           "is never synchronized to a standby)")  # fmt: skip


def read_wait(fd: int) -> float:
    """How long :meth:`LogicalStream.read_records` lets data gather on the socket ``fd``
    before it reads: 10 ms over TCP, none over a Unix socket.

    The walsender sends each message with a ``send()`` of its own. Over TCP, a client that
    reads each one as it comes is woken once per message, and so is the server's side of the
    connection; left unread for 10 ms, the messages pile up in the socket and a read takes
    thousands. A 200,000-message backlog was durable after 0.56-0.59 s of a capture, against
    0.90-0.98 s at 2 ms and 1.23-1.25 s without a wait. A Unix socket holds only a few
    hundred small messages, because each counts with its whole buffer: a wait leaves the
    server blocked for most of it. The same backlog took 7.6 s at 10 ms, 1.0 s at 2 ms and
    0.61-0.63 s without a wait.
    """
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    except OSError:
        tcp = False
    return 0.01 if tcp else 0.0


class TransactionTracker:
    """Follows transactions and stream blocks through a slot's pgoutput messages, to give each
    message its ``in_stream`` context and to find the positions where acking is safe.

    Row messages are looked at by their tag byte alone; of the few control messages, only those
    that carry an xid the tracker needs (Stream Start, Stream Commit / Prepare / Abort) are
    decoded, with pgoutput_codec and gates resolved once."""

    def __init__(self, protocol_version: int, streaming: str):
        self.protocol_version = protocol_version
        self.streaming = streaming
        self.in_stream = False
        self.in_txn = False
        self.open_streams: set[int] = set()
        # the last position safe to ack (where the session started, until one comes): what a
        # Relation message is recorded at (pgoutput's walsender sends it at LSN 0)
        self.boundary = 0
        self._gates = pgc.PARAMS.resolve(protocol_version, streaming, False)
        self._ctx = {
            s: Context(protocol_version, streaming, s) for s in (False, True)
        }  # shared, immutable: most messages get one of these

    @property
    def quiescent(self) -> bool:
        return not (self.in_txn or self.open_streams or self.in_stream)

    def feed(self, lsn: int, payload) -> Context:
        tag = payload[0]
        if tag not in _CONTROL:
            return self._ctx[self.in_stream]
        inside = self.in_stream and tag != _STREAM_STOP  # a block's Start and Stop are outside
        ack = self.control(tag, lsn, payload)
        if ack is None:
            return self._ctx[inside]
        return Context(self.protocol_version, self.streaming, False, ack)

    def control(self, tag: int, lsn: int, payload) -> int | None:
        """Apply one control message (its tag is in ``_CONTROL``); returns the LSN that is safe
        to acknowledge once it and everything before it are durable, or None."""
        if tag == _STREAM_START:
            self.open_streams.add(self._decode(payload, lsn).xid)
            self.in_stream = True
            return None
        if tag == _STREAM_STOP:
            self.in_stream = False
            return None
        if tag == _BEGIN or tag == _BEGIN_PREPARE:
            self.in_txn = True
            return None
        if tag == _MESSAGE:
            if self.in_stream or self.in_txn or self.open_streams or not lsn:
                return None
            # A non-transactional message outside transactions. Its LSN is where its WAL
            # record ends, and decoding skips it when the record starts before the start
            # position: its LSN is a safe ack. Not one past it: a transaction whose commit
            # record follows the message's (one left open across it) commits there, and a
            # start past that skips it.
            self.boundary = lsn
            return lsn
        if tag in _ENDS_TXN:
            self.in_txn = False
        else:  # Stream Commit / Prepare / Abort
            msg = self._decode(payload, lsn)
            if tag != _STREAM_ABORT or msg.xid == msg.subxid:  # a subxact's abort ends nothing
                self.open_streams.discard(msg.xid)
        if self.in_txn or self.open_streams or self.in_stream:
            return None
        self.boundary = lsn
        return lsn

    def _decode(self, payload, lsn: int):
        try:
            return pgc.decode_gates(payload, *self._gates)
        except pgc.DecodeError as e:
            raise CaptureError(
                f"undecodable pgoutput message at LSN {format_lsn(lsn)}: {e} "
                f"(byte {e.offset}, {'.'.join(map(str, e.path))})"
            ) from None


@dataclass
class StreamStats:
    messages: int = 0
    bytes: int = 0
    received_lsn: int = 0  # highest XLogData start seen
    server_wal_end: int = 0  # from the latest XLogData or keepalive


# XLogData ("w"): tag, wal_start, wal_end, server_time, then the pgoutput message. The capture's
# hot path reads these 25 bytes with one struct and passes the payload on without building a
# message object; check_xlog_layout() proves the layout against replication_codec first.
XLOG_HEADER = Struct(">QQq")
XLOG_PAYLOAD_AT = 1 + XLOG_HEADER.size
# (watching changes, relations wanted) -> the messages (by first byte) the C read loop hands
# back to read_records' own: the controls, and Relation or change messages when asked for
_PYTHON_TAGS = {
    (watch, relations): bytes(
        t in _CONTROL or (relations and t == _RELATION) or (watch and t in _CHANGES)
        for t in range(256)
    )
    for watch in (False, True)
    for relations in (False, True)
}
_XLOG_LSNS = Struct(">QQ").unpack_from  # wal_start, wal_end
_XLOG_DATA = ord(replication_codec.XLogData.TAG)


def check_xlog_layout(rc, server_version: int) -> None:
    """Raise CaptureError unless replication_codec encodes and decodes XLogData exactly as
    :data:`XLOG_HEADER` reads it (the spec is the truth; this module only takes a shortcut)."""
    fields = dict(wal_start=0x0102030405060708, wal_end=0x1112131415161718,
                  server_time=0x2122232425262728)  # fmt: skip
    wire = rc.XLogData.TAG.encode() + XLOG_HEADER.pack(*fields.values()) + b"\xab"
    encoded = rc.encode(rc.XLogData(**fields, data=b"\xab"), server_version=server_version)
    decoded = rc.decode(wire, server_version=server_version)
    if encoded != wire or [getattr(decoded, k) for k in fields] != list(fields.values()):
        raise CaptureError(
            "replication_codec's XLogData layout is not the one pgcdc.capture.logical reads "
            "(fix: update XLOG_HEADER to the spec)"
        )


class SlotSession:
    """What both ways of reading a slot start from (this stream and the SQL interface's
    :class:`pgcdc.capture.sql.SqlSlotReader`, which take these options by keyword): the
    slot, the pgoutput options asked for (resolved against the server on open), whether to
    create the slot, where to start, and nothing read or acked yet."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        publications,
        *,
        protocol_version: int | None = None,
        binary: bool = False,
        streaming: str = "off",
        messages: bool = False,
        origin: str | None = None,
        two_phase: bool = False,
        create_slot: bool = False,
        temporary: bool = False,
        failover: bool = False,
        start_lsn: int = 0,
        resume_of: str | None = None,
        recorded_source: SourceIdentity | None = None,
    ):
        """``resume_of``: the capture directory ``start_lsn`` comes from, which
        :func:`pgcdc.capture.checks.check_resume` checks against this server and slot (with
        ``recorded_source``, the identity it recorded) before anything is streamed."""
        if isinstance(publications, str):
            publications = publications.split(",")
        self.dsn = dsn
        self.slot = slot
        self._requested = dict(
            publications=tuple(publications),
            protocol_version=protocol_version,
            binary=binary,
            streaming=streaming,
            messages=messages,
            origin=origin,
            two_phase=two_phase,
        )
        self.create_slot = create_slot
        self.temporary = temporary
        self.failover = failover  # a failover slot (17+): created so, or turned on
        self.health: SlotHealth | None = None  # the slot as open() found it (None: missing)
        self.start_lsn = start_lsn
        self.resume_of = resume_of
        self.recorded_source = recorded_source
        self.source: SourceIdentity | None = None  # this server's, known once open
        self.warnings: list[str] = []
        self.options: PluginOptions | None = None
        self.created_slot: SlotInfo | None = None
        self.stats = StreamStats()
        self.flushed_lsn = 0  # what the server was (or will be) told is durable
        self.conn = None
        # on_relation(lsn, payload, in_stream): called with each Relation message as it is
        # read, before its record can become durable (the capture records the catalog);
        # on_change(...) likewise with Inserts, Updates and Deletes while watching() is true
        # (a binary slot's reg* columns, whose OIDs the catalog names)
        self.on_relation = None
        self.on_change = None
        self.watching = bool
        # before_stream(session): called once the slot is checked and before it streams;
        # returns a later LSN to start from (what it read of the backlog), or None
        self.before_stream = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


class LogicalStream(SlotSession):
    """A logical replication session over the walsender protocol. ``open()`` (or ``with``)
    connects, optionally creates the slot and starts streaming from ``start_lsn`` (default:
    where the slot's confirmed position is)."""

    def __init__(
        self,
        dsn: str,
        slot: str,
        publications,
        *,
        status_interval: float = 10.0,
        auto_idle_ack: bool = True,
        confirm_limit=None,
        **options,
    ):
        """``options``: those of :class:`SlotSession` (protocol_version, binary, streaming,
        messages, origin, two_phase, create_slot, temporary, start_lsn). ``confirm_limit``:
        a function returning the LSN the server may be told at most (what a consumer
        downstream has made its own, such as sync's tables), or None when that is not known:
        the slot then keeps what was not yet confirmed."""
        super().__init__(dsn, slot, publications, **options)
        self.confirm_limit = confirm_limit
        self._confirmed = 0  # the flush position last sent
        streaming = self._requested["streaming"]
        self.conn: WalsenderConnection | None = None
        self.status_interval = status_interval
        self.auto_idle_ack = auto_idle_ack
        self.tracker: TransactionTracker | None = None
        self._last_ack_point = 0  # ack_lsn of the last yielded boundary
        self._dirty = False  # a message was yielded after the last boundary
        self._c_records = None  # pgcdc.capture.copyread's loop, bound to the connection
        self._idle_candidate: int | None = None
        self._next_status = 0.0
        self._rc = None
        self._rc_gates: tuple = ()
        self.close_timeout = 2.0  # seconds close() waits for the server to end the stream
        # read_records: seconds to wait once data arrives, before reading it (read_wait)
        self.read_delay = 0.0
        self._flags = record_flags(streaming)

    # -- set-up -----------------------------------------------------------------------------

    def open(self) -> LogicalStream:
        self._rc = rc = replication_codec
        self.conn = conn = WalsenderConnection.connect(self.dsn)
        try:
            check_xlog_layout(rc, conn.server_version)
            self._rc_gates = rc.PARAMS.resolve(conn.server_version)
            req = dict(self._requested)
            if req["protocol_version"] is None:
                req["protocol_version"] = max_protocol_version(conn.server_version)
            self.options = PluginOptions(**req)
            try:
                self.options.check(conn.server_version)
            except ValueError as e:
                raise CaptureError(str(e)) from None
            self.system = sysinfo = conn.identify_system()
            check_failover(self.failover, self.temporary, conn.server_version)
            # an invalidated slot first: it is why a resume cannot work, whatever else is off
            health = check_slot_valid(conn.execute, self.slot, self.resume_of,
                                      self.start_lsn if self.resume_of else None)  # fmt: skip
            self.health = health if health.exists else None
            if self.resume_of is not None:
                here = current_identity(sysinfo.system_id, sysinfo.timeline, sysinfo.dbname,
                                        self.slot, self.recorded_source, None)  # fmt: skip
                warning = check_resume(conn.execute, self.resume_of, self.recorded_source, here,
                                       self.start_lsn, sysinfo.xlogpos,
                                       temporary=self.temporary)  # fmt: skip
                self.warnings += [warning] if warning else []
            preflight(conn.execute, self.slot, self.options.publications, self.create_slot)
            if self.create_slot and not self._slot_exists():
                self.created_slot = conn.create_slot(
                    self.slot,
                    temporary=self.temporary,
                    two_phase=self.options.two_phase,
                    failover=self.failover,
                )
            elif self.failover and self.health is not None and not self.health.failover:
                conn.alter_slot_failover(self.slot, True)
            self.source = current_identity(sysinfo.system_id, sysinfo.timeline, sysinfo.dbname,
                                           self.slot, self.recorded_source,
                                           self.created_slot)  # fmt: skip
            self.tracker = TransactionTracker(self.options.protocol_version, self.options.streaming)
            self._flags = record_flags(self.options.streaming)
            if self.before_stream is not None:  # the runner's catch-up (capture.catchup)
                ahead = self.before_stream(self)
                if ahead is not None and ahead > self.start_lsn:
                    self.start_lsn = ahead
            self.tracker.boundary = self.start_lsn
            try:
                conn.start_replication(self.slot, self.start_lsn, self.options.as_list())
            except CaptureError as e:
                if e.sqlstate == "55000":  # invalidated since the check? say so, not the hint
                    check_slot_valid(conn.execute, self.slot, self.resume_of,
                                     self.start_lsn if self.resume_of else None)  # fmt: skip
                raise
        except BaseException:
            self.close()
            raise
        self.flushed_lsn = max(self.flushed_lsn, self.start_lsn)
        self._c_records = c_records(self.conn.pgconn)  # the read loop in C, where it can be
        self.read_delay = read_wait(self.conn.pgconn.socket)
        self._last_ack_point = self.flushed_lsn
        self._dirty = False
        self._next_status = time.monotonic() + self.status_interval
        return self

    def _slot_exists(self) -> bool:
        name = self.slot.replace("'", "''")
        rows = self.conn.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{name}'")
        return bool(rows)

    def close(self) -> None:
        if self.conn is not None:
            if self.conn.copying:
                try:  # a last status update, so the server knows what is durable
                    self.send_status()
                except CaptureError:
                    pass
                else:  # end the stream, so the server has taken it in when close() returns
                    self.conn.end_copy(self.close_timeout)
            self.conn.close()
            self.conn = None

    # -- reading ----------------------------------------------------------------------------

    def __iter__(self):
        while True:
            change = self.read(1.0)
            if change is not None:
                yield change

    def read(self, timeout: float) -> Change | None:
        """The next change, or None when nothing arrived within ``timeout`` seconds."""
        conn, stats = self.conn, self.stats
        deadline = None
        while True:
            buf = conn.read(0 if deadline is None else max(0.0, deadline - time.monotonic()))
            if buf is None:
                if deadline is None:
                    deadline = time.monotonic() + timeout
                    self._maybe_status()
                    continue
                self._maybe_status()
                return None
            if buf[0] != _XLOG_DATA:
                self._other(buf)
                continue
            lsn, wal_end = _XLOG_LSNS(buf, 1)
            payload = bytes(buf[XLOG_PAYLOAD_AT:])
            ctx = self.tracker.feed(lsn, payload)
            stats.messages += 1
            stats.bytes += len(payload)
            if lsn > stats.received_lsn:
                stats.received_lsn = lsn
            if wal_end > stats.server_wal_end:
                stats.server_wal_end = wal_end
            if ctx.ack_lsn is None:
                self._dirty = True
            else:
                self._dirty = False
                self._last_ack_point = ctx.ack_lsn
            self._idle_candidate = None
            if stats.messages & 255 == 0:
                self._maybe_status()
            return Change(lsn, payload, ctx)

    def read_records(
        self, out: bytearray, timeout: float, max_bytes: int = 1 << 20, until: int | None = None
    ) -> tuple[int, int, int]:
        """The capture's fast path: append every message that has arrived to ``out`` as capture
        records (the segment format: protocol version, flags, LSN, length, payload), waiting up
        to ``timeout`` seconds for the first. Stops once ``max_bytes`` were appended, or at the
        first ack-safe position at or past ``until``.

        Returns ``(messages, end, ack_lsn)``: ``out[:end]`` ends with the last record after
        which acking ``ack_lsn`` is safe (``end`` is -1 when no such record was appended).
        Keepalives are answered and status updates sent as in :meth:`read`."""
        pgconn = self.conn.pgconn
        get = pgconn.get_copy_data
        tracker = self.tracker
        control = tracker.control
        controls = _CONTROL
        flags = self._flags
        flag = flags[tracker.in_stream]
        pv = self.options.protocol_version
        header = RECORD_HEADER.pack
        lsns = _XLOG_LSNS
        at = XLOG_PAYLOAD_AT
        start = len(out)
        limit = start + max_bytes
        stop_at = until if until is not None else 1 << 64
        count = 0
        end = -1
        ack = 0
        hi = 0
        wal_end = 0
        dirty = self._dirty
        since_keepalive = 0  # messages before the last keepalive of this call
        on_relation, on_change = self.on_relation, self.on_change
        watch = on_change is not None and self.watching()
        changes = _CHANGES
        consumed = waited = False
        fast = self._c_records
        while True:
            try:
                if fast is None:
                    n, buf = get(1)
                else:  # the plain records in C; what needs this loop comes back as `buf`
                    n, c, h, w, buf = fast(out, limit, pv, flag, _PYTHON_TAGS[watch, on_relation is not None])  # fmt: skip
                    if c:
                        count += c
                        dirty = True
                        consumed = False
                        hi = max(hi, h)
                        wal_end = w
                    if n == 2:
                        break  # limit
                    if n == 1:
                        n = len(buf)
                if n > 0:
                    consumed = False
                    if buf[0] != _XLOG_DATA:
                        self._dirty = dirty
                        self._other(buf)
                        since_keepalive = count
                        continue
                    lsn, wal_end = lsns(buf, 1)
                    if lsn > hi:
                        hi = lsn
                    count += 1
                    tag = buf[at]
                    if tag in controls:
                        safe = control(tag, lsn, buf[at:])
                        if tag == _MESSAGE and flag == flags[0] and is_heartbeat(buf[at:]):
                            pass  # a heartbeat (--messages): its position, not its record
                        else:
                            out += header(pv, flag if tag != _STREAM_STOP else flags[0], lsn,
                                          n - at)  # fmt: skip
                            out += buf[at:]
                        flag = flags[tracker.in_stream]
                        if safe is not None:
                            end = len(out)
                            ack = safe
                            dirty = False
                            if safe >= stop_at:
                                break
                            continue
                    else:
                        out += header(pv, flag, lsn, n - at)
                        out += buf[at:]
                        if tag == _RELATION and on_relation is not None:
                            on_relation(tracker.boundary, bytes(buf[at:]), tracker.in_stream)
                            watch = on_change is not None and self.watching()
                        elif watch and tag in changes:
                            on_change(lsn, bytes(buf[at:]), tracker.in_stream)
                    dirty = True
                    if len(out) >= limit:
                        break
                    continue
                if n < 0:
                    raise self.conn._stream_error(None)
                # no whole message in libpq's buffer: read what the socket has, else wait
                if not consumed:
                    pgconn.consume_input()
                    consumed = True
                    continue
                if count or waited:
                    break
                waited = True
                if not select.select([pgconn.socket], [], [], timeout)[0]:
                    break
                if self.read_delay:  # let the server's messages gather: one read takes many
                    time.sleep(self.read_delay)
                pgconn.consume_input()
            except CaptureError:
                raise
            except Exception as exc:  # psycopg's OperationalError: the connection broke
                raise self.conn._stream_error(str(exc)) from None
        stats = self.stats
        if count > since_keepalive:  # an idle position is stale once messages follow it
            self._idle_candidate = None
        if count:
            stats.messages += count
            stats.bytes += len(out) - start - count * RECORD_HEADER.size
            if hi > stats.received_lsn:
                stats.received_lsn = hi
            if wal_end > stats.server_wal_end:
                stats.server_wal_end = wal_end
        if end >= 0:
            self._last_ack_point = ack
        self._dirty = dirty
        if time.monotonic() >= self._next_status:
            self.send_status()
        return count, end, ack

    def _other(self, buf) -> None:
        """A CopyData message other than XLogData: decoded with replication_codec."""
        try:
            msg = self._rc.decode_gates(buf, *self._rc_gates)
        except self._rc.DecodeError as e:
            raise CaptureError(f"undecodable replication message: {e}") from None
        if type(msg) is self._rc.PrimaryKeepalive:
            self._keepalive(msg)
        # anything else a walsender may add later is not ours to interpret

    def _keepalive(self, msg) -> None:
        if msg.wal_end > self.stats.server_wal_end:
            self.stats.server_wal_end = msg.wal_end
        if self.tracker.quiescent and not self._dirty:
            # Everything the server decoded before wal_end has been sent and nothing is open:
            # once the last boundary is acked, wal_end is a safe ack too (as pg_recvlogical does).
            self._idle_candidate = msg.wal_end
            if self.auto_idle_ack and self.idle_lsn is not None:
                self.flushed_lsn = max(self.flushed_lsn, msg.wal_end)
        if msg.reply_requested:
            self.send_status()

    @property
    def idle_lsn(self) -> int | None:
        """A keepalive's WAL end that may be acked now: nothing was sent after the last
        boundary, and that boundary is acked. None otherwise."""
        c = self._idle_candidate
        if c is None or c <= self.flushed_lsn or self.flushed_lsn < self._last_ack_point:
            return None
        return c

    # -- acknowledging ----------------------------------------------------------------------

    def ack(self, lsn: int) -> None:
        """Everything up to ``lsn`` (a Context.ack_lsn or idle_lsn) is durable on our side."""
        if lsn > self.flushed_lsn:
            self.flushed_lsn = lsn
            if self.auto_idle_ack and (idle := self.idle_lsn) is not None:
                self.flushed_lsn = idle

    def send_status(self, reply_requested: bool = False) -> None:
        rc = self._rc
        flushed = self.flushed_lsn
        if self.confirm_limit is not None:
            limit = self.confirm_limit()
            idle = self._idle_candidate
            if (
                limit is not None
                and idle is not None
                and limit >= self._last_ack_point
                and not self._dirty
                and self.tracker.quiescent
            ):
                # everything received is downstream, and the server has sent all it decoded
                # up to idle: nothing of the slot's lies between, so downstream holds that
                # far too. Confirming it lets restart_lsn pass the running-transactions
                # record a checkpoint logged after a burst: stopped at the burst's end, the
                # next walsender decoded the whole burst again (34 MB, 0.2-0.3 s)
                limit = max(limit, idle)
            flushed = max(
                self._confirmed, min(flushed, self._confirmed if limit is None else limit)
            )
            self._confirmed = flushed  # 0 (not yet known) tells the server nothing
        msg = rc.StandbyStatusUpdate(
            written_lsn=max(flushed, self.stats.received_lsn),
            flushed_lsn=flushed,
            applied_lsn=flushed,
            client_time=pg_now_us(),
            reply_requested=1 if reply_requested else 0,  # a Byte1 on the wire, not a bool
        )
        self.conn.send(rc.encode(msg, server_version=self.conn.server_version))
        self._next_status = time.monotonic() + self.status_interval

    def _maybe_status(self) -> None:
        if time.monotonic() >= self._next_status:
            self.send_status()
