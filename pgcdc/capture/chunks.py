"""Capture records in chunks, and the runs of changes in them that load a column at a time.

A :class:`Chunk` holds consecutive capture records column-wise: their keys (protocol version
* 4 + context flags), LSNs, and messages as one Arrow-style binary array (offsets + values).
``pgcdc.runtime._capturescan`` reads them in C, so a record costs no Python object until a
message needs one. The codec's C accelerator decodes a whole chunk into columns
(``decode_columns``, one list per field); :class:`ChangeRuns` finds in them the runs of
Inserts, Updates and Deletes sent outside a stream, whose rows
:meth:`pgcdc.events.reader.EventReader.read_chunks` loads a column at a time. Everything else in a
chunk goes through the message-at-a-time path.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import NamedTuple

import pgoutput_codec as pgc
from pgcdc.runtime.decoding import Retry
from pgoutput_codec._decoder import DISPATCH

__all__ = [
    "Chunk",
    "GATES",
    "GATES_BY_KEY",
    "ALLOWED_KEYS",
    "ChangeRuns",
    "is_chunk",
    "record_items",
]

#: a capture record's (version, flags byte) -> its gates (protocol_version, in_stream,
#: parallel_streaming): one shared tuple for each, whichever way the record is read
GATES = {(v, f): (v, bool(f & 1), bool(f & 2)) for v in pgc.PARAMS.versions for f in range(4)}
#: the same by key (version * 4 + flags), as the C reader gives it; None for a key no record
#: may carry
GATES_BY_KEY: list[tuple | None] = [None] * 256
for (_v, _f), _gates in GATES.items():
    if _v < 64:
        GATES_BY_KEY[_v * 4 + _f] = _gates
ALLOWED_KEYS = bytes(g is not None for g in GATES_BY_KEY)


class Chunk(NamedTuple):
    """Consecutive capture records. ``tags`` holds each message's first byte; ``offsets``
    is a memoryview of native int32, one more than the records: message i is
    ``values[offsets[i]:offsets[i + 1]]``."""

    keys: bytes
    tags: bytes
    lsns: list[int]
    offsets: memoryview
    values: bytes

    def triples(self, start: int, stop: int) -> Iterator[tuple[tuple, int, bytes]]:
        """Records start..stop as the ``(gates, lsn, data)`` triples of ``read_raw``."""
        o, v = self.offsets, self.values
        return zip(
            map(GATES_BY_KEY.__getitem__, self.keys[start:stop]),
            self.lsns[start:stop],
            [v[o[i] : o[i + 1]] for i in range(start, stop)],
        )


def is_chunk(item) -> bool:
    return type(item) is Chunk


def _index(cls, name: str) -> int:
    """A field's column in a column set of decode_columns (the dataclass's field order)."""
    return [f.name for f in dataclasses.fields(cls)].index(name)


class Tuples:
    """One TupleData field (``new_tuple`` or ``old_tuple``) of one message type, over a
    chunk: the column set decode_columns filled, read a block of rows at a time."""

    __slots__ = ("presence", "counts", "kinds", "values", "_rank", "_starts")

    def __init__(self, part: list, layout: tuple[int, int, int]):
        columns_i, kind_i, value_i = layout
        self.presence = part[0]  # True, or None where the message had no such tuple
        columns = part[1][columns_i]
        self.counts = columns[0]  # columns per present tuple
        self.kinds = columns[1][kind_i]  # every present tuple's kinds, one after the other
        self.values = columns[1][value_i]
        self._rank = self._starts = None

    def absent(self, p: int, m: int) -> bool:
        """Messages p..p+m (positions in the type's column set) have none."""
        return self.presence[p : p + m].count(None) == m

    def block(self, p: int, m: int, width: int) -> tuple[list, list] | None:
        """(kinds, values) of messages p..p+m, each with a tuple of ``width`` columns; None
        when one has no tuple or another width."""
        presence = self.presence
        if self._rank is None:
            present = presence.count(True)
            # where each message's tuple is among the present ones
            self._rank = (
                range(len(presence) + 1)
                if present == len(presence)
                else list(accumulate((x is True for x in presence), initial=0))
            )
            self._starts = list(accumulate(self.counts, initial=0))
        q = self._rank[p]
        if self._rank[p + m] - q != m or self.counts[q : q + m].count(width) != m:
            return None
        c = self._starts[q]
        return self.kinds[c : c + m * width], self.values[c : c + m * width]


class Changes(NamedTuple):
    """The Inserts, Updates or Deletes of a chunk, as decode_columns gave them."""

    op: str  # c u d
    relation_oids: list[int]
    old_kinds: list | None  # 'K', 'O' or None per message (Update, Delete)
    old: Tuples | None
    new: Tuples | None


class ChangeRuns:
    """Where a chunk's Inserts, Updates and Deletes sent outside a stream are, as runs of
    one message type, and their columns, decoded in C by the codec's accelerator."""

    OPS = (("Insert", "c"), ("Update", "u"), ("Delete", "d"))

    def __init__(self, dispatch):
        self.dispatch = dispatch
        entries = list(dispatch.messages.items())  # tag -> (name, ...), in set order
        self.types = {}  # code -> (op, its fields' columns)
        tags = []
        tuple_layout = (
            _index(pgc.TupleData, "columns"),
            _index(pgc.TupleColumn, "kind"),
            _index(pgc.TupleColumn, "value"),
        )
        for name, op in self.OPS:
            code = next(k for k, (_, (n, _, _)) in enumerate(entries) if n == name)
            cls = getattr(pgc, name)
            names = [f.name for f in dataclasses.fields(cls)]
            fields = tuple(
                _index(cls, f) if f in names else None
                for f in ("relation_oid", "old_kind", "old_tuple", "new_tuple")
            )
            self.types[code] = (op, fields)
            tags.append(entries[code][0])
        self.tuple_layout = tuple_layout
        self.tags = bytes(tags)
        self.run = re.compile(b"|".join(re.escape(bytes((c,))) + b"+" for c in self.types))

    @classmethod
    def of(cls, dispatch=DISPATCH) -> ChangeRuns:
        return cls(dispatch)

    def plan(self, chunk: Chunk) -> tuple[dict, list] | None:
        """({code: Changes}, spans) for the chunk, or None when there is nothing to do
        column-wise (no accelerator in use, no change outside a stream, or a record the
        accelerator declines: the message path then decodes it and reports any error).
        A span is (first record, end record, code, its first message's position in the
        type's column set)."""
        dispatch = self.dispatch
        speedups = dispatch.speedups
        if not dispatch.accelerated or not hasattr(speedups, "decode_columns"):
            return None
        keys, tags = chunk.keys, chunk.tags
        n = len(keys)
        if not n or not any(t in tags for t in self.tags):
            return None
        uniform = keys.count(keys[0]) == n
        if uniform:
            gates = GATES_BY_KEY[keys[0]]
            if gates is None or gates[1]:  # all inside a stream: buffered undecoded
                return None
        else:
            # a change inside a stream is not part of a run (it is buffered undecoded)
            tags = bytes(0 if k & 1 else t for t, k in zip(tags, keys))
            if not any(t in tags for t in self.tags):
                return None
            gates = list(map(GATES_BY_KEY.__getitem__, keys))
        try:
            codes, sets = speedups.decode_columns(chunk.offsets, chunk.values, False, 0, n, gates)
        except Retry:
            return None
        marks = codes if uniform else bytes(c if t else 255 for c, t in zip(codes, tags))
        types = {}
        for code, (op, (rel_i, kind_i, old_i, new_i)) in self.types.items():
            cs = sets[code]
            if not cs[rel_i]:
                continue
            types[code] = Changes(
                op,
                cs[rel_i],
                None if kind_i is None else cs[kind_i],
                None if old_i is None else Tuples(cs[old_i], self.tuple_layout),
                None if new_i is None else Tuples(cs[new_i], self.tuple_layout),
            )
        spans = []
        position = dict.fromkeys(types, 0)  # messages of the type in codes[:counted[type]]
        counted = dict.fromkeys(types, 0)
        for m in self.run.finditer(marks):
            s, e = m.span()
            code = marks[s]
            p = position[code] + codes.count(code, counted[code], s)
            spans.append((s, e, code, p))
            position[code] = p + e - s
            counted[code] = e
        return types, spans


#: the decoding parameters a record may carry -> the shared tuple of each
_GATES = {gates: gates for gates in GATES.values()}


def record_items(records: Iterable) -> Iterator[tuple]:
    """Records as (gates, lsn, data); a record whose parameters are not valid gives
    ``(None, lsn, record)``, so its own decode() raises the precise error."""
    gates_of = _GATES.get
    for rec in records:
        gates = gates_of((rec.protocol_version, rec.in_stream, rec.parallel_streaming))
        if gates is None:
            yield None, rec.lsn, rec
        else:
            yield gates, rec.lsn, rec.data
