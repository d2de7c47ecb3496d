"""Change events, and the driver that turns a slot's messages into them.

An :class:`Event` is one row change (or truncate, or logical message) of a committed
transaction, in Debezium's terms: ``op`` is c (insert), u (update), d (delete), t (truncate)
or m (logical message); ``before`` is the old image (REPLICA IDENTITY FULL) or the old key;
``after`` the new row. With ``transaction_events=True`` each transaction is framed by a
``begin`` and an ``end`` event.

Order: ``(commit_lsn, tx_ordinal)`` is a total order over a slot's events and the same on
every re-read, whether the transaction was streamed, prepared or sent whole: ``commit_lsn`` is
the LSN of the commit record (COMMIT PREPARED for two-phase), ``tx_ordinal`` counts the
transaction's events from 1 (its ``begin`` event is 0, its ``end`` event one past the last
change). A non-transactional logical message is its own unit: ``(its LSN, -1)``; pgoutput
sends the end of the message record as its LSN, which may be exactly where the next
transaction's commit record starts, and -1 sorts the message before that transaction.

Unchanged TOAST ('u' columns) is never NULL: the value is :data:`UNCHANGED` and the column is
listed in ``unchanged``. When REPLICA IDENTITY FULL sent the old row, the old value fills it
in (and the column is not listed); otherwise it is left out of ``after_dict()``.

Usage::

    from pgcdc.events import reader as events
    for ev in events.read_captures([path]):
        print(ev.op, ev.table, ev.after_dict())
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import groupby, repeat
from operator import itemgetter
from typing import NamedTuple

import pgoutput_codec as pgc
from pgoutput_codec._decoder import decode_tuple

from pgcdc.events import spill as spill_mod
from pgcdc.capture.chunks import ChangeRuns, is_chunk as _is_chunk, record_items
from pgcdc.capture.files import Captures, raw_chunks
from pgcdc.lsn import format_lsn
from pgcdc.events.relations import RelationCache, RelationInfo, UnknownRelation
from pgcdc.events.transactions import (
    TAG_NAMES,
    Assembler,
    ChangeStreamError,
    ProtocolOrderError,
    Txn,
)
from pgcdc.values import UNCHANGED, RawValue, RowLoader

__all__ = [
    "Event",
    "EventFactory",
    "ChangeStreamError",
    "ProtocolOrderError",
    "read_events",
    "read_captures",
    "live_events",
    "EventReader",
]


class Event(NamedTuple):
    """One change event. ``before``/``after`` are value tuples in the relation's column order
    (``before`` holds only the key columns when ``before_is_key``); use the ``*_dict()``
    methods for {name: value}."""

    op: str  # c u d t m, or begin / end (transaction framing, on request)
    relation: RelationInfo | None
    before: tuple | None
    after: tuple | None
    unchanged: tuple[str, ...]  # columns left out of `after` (unchanged TOAST, not filled)
    lsn: int  # the LSN the server sent with this message
    commit_lsn: int
    tx_ordinal: int
    commit_time: int | None  # microseconds since 2000-01-01 UTC, as on the wire
    xid: int | None  # the top-level transaction id
    origin: str | None
    before_is_key: bool = False
    # m: (prefix, content, transactional); t: (cascade, restart_identity); end: (event_count,)
    detail: tuple | None = None
    errors: tuple = ()  # lenient mode: why values stayed RawValue, or the relation is unknown

    @property
    def order_key(self) -> tuple[int, int]:
        return (self.commit_lsn, self.tx_ordinal)

    @property
    def schema(self) -> str | None:
        return None if self.relation is None else self.relation.schema

    @property
    def table(self) -> str | None:
        return None if self.relation is None else self.relation.table

    def before_names(self) -> tuple[str, ...]:
        rel = self.relation
        return rel.key_names if self.before_is_key else rel.names

    def before_dict(self) -> dict | None:
        if self.before is None:
            return None
        return dict(zip(self.before_names(), self.before))

    def after_dict(self) -> dict | None:
        """The new row; unchanged TOAST columns that were not filled are left out."""
        if self.after is None:
            return None
        if not self.unchanged:
            return dict(zip(self.relation.names, self.after))
        skip = set(self.unchanged)
        return {n: v for n, v in zip(self.relation.names, self.after) if n not in skip}

    def source(self) -> dict:
        """Debezium-style source block (LSNs as PostgreSQL prints them)."""
        return {
            "lsn": format_lsn(self.lsn),
            "commit_lsn": format_lsn(self.commit_lsn),
            "tx_ordinal": self.tx_ordinal,
            "commit_time": self.commit_time,
            "xid": self.xid,
            "origin": self.origin,
            "schema": self.schema,
            "table": self.table,
        }


class EventFactory:
    """Builds the events of one change message: resolves the relation and loads the values."""

    def __init__(self, relations: RelationCache, *, lenient: bool = False):
        self.relations = relations
        self.lenient = lenient

    def _relation(self, oid: int, epoch: int | None) -> RelationInfo:
        if epoch is None:
            return self.relations.get(oid)
        return self.relations.as_of(oid, epoch)

    def _unknown(self, oid: int, ncols: int) -> RelationInfo:
        names = tuple(f"${i + 1}" for i in range(ncols))
        return RelationInfo(
            oid,
            None,
            None,
            "unknown",
            names,
            (0,) * ncols,
            (-1,) * ncols,
            (),
            -1,
            RowLoader((0,) * ncols),
        )

    def _load(self, rel: RelationInfo, tup, errors: list):
        cols = tup.columns
        if rel.epoch < 0:  # lenient, unknown relation: the values as sent
            return tuple(_raw(c) for c in cols)
        if self.lenient:
            values, errs = rel.loader.load_lenient(cols)
            errors.extend(errs)
            return values
        if len(cols) != len(rel.names):
            raise ValueError(
                f"the tuple has {len(cols)} columns, relation {rel.qualified_name} "
                f"(OID {rel.oid}) has {len(rel.names)} per its last Relation message"
            )
        return rel.loader.load(cols)

    def begin(self, txn: Txn, lsn: int) -> Event:
        """``lsn`` is that of the transaction's first event (its commit when it has none),
        so the begin event is the same whether the transaction was streamed or not."""
        return Event(
            "begin",
            None,
            None,
            None,
            (),
            lsn,
            txn.commit_lsn,
            0,
            txn.commit_time,
            txn.xid,
            txn.origin,
        )

    def end(self, txn: Txn) -> Event:
        return Event(
            "end",
            None,
            None,
            None,
            (),
            txn.commit_lsn,
            txn.commit_lsn,
            txn.ordinal + 1,
            txn.commit_time,
            txn.xid,
            txn.origin,
            False,
            (txn.ordinal,),
        )

    def non_transactional(self, msg, lsn: int) -> Event:
        return Event(
            "m",
            None,
            None,
            None,
            (),
            lsn,
            msg.lsn,
            -1,  # before a transaction whose commit record starts at msg.lsn
            None,
            None,
            None,
            False,
            (msg.prefix, msg.content, False),
        )

    def change(self, msg, lsn: int, epoch: int | None, txn: Txn) -> list[Event] | tuple[Event]:
        """The events of an Insert/Update/Delete/Truncate/Message inside ``txn``."""
        cls = type(msg)
        if cls is pgc.Insert and not self.lenient:  # the common case, built directly
            rel = self._relation(msg.relation_oid, epoch)
            cols = msg.new_tuple.columns
            if len(cols) == len(rel.names):
                after = rel.loader.load(cols)
                txn.ordinal = ordinal = txn.ordinal + 1
                return (
                    tuple.__new__(
                        Event,
                        (
                            "c",
                            rel,
                            None,
                            after,
                            (),
                            lsn,
                            txn.commit_lsn,
                            ordinal,
                            txn.commit_time,
                            txn.xid,
                            txn.origin,
                            False,
                            None,
                            (),
                        ),
                    ),
                )
        if cls is pgc.Truncate:
            detail = (bool(msg.options & 1), bool(msg.options & 2))
            out = []
            for oid in msg.relation_oids:
                txn.ordinal += 1
                out.append(
                    Event(
                        "t",
                        self._relation(oid, epoch),
                        None,
                        None,
                        (),
                        lsn,
                        txn.commit_lsn,
                        txn.ordinal,
                        txn.commit_time,
                        txn.xid,
                        txn.origin,
                        False,
                        detail,
                    )
                )
            return out
        if cls is pgc.Message:
            txn.ordinal += 1
            return [
                Event(
                    "m",
                    None,
                    None,
                    None,
                    (),
                    lsn,
                    txn.commit_lsn,
                    txn.ordinal,
                    txn.commit_time,
                    txn.xid,
                    txn.origin,
                    False,
                    (msg.prefix, msg.content, True),
                )
            ]
        errors: list = []
        try:
            rel = self._relation(msg.relation_oid, epoch)
        except UnknownRelation:
            if not self.lenient:
                raise
            tup = msg.new_tuple if cls is not pgc.Delete else msg.old_tuple
            rel = self._unknown(msg.relation_oid, len(tup.columns))
            errors.append(
                f"unknown relation OID {msg.relation_oid}: no Relation message "
                "described it; values are raw"
            )
        before = None
        before_is_key = False
        unchanged = ()
        if cls is pgc.Insert:
            op = "c"
            after = self._load(rel, msg.new_tuple, errors)
        else:
            old = msg.old_tuple
            if old is not None:
                before = self._load(rel, old, errors)
                if msg.old_kind == "K":
                    before_is_key = True
                    before = tuple(before[i] for i in rel.key_indexes)
            if cls is pgc.Update:
                op = "u"
                after = self._load(rel, msg.new_tuple, errors)
                if UNCHANGED in after:
                    after, unchanged = _fill_unchanged(rel, after, before, before_is_key)
            else:
                op = "d"
                after = None
        txn.ordinal += 1
        return [
            Event(
                op,
                rel,
                before,
                after,
                unchanged,
                lsn,
                txn.commit_lsn,
                txn.ordinal,
                txn.commit_time,
                txn.xid,
                txn.origin,
                before_is_key,
                None,
                tuple(errors),
            )
        ]


def _column_wise(changes, rel: RelationInfo, p: int, m: int):
    """(before rows, after rows, before_is_key) of the changes p..p+m of one relation,
    loaded a column at a time, or None where only the message path gives the event: a
    relation loader without load_rows, tuples of another width, old tuples on some but not
    all, unchanged TOAST, a value that does not load (the message path says which)."""
    load_rows = getattr(rel.loader, "load_rows", None)
    if load_rows is None:
        return None
    width = len(rel.names)
    before = after = None
    before_is_key = False
    try:
        if changes.new is not None:
            block = changes.new.block(p, m, width)
            if block is None:
                return None
            after = load_rows(block[0], block[1], m)
            if after is None:
                return None
        old = changes.old
        if old is not None and not (changes.op == "u" and old.absent(p, m)):
            kinds = changes.old_kinds[p : p + m]
            kind = kinds[0]
            block = old.block(p, m, width)
            if block is None or kinds.count(kind) != m:
                return None
            before = load_rows(block[0], block[1], m)
            if before is None:
                return None
            if kind == "K":
                before_is_key = True
                keys = rel.key_indexes
                if len(keys) > 1:
                    before = list(map(itemgetter(*keys), before))
                else:
                    before = [tuple(row[i] for i in keys) for row in before]
    except Exception:  # noqa: BLE001 (the message path says which value, where)
        return None
    return before, after, before_is_key


class RawRun:
    """A run of one relation's Inserts, Updates (without old rows) or Deletes in one
    transaction, as the accelerator decoded them: values not loaded yet. Who keeps only
    some of the changes (apply's per-key combining) reads their keys from the raw values
    (:meth:`raw_keys`) and loads only the changes it keeps (:meth:`events`).

    Only runs that :func:`_column_wise` would load are raw: no unchanged TOAST, the width
    the relation has, one old-row kind. A value that does not load is reported (as the
    message path reports it) when a change holding it is loaded, and only then.
    """

    __slots__ = ("op", "rel", "kinds", "values", "before_is_key", "m", "width")
    # set by the reader: its first message's index, their LSNs, its first ordinal, the
    # transaction's (commit LSN, commit time, xid, origin), its messages' bytes; and the file
    __slots__ += ("index", "lsns", "first", "txn", "size", "path")

    @classmethod
    def of(cls, changes, rel: RelationInfo, p: int, m: int) -> RawRun | None:
        """The raw run of changes p..p+m of ``rel``, or None where it would not load
        column-wise."""
        if getattr(rel.loader, "load_rows", None) is None:
            return None
        width = len(rel.names)
        before_is_key = False
        if changes.op == "d":
            kinds = changes.old_kinds[p : p + m]
            if changes.old is None or kinds.count(kinds[0]) != m:
                return None
            before_is_key = kinds[0] == "K"
            block = changes.old.block(p, m, width)
        else:
            if changes.op == "u" and not changes.old.absent(p, m):
                return None  # old rows: key changes, REPLICA IDENTITY FULL
            block = changes.new.block(p, m, width)
        if block is None or "u" in block[0]:
            return None
        run = cls()
        run.op, run.rel, run.m, run.width = changes.op, rel, m, width
        run.kinds, run.values = block
        run.before_is_key = before_is_key
        run.path = None
        return run

    def raw_keys(self, positions: tuple[int, ...]) -> tuple[str, list] | None:
        """(format, the raw bytes of the columns at ``positions``: a list per column, an
        item per change), or None when a key column is not one format (t or b)
        throughout the run. Equal raw keys of one column type are equal values; unequal
        ones may still be equal values."""
        w = self.width
        kinds = self.kinds
        fmt = kinds[positions[0]]
        if fmt not in ("t", "b"):
            return None
        cols = []
        for k in positions:
            if kinds[k::w].count(fmt) != self.m:
                return None
            cols.append(self.values[k::w])
        return fmt, cols

    def flat(self, picks) -> tuple[list, list]:
        """(kinds, values) of the changes at ``picks`` (positions in the run, increasing),
        not loaded: each change's columns one after the other."""
        if len(picks) == self.m:
            return self.kinds, self.values
        w = self.width
        if not w:
            return [], []
        import numpy as np

        at = (np.array(picks)[:, None] * w + np.arange(w)).ravel().tolist()
        if len(at) == 1:
            return [self.kinds[at[0]]], [self.values[at[0]]]
        take = itemgetter(*at)
        return list(take(self.kinds)), list(take(self.values))

    def rows(self, picks) -> list[tuple]:
        """The rows (new, or old for deletes) of the changes at ``picks`` (positions in the
        run, increasing), loaded."""
        w = self.width
        if len(picks) == self.m:
            kinds, values = self.kinds, self.values
        elif len(picks) < SMALL_RUN or not w:  # column-wise costs about ten rows
            kinds = values = None
        else:
            kinds, values = self.flat(picks)
        rows = None
        if values is not None:
            try:
                rows = self.rel.loader.load_rows(kinds, values, len(picks))
            except Exception:  # noqa: BLE001 (a row at a time says which value, where)
                pass
        if rows is None:
            rows = [self._load_row(i) for i in picks]
        return rows

    def key_images(self, rows) -> list[tuple]:
        """Old rows of 'K' (key) kind as the events hold them: the key columns only."""
        keys = self.rel.key_indexes
        return [tuple(row[i] for i in keys) for row in rows]

    def events(self, picks=None) -> list[Event]:
        """The events of the changes at ``picks`` (positions in the run, increasing), or of
        all of them."""
        if picks is None:
            picks = range(self.m)
        rows = self.rows(picks)
        before = after = repeat(None)
        if self.op == "d":
            before = self.key_images(rows) if self.before_is_key else rows
        else:
            after = rows
        rel = self.rel
        commit_lsn, commit_time, xid, origin = self.txn
        lsns, first = self.lsns, self.first
        return [
            tuple.__new__(
                Event,
                (
                    self.op,
                    rel,
                    b,
                    a,
                    (),
                    lsns[i],
                    commit_lsn,
                    first + i,
                    commit_time,
                    xid,
                    origin,
                    self.before_is_key,
                    None,
                    (),
                ),
            )
            for i, b, a in zip(picks, before, after)
        ]

    def _load_row(self, i: int) -> tuple:
        w = self.width
        cols = [
            pgc.TupleColumn(kind=k, value=v)
            for k, v in zip(self.kinds[i * w : i * w + w], self.values[i * w : i * w + w])
        ]
        try:
            return self.rel.loader.load(cols)
        except ValueError as e:
            name = {"c": "Insert", "u": "Update", "d": "Delete"}[self.op]
            err = ChangeStreamError(self.index + i, self.lsns[i], name, str(e))
            if self.path is not None:  # the file it came from, as unit_parts says it
                raise ValueError(f"{self.path}: {err}") from e
            raise err from e


def _raw(col):
    kind = col.kind
    if kind == "n":
        return None
    if kind == "u":
        return UNCHANGED
    return RawValue(kind, col.value, 0)


def _fill_unchanged(rel, after, before, before_is_key):
    # Policy: the old image (REPLICA IDENTITY FULL) supplies unchanged TOAST values; whatever
    # it cannot supply stays UNCHANGED and is listed, so a consumer merges with its state.
    if before is not None and not before_is_key:
        after = tuple(
            b if (a is UNCHANGED and b is not UNCHANGED) else a for a, b in zip(after, before)
        )
    return after, tuple(n for n, v in zip(rel.names, after) if v is UNCHANGED)


# runs of fewer changes than this go a message at a time: loading a run column-wise has a
# fixed cost (its blocks, a loader pass per column) of about ten messages' worth
SMALL_RUN = 4


class EventReader:
    """Turns decoded messages into events; keeps the relation cache and open transactions.

    ``read(records)`` yields the events of an iterable of ``pgoutput_codec.capture.Record``;
    ``read_raw(items)`` the same for ``(gates, lsn, data)`` triples, as
    :func:`pgcdc.capture.files.iter_raw` reads them from a capture without building a Record per
    message. Either can be called again to continue the same stream. ``passed_over``:
    qualified names of tables whose values are not loaded (their events hold None for every
    value, and a value of theirs that would not load stops nothing): a run that applies
    other tables.
    """

    def __init__(
        self,
        *,
        transaction_events: bool = False,
        lenient: bool = False,
        memory_limit: int = spill_mod.DEFAULT_MEMORY_LIMIT,
        spill_dir: str | None = None,
        catalog=None,
        loader_factory=None,
        passed_over=frozenset(),
    ):
        self.relations = RelationCache(catalog=catalog, loader_factory=loader_factory,
                                       passed_over=passed_over)  # fmt: skip
        self.budget = spill_mod.MemoryBudget(memory_limit, spill_dir)
        self.factory = EventFactory(self.relations, lenient=lenient)
        self.assembler = Assembler(
            self.relations, self.factory, self.budget, transaction_events=transaction_events
        )
        self.index = 0
        self._runs = None

    def seed_relations(self, messages) -> EventReader:
        """Know these Relation messages (pgoutput_codec.Relation) before the input starts:
        what the capture recorded of relations whose messages are in files no longer read."""
        for msg in messages:
            self.relations.on_relation(msg)
        return self

    def read(self, records: Iterable) -> Iterator[Event]:
        return self._run(record_items(records))

    def read_raw(self, items: Iterable[tuple[tuple, int, bytes]]) -> Iterator[Event]:
        return self._run(iter(items))

    def read_chunks(self, items: Iterable) -> Iterator[Event]:
        """The same for what :func:`pgcdc.capture.files.iter_chunks` gives: :class:`~pgcdc.capture.chunks.Chunk`
        objects (many records, column-wise) and ``(gates, lsn, data)`` triples. Same events,
        same errors; runs of Inserts, Updates or Deletes in a Begin ... Commit transaction
        are decoded and loaded a column at a time."""
        for part in self.read_chunk_parts(items):
            yield from part

    def read_chunk_parts(self, items: Iterable, raw_runs: bool = False) -> Iterator:
        """:meth:`read_chunks` a part at a time: iterators of events (a run loaded
        column-wise is one), each to be used up before the next is taken, as it starts from
        the state (relations, transaction) the parts before it left. With ``raw_runs``, a
        run that would load column-wise comes as a :class:`RawRun` instead, its values not
        loaded yet (see there)."""
        for is_chunk, group in groupby(items, _is_chunk):
            if not is_chunk:
                yield self._run(group)
                continue
            for chunk in group:
                yield from self._parts(chunk, raw_runs)

    def _parts(self, chunk, raw_runs: bool = False) -> Iterator:
        """A chunk's events as consecutive iterators: message-at-a-time runs, and the
        events of runs of Inserts, Updates or Deletes loaded column-wise (or their
        :class:`RawRun`)."""
        runs = self._runs
        if runs is None:
            runs = self._runs = ChangeRuns.of()
        plan = runs.plan(chunk)
        if plan is None:  # no accelerator, no change outside a stream, or a record it declines
            yield self._run(chunk.triples(0, len(chunk.keys)))
            return
        types, spans = plan
        pos = 0
        for s, e, code, p in spans:
            if s > pos:
                yield self._run(chunk.triples(pos, s))
            pos = e
            txn = self.assembler.plain
            if txn is None or self.factory.lenient or (e - s < SMALL_RUN and not raw_runs):
                yield self._run(chunk.triples(s, e))
                continue
            if txn.ordinal == 0 and self.assembler.transaction_events:
                yield self._run(chunk.triples(s, s + 1))  # its begin event first
                s += 1
                p += 1
            changes = types[code]
            # one relation at a time (a transaction may interleave tables)
            for oid, same in groupby(changes.relation_oids[p : p + e - s]):
                m = len(list(same))
                rel = self.relations.current.get(oid)
                if raw_runs and rel is not None:
                    run = RawRun.of(changes, rel, p, m)
                    if run is not None:
                        run.index = self.index
                        run.lsns = chunk.lsns[s : s + m]
                        run.size = chunk.offsets[s + m] - chunk.offsets[s]
                        run.first = txn.ordinal + 1
                        run.txn = (txn.commit_lsn, txn.commit_time, txn.xid, txn.origin)
                        txn.ordinal += m
                        self.index += m
                        yield run
                        s += m
                        p += m
                        continue
                images = None if rel is None else _column_wise(changes, rel, p, m)
                if images is None:
                    yield self._run(chunk.triples(s, s + m))
                else:
                    before, after, before_is_key = images
                    first = txn.ordinal + 1
                    txn.ordinal += m
                    self.index += m
                    yield map(
                        tuple.__new__,
                        repeat(Event),
                        zip(
                            repeat(changes.op),
                            repeat(rel),
                            repeat(None) if before is None else before,
                            repeat(None) if after is None else after,
                            repeat(()),
                            chunk.lsns[s : s + m],
                            repeat(txn.commit_lsn),
                            range(first, first + m),
                            repeat(txn.commit_time),
                            repeat(txn.xid),
                            repeat(txn.origin),
                            repeat(before_is_key),
                            repeat(None),
                            repeat(()),
                        ),
                    )
                s += m
                p += m
        if pos < len(chunk.keys):
            yield self._run(chunk.triples(pos, len(chunk.keys)))

    def _run(self, items: Iterator) -> Iterator[Event]:
        # One loop for every message, with the common case inlined: an Insert inside a
        # Begin ... Commit transaction becomes its event here, without the assembler's
        # dispatch, a list per change or NamedTuple's keyword handling. Everything else
        # goes through Assembler.feed; both give identical events.
        feed = self.assembler.feed
        asm = self.assembler
        current = self.relations.current
        fast = not self.factory.lenient
        begins = asm.transaction_events
        new_event = tuple.__new__
        insert = pgc.Insert
        index = self.index
        buffer_stream_change = asm.buffer_stream_change
        for gates, lsn, data in items:
            if gates is not None and gates[1] and data[0] in _STREAMED_IUD:
                try:
                    if buffer_stream_change(index, lsn, data):
                        index += 1
                        self.index = index
                        continue
                except UnknownRelation as e:
                    raise ChangeStreamError(
                        index, lsn, _name_of(data), _unknown_relation(e.args[0])
                    ) from e
            try:
                msg = decode_tuple(data, gates)
            except Exception as e:
                raise _undecodable(index, lsn, gates, data, e) from e
            if type(msg) is insert and fast:
                txn = asm.plain
                rel = current.get(msg.relation_oid)
                if txn is not None and rel is not None and (txn.ordinal or not begins):
                    cols = msg.new_tuple.columns
                    if len(cols) == len(rel.names):
                        try:
                            after = rel.loader.load(cols)
                        except ValueError as e:
                            raise ChangeStreamError(index, lsn, "Insert", str(e)) from e
                        txn.ordinal = ordinal = txn.ordinal + 1
                        index += 1
                        self.index = index
                        yield new_event(
                            Event,
                            (
                                "c",
                                rel,
                                None,
                                after,
                                (),
                                lsn,
                                txn.commit_lsn,
                                ordinal,
                                txn.commit_time,
                                txn.xid,
                                txn.origin,
                                False,
                                None,
                                (),
                            ),
                        )
                        continue
            try:
                out = feed(index, lsn, gates, data, msg)
            except ChangeStreamError:
                raise
            except ProtocolOrderError as e:
                raise ChangeStreamError(index, lsn, type(msg).__name__, str(e)) from e
            except UnknownRelation as e:
                raise ChangeStreamError(
                    index, lsn, type(msg).__name__, _unknown_relation(e.args[0])
                ) from e
            except (ValueError, TypeError) as e:
                raise ChangeStreamError(index, lsn, type(msg).__name__, str(e)) from e
            index += 1
            self.index = index
            if out is not None:
                yield from out

    def pending(self) -> str | None:
        """A sentence about transactions still open at the end of the input, or None."""
        return self.assembler.pending()


# tags of the changes buffered undecoded inside a stream
_STREAMED_IUD = frozenset(ord(m.TAG) for m in (pgc.Insert, pgc.Update, pgc.Delete))


def _unknown_relation(oid: int) -> str:
    return (
        f"a change for relation OID {oid}, which no Relation message has described: read "
        "the capture from the slot's start (all segments), or use --lenient to get raw values"
    )


def _undecodable(index: int, lsn: int, gates, data, err: Exception) -> ChangeStreamError:
    if gates is None:  # a record with bad parameters: its decode() says what is wrong
        try:
            data.decode()
        except pgc.DecodeError as e:
            err = e
        return ChangeStreamError(index, lsn, "record", f"does not decode: {err}")
    return ChangeStreamError(index, lsn, _name_of(data), f"does not decode: {err}")


def read_events(records: Iterable, **options) -> Iterator[Event]:
    """Events of a slot's records in order (see :class:`EventReader` for the options)."""
    return EventReader(**options).read(records)


def read_captures(paths: Iterable, **options) -> Iterator[Event]:
    """Events of capture files and capture directories, read one after the other as one
    stream, the fast way (:func:`pgcdc.capture.files.iter_all_chunks` into
    :meth:`EventReader.read_chunks`; see :class:`EventReader` for the options)."""
    captures = Captures.open(paths).logged()
    return captures_reader(captures, **options).read_chunks(captures.chunks())


def captures_reader(captures, **options) -> EventReader:
    """An :class:`EventReader` for ``captures`` (a :class:`pgcdc.capture.files.Captures`): with the
    catalog the capture recorded (unless ``catalog`` is given) and the relations it recorded
    before the first record read."""
    if options.get("catalog") is None:
        options = {**options, "catalog": captures.catalog}
    return EventReader(**options).seed_relations(captures.known_relations())


def live_events(
    stream, *, timeout: float = 1.0, reader: EventReader | None = None, **options
) -> Iterator[tuple[Iterator[Event], int | None]]:
    """Change events from an open :class:`pgcdc.capture.logical.LogicalStream`, a batch at a
    time, read the fast way: ``read_records`` lays the messages that have arrived out as
    capture records, which are read in chunks. Yields ``(events, ack_lsn)``: ``events`` is an
    iterator (a streamed transaction's commit releases all its changes at once: they come
    from the spill one by one, never all in memory); pass ``ack_lsn`` (when not None) to
    ``stream.ack`` once these events and the earlier ones are safe where they went. What the
    caller leaves unread is read (and dropped) before the next batch. A batch has no events
    when ``timeout`` seconds passed without a message, so the caller can stop or go on.
    ``options`` are :class:`EventReader`'s.

    The events of a transaction being sent (not streamed) come as its changes arrive; if
    the session ends before its commit was acked, the next session sends it again and its
    events come again, with the same ``(commit_lsn, tx_ordinal)``. ``reader``: an
    EventReader of your own (to look at its relations or spill budget) instead of options."""
    if reader is None:
        reader = EventReader(**options)
    elif options:
        raise TypeError("live_events: pass a reader or EventReader options, not both")
    out = bytearray()
    while True:
        _, end, ack = stream.read_records(out, timeout)
        events = reader.read_chunks(raw_chunks(bytes(out)))
        out.clear()
        yield events, (ack if end >= 0 else None)
        for _ in events:  # the reader must see every record, in order
            pass


def _name_of(data: bytes) -> str:
    return TAG_NAMES.get(data[:1], f"tag {data[:1]!r}")
