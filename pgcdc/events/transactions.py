"""Transaction assembly: which changes belong to which committed transaction, and when.

The cases, as pgoutput sends them:

* Begin ... Commit: a whole transaction, sent at its commit. Its changes are emitted as they
  arrive (the commit LSN is known from Begin), so a huge non-streamed transaction costs no
  memory.
* Stream Start(xid) ... Stream Stop blocks (protocol 2+): an uncommitted transaction, sent in
  pieces interleaved with other transactions. Each change carries its (sub)transaction's xid.
  Buffered per top-level xid until Stream Commit releases it (streams commit in order);
  Stream Abort of a subtransaction drops that subtransaction's changes, of the top xid all of
  them. PostgreSQL 18 may send a Stream Abort for a transaction that was never streamed
  (already committed whole): it is legal and ignored.
* Two-phase: Begin Prepare ... Prepare (or a streamed transaction ended by Stream Prepare) is
  held by its gid until Commit Prepared releases it or Rollback Prepared drops it.
* Logical messages: a transactional one is a change of its transaction; a non-transactional
  one is emitted at once, on its own.

Relation and Type messages update the relation cache when they arrive (in a stream too); a
buffered change remembers the cache epoch it arrived in and is typed with that version.
"""

from __future__ import annotations

import struct

import pgoutput_codec as pgc

from pgoutput_codec._decoder import decode_tuple

from pgcdc.errors import DataError
from pgcdc.lsn import format_lsn
from pgcdc.events.relations import RelationCache, UnknownRelation
from pgcdc.events.spill import MemoryBudget, TransactionBuffer

TAG_NAMES = {bytes([cls.TAG.encode()[0]]): cls.__name__ for cls in pgc.MESSAGE_TYPES}


class ProtocolOrderError(DataError, ValueError):
    """A message that cannot come where it came (e.g. a change outside any transaction)."""


class ChangeStreamError(DataError, ValueError):
    """The message stream cannot be turned into events: which message, where, and why."""

    def __init__(self, index: int, lsn: int, message: str, reason: str):
        self.index = index
        self.lsn = lsn
        self.message_name = message
        self.reason = reason
        super().__init__(f"message {index} ({message}) at LSN {format_lsn(lsn)}: {reason}")


class Txn:
    """One transaction being assembled (mutable; the events copy what they need)."""

    __slots__ = (
        "xid",
        "commit_lsn",
        "commit_time",
        "origin",
        "ordinal",
        "gid",
        "buffer",
        "gates",
        "first_index",
        "first_lsn",
    )

    def __init__(self, xid, commit_lsn=None, commit_time=None, *, index=0, lsn=0):
        self.xid = xid
        self.commit_lsn = commit_lsn
        self.commit_time = commit_time
        self.origin = None
        self.ordinal = 0  # events emitted so far; the next change gets ordinal + 1
        self.gid = None
        self.buffer: TransactionBuffer | None = None
        self.gates = None  # decoding parameters of its buffered changes
        self.first_index = index
        self.first_lsn = lsn


_XID_OID = struct.Struct(">II")  # a streamed Insert/Update/Delete: tag, xid, relation OID
_CHANGE_TYPES = frozenset((pgc.Insert, pgc.Update, pgc.Delete, pgc.Truncate, pgc.Message))


class Assembler:
    """The transaction state machine. ``feed`` returns the events a message releases."""

    def __init__(
        self,
        relations: RelationCache,
        factory,
        budget: MemoryBudget,
        *,
        transaction_events: bool = False,
    ):
        self.relations = relations
        self.factory = factory
        self.budget = budget
        self.transaction_events = transaction_events
        self.plain: Txn | None = None  # Begin ... Commit: events go out at once
        self.preparing: Txn | None = None  # Begin Prepare ... Prepare: buffered
        self.block: Txn | None = None  # inside Stream Start ... Stream Stop
        self.streams: dict[int, Txn] = {}  # open streamed transactions by top xid
        self.prepared: dict[str, Txn] = {}  # prepared, waiting for COMMIT/ROLLBACK PREPARED
        self.stray_aborts = 0  # Stream Aborts for transactions never streamed (PG 18)
        self._handlers = {
            pgc.Begin: self._begin,
            pgc.Commit: self._commit,
            pgc.Origin: self._origin,
            pgc.Relation: self._relation,
            pgc.Type: self._type,
            pgc.StreamStart: self._stream_start,
            pgc.StreamStop: self._stream_stop,
            pgc.StreamCommit: self._stream_commit,
            pgc.StreamAbort: self._stream_abort,
            pgc.StreamPrepare: self._stream_prepare,
            pgc.BeginPrepare: self._begin_prepare,
            pgc.Prepare: self._prepare,
            pgc.CommitPrepared: self._commit_prepared,
            pgc.RollbackPrepared: self._rollback_prepared,
        }

    # -- the per-message entry point ------------------------------------------------------

    def feed(self, index: int, lsn: int, gates: tuple, data: bytes, msg):
        """The events message ``index`` releases (None when it releases none). ``gates`` are
        the decoding parameters it came with (``pgoutput_codec.PARAMS.resolve``), ``data``
        its bytes (kept as they are when the change is buffered)."""
        cls = type(msg)
        if cls in _CHANGE_TYPES:
            if cls is pgc.Message and not msg.flags & 1:
                return [self.factory.non_transactional(msg, lsn)]
            txn = self.plain
            if txn is not None:
                if txn.ordinal == 0 and self.transaction_events:
                    begin = self.factory.begin(txn, lsn)
                    return [begin, *self.factory.change(msg, lsn, None, txn)]
                return self.factory.change(msg, lsn, None, txn)
            return self._buffer(index, lsn, msg, data)
        return self._handlers[cls](index, lsn, gates, msg)

    def _open_context(self) -> str | None:
        if self.plain is not None:
            return f"transaction {self.plain.xid} (Begin at message {self.plain.first_index})"
        if self.preparing is not None:
            return (
                f"prepared transaction {self.preparing.xid} "
                f"(Begin Prepare at message {self.preparing.first_index})"
            )
        if self.block is not None:
            return (
                f"a stream block of transaction {self.block.xid} "
                f"(Stream Start at message {self.block.first_index})"
            )
        return None

    def _require_closed(self, what: str) -> None:
        ctx = self._open_context()
        if ctx is not None:
            raise ProtocolOrderError(f"{what} inside {ctx}, which has not ended")

    # -- changes that wait for their commit --------------------------------------------------

    def _buffer(self, index, lsn, msg, data):
        if self.block is not None:
            txn = self.block
            subxid = msg.xid
        elif self.preparing is not None:
            txn = self.preparing
            subxid = txn.xid
        else:
            raise ProtocolOrderError(
                f"a {type(msg).__name__} outside any transaction (no Begin, Begin Prepare or "
                "Stream Start before it)"
            )
        if not self.factory.lenient:
            # fail where the change arrived, not later at its commit
            oids = (
                msg.relation_oids
                if type(msg) is pgc.Truncate
                else (() if type(msg) is pgc.Message else (msg.relation_oid,))
            )
            for oid in oids:
                self.relations.get(oid)
        txn.buffer.append(subxid, index, lsn, self.relations.epoch, data)
        return None

    def buffer_stream_change(self, index: int, lsn: int, data) -> bool:
        """Buffer an Insert/Update/Delete that arrived inside a stream block without decoding
        it: its xid and relation OID are at fixed offsets after the tag, and the whole
        message is decoded (and checked) once, when its transaction commits. False when
        this does not apply (no open block, too short): decode it and feed() instead."""
        txn = self.block
        if txn is None or len(data) < 9:
            return False
        subxid, oid = _XID_OID.unpack_from(data, 1)
        if not self.factory.lenient:
            self.relations.get(oid)  # fail where the change arrived, not at its commit
        txn.buffer.append(subxid, index, lsn, self.relations.epoch, data)
        return True

    def _release(self, txn: Txn):
        """Generator: the events of a buffered transaction, then its buffer is freed."""
        factory = self.factory
        gates = txn.gates
        begin_pending = self.transaction_events
        try:
            for _subxid, index, lsn, epoch, data in txn.buffer:
                try:
                    msg = decode_tuple(data, gates)
                except pgc.DecodeError as e:
                    name = TAG_NAMES.get(bytes(data[:1]), "message")
                    raise ChangeStreamError(index, lsn, name, f"does not decode: {e}") from e
                try:
                    evs = factory.change(msg, lsn, epoch, txn)
                except (KeyError, ValueError, TypeError) as e:
                    reason = _reason(e)
                    raise ChangeStreamError(index, lsn, type(msg).__name__, reason) from e
                if begin_pending:
                    yield factory.begin(txn, lsn)
                    begin_pending = False
                yield from evs
            if self.transaction_events:
                if begin_pending:
                    yield factory.begin(txn, txn.commit_lsn)
                yield factory.end(txn)
        finally:
            txn.buffer.close()

    # -- plain transactions ---------------------------------------------------------------

    def _begin(self, index, lsn, gates, msg):
        self._require_closed("Begin")
        self.plain = Txn(msg.xid, msg.final_lsn, msg.commit_time, index=index, lsn=lsn)
        return None

    def _commit(self, index, lsn, gates, msg):
        txn = self.plain
        if txn is None:
            raise ProtocolOrderError("Commit without a Begin before it")
        if msg.commit_lsn != txn.commit_lsn:
            raise ProtocolOrderError(
                f"Commit's commit_lsn {format_lsn(msg.commit_lsn)} differs from the final_lsn "
                f"{format_lsn(txn.commit_lsn)} its Begin (message {txn.first_index}) announced"
            )
        self.plain = None
        if self.transaction_events:
            if txn.ordinal == 0:
                return [self.factory.begin(txn, txn.commit_lsn), self.factory.end(txn)]
            return [self.factory.end(txn)]
        return None

    def _origin(self, index, lsn, gates, msg):
        txn = self.plain or self.preparing or self.block
        if txn is None:
            raise ProtocolOrderError("Origin outside any transaction")
        txn.origin = msg.origin_name
        return None

    def _relation(self, index, lsn, gates, msg):
        if self._open_context() is None:
            raise ProtocolOrderError("Relation outside any transaction")
        self.relations.on_relation(msg)
        return None

    def _type(self, index, lsn, gates, msg):
        if self._open_context() is None:
            raise ProtocolOrderError("Type outside any transaction")
        self.relations.on_type(msg)
        return None

    # -- streamed transactions ----------------------------------------------------------------

    def _stream_start(self, index, lsn, gates, msg):
        self._require_closed("Stream Start")
        txn = self.streams.get(msg.xid)
        if msg.first_segment:
            if txn is not None:
                raise ProtocolOrderError(
                    f"Stream Start with first_segment = 1 for transaction {msg.xid}, which "
                    f"already streamed (from message {txn.first_index})"
                )
            txn = Txn(msg.xid, index=index, lsn=lsn)
            txn.buffer = TransactionBuffer(self.budget)
            txn.gates = (gates[0], True, gates[2])  # its changes come in stream blocks
            self.streams[msg.xid] = txn
        elif txn is None:
            raise ProtocolOrderError(
                f"Stream Start continues transaction {msg.xid}, whose first block "
                "(first_segment = 1) is not in the input: read from the slot's start"
            )
        self.block = txn
        return None

    def _stream_stop(self, index, lsn, gates, msg):
        if self.block is None:
            raise ProtocolOrderError("Stream Stop without a Stream Start before it")
        self.block = None
        return None

    def _stream_txn(self, what, xid) -> Txn:
        self._require_closed(what)
        txn = self.streams.pop(xid, None)
        if txn is None:
            raise ProtocolOrderError(f"{what} for transaction {xid}, which no Stream Start opened")
        return txn

    def _stream_commit(self, index, lsn, gates, msg):
        txn = self._stream_txn("Stream Commit", msg.xid)
        txn.commit_lsn = msg.commit_lsn
        txn.commit_time = msg.commit_time
        return self._release(txn)

    def _stream_abort(self, index, lsn, gates, msg):
        self._require_closed("Stream Abort")
        txn = self.streams.get(msg.xid)
        if txn is None:
            self.stray_aborts += 1  # PG 18: a transaction that was sent whole, or never here
            return None
        if msg.subxid == msg.xid:
            del self.streams[msg.xid]
            txn.buffer.close()
        else:
            txn.buffer.abort_subxact(msg.subxid)
        return None

    def _stream_prepare(self, index, lsn, gates, msg):
        txn = self._stream_txn("Stream Prepare", msg.xid)
        self._hold(txn, msg.gid)
        return None

    # -- two-phase -----------------------------------------------------------------------------

    def _hold(self, txn: Txn, gid: str) -> None:
        if gid in self.prepared:
            raise ProtocolOrderError(f"gid {gid!r} is prepared twice without a commit or rollback")
        txn.gid = gid
        self.prepared[gid] = txn

    def _begin_prepare(self, index, lsn, gates, msg):
        self._require_closed("Begin Prepare")
        txn = Txn(msg.xid, index=index, lsn=lsn)
        txn.gid = msg.gid
        txn.buffer = TransactionBuffer(self.budget)
        txn.gates = gates
        self.preparing = txn
        return None

    def _prepare(self, index, lsn, gates, msg):
        txn = self.preparing
        if txn is None:
            raise ProtocolOrderError("Prepare without a Begin Prepare before it")
        if msg.gid != txn.gid:
            raise ProtocolOrderError(
                f"Prepare for gid {msg.gid!r} inside Begin Prepare of gid {txn.gid!r}"
            )
        self.preparing = None
        self._hold(txn, msg.gid)
        return None

    def _commit_prepared(self, index, lsn, gates, msg):
        self._require_closed("Commit Prepared")
        txn = self.prepared.pop(msg.gid, None)
        if txn is None:
            raise ProtocolOrderError(
                f"Commit Prepared for gid {msg.gid!r}, which no Prepare or Stream Prepare in "
                "the input held: read from the slot's start"
            )
        txn.commit_lsn = msg.commit_lsn
        txn.commit_time = msg.commit_time
        return self._release(txn)

    def _rollback_prepared(self, index, lsn, gates, msg):
        self._require_closed("Rollback Prepared")
        txn = self.prepared.pop(msg.gid, None)
        if txn is not None:  # nothing held means nothing to drop
            txn.buffer.close()
        return None

    # -- the end of the input --------------------------------------------------------------

    def pending(self) -> str | None:
        held = []
        if self.preparing is not None:
            held.append(
                f"prepared transaction {self.preparing.xid} without its Prepare "
                f"(Begin Prepare at message {self.preparing.first_index})"
            )
        if self.streams:
            held.append(
                f"{len(self.streams)} streamed transaction(s) without Stream Commit/Abort "
                f"(xids {sorted(self.streams)[:5]})"
            )
        if self.prepared:
            held.append(
                f"{len(self.prepared)} prepared transaction(s) awaiting COMMIT/ROLLBACK PREPARED "
                f"(gids {sorted(self.prepared)[:5]})"
            )
        parts = []
        if held:
            parts.append("; ".join(held) + ": held, none of their changes were emitted")
        if self.plain is not None:  # only a caller that reads past a commit boundary gets here
            txn = self.plain
            parts.append(
                f"the input ends inside transaction {txn.xid} (Begin at message "
                f"{txn.first_index}): its {txn.ordinal} change(s) read so far WERE emitted, "
                "without a commit (read captures through pgcdc.capture.files, which stops at the "
                "last commit)"
            )
        return "; ".join(parts) or None


def _reason(e: Exception) -> str:
    if isinstance(e, UnknownRelation):
        return f"a change for relation OID {e.args[0]}, which no Relation message has described"
    return str(e)
