"""Capture records in chunks, and the runs of Inserts in them that load a column at a time.

A :class:`Chunk` holds consecutive capture records column-wise: their keys (protocol version
* 4 + context flags), LSNs, and messages as one Arrow-style binary array (offsets + values).
``pgcdc.runtime._capturescan`` reads them in C, so a record costs no Python object until a
message needs one. The codec's C accelerator decodes a whole chunk into columns
(``decode_columns``, one list per field); :class:`InsertRuns` finds in them the runs of
Inserts sent outside a stream, whose rows :meth:`pgcdc.events.EventReader.read_chunks` loads
a column at a time. Everything else in a chunk goes through the message-at-a-time path.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import NamedTuple

import pgoutput_codec as pgc
from pgcdc.runtime.decoding import Retry
from pgoutput_codec._decoder import DISPATCH

__all__ = ["Chunk", "GATES_BY_KEY", "ALLOWED_KEYS", "InsertRuns", "is_chunk"]

#: a record's key (version * 4 + flags) -> its gates (protocol_version, in_stream,
#: parallel_streaming), one shared tuple each; None for a key no record may carry
GATES_BY_KEY: list[tuple | None] = [None] * 256
for _v in pgc.PARAMS.versions:
    for _f in range(4):
        if _v < 64:
            GATES_BY_KEY[_v * 4 + _f] = (_v, bool(_f & 1), bool(_f & 2))
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


class InsertRuns:
    """Where a chunk's Inserts outside streams are, and their columns, decoded in C."""

    def __init__(self, dispatch):
        self.dispatch = dispatch
        names = [name for name, _, _ in dispatch.messages.values()]
        self.code = names.index("Insert")  # its column set in decode_columns' output
        self.tag = bytes(
            (next(t for t, (name, _, _) in dispatch.messages.items() if name == "Insert"),)
        )
        self.code_byte = bytes((self.code,))
        self.run = re.compile(re.escape(self.code_byte) + b"+")
        self.fields = (
            _index(pgc.Insert, "relation_oid"),
            _index(pgc.Insert, "new_tuple"),
            _index(pgc.TupleData, "columns"),
            _index(pgc.TupleColumn, "kind"),
            _index(pgc.TupleColumn, "value"),
        )

    @classmethod
    def of(cls, dispatch=DISPATCH) -> InsertRuns:
        return cls(dispatch)

    def plan(self, chunk: Chunk):
        """(relation OIDs, column counts, kinds, values, spans) of the chunk's Inserts, or
        None when there is nothing to do column-wise (no accelerator in use, no Insert
        outside a stream, or a record the accelerator declines: the message path then
        decodes it and reports any error). Each span is (first record, end record, its
        position among the Inserts, its first value's position in kinds/values)."""
        dispatch = self.dispatch
        speedups = dispatch.speedups
        if not dispatch.accelerated or not hasattr(speedups, "decode_columns"):
            return None
        keys, tags = chunk.keys, chunk.tags
        n = len(keys)
        if not n or self.tag not in tags:
            return None
        uniform = keys.count(keys[0]) == n
        if uniform:
            gates = GATES_BY_KEY[keys[0]]
            if gates is None or gates[1]:  # all inside a stream: buffered undecoded
                return None
        else:
            # an Insert inside a stream is not part of a run (it is buffered undecoded)
            tags = bytes(0 if k & 1 else t for t, k in zip(tags, keys))
            if self.tag not in tags:
                return None
            gates = list(map(GATES_BY_KEY.__getitem__, keys))
        try:
            codes, sets = speedups.decode_columns(chunk.offsets, chunk.values, False, 0, n, gates)
        except Retry:
            return None
        code = self.code_byte
        marks = codes if uniform else bytes(c if t else 255 for c, t in zip(codes, tags))
        rel_i, tuple_i, columns_i, kind_i, value_i = self.fields
        inserts = sets[self.code]
        columns = inserts[tuple_i][1][columns_i]
        counts = columns[0]
        spans = []
        p = c = done = 0
        for m in self.run.finditer(marks):
            s, e = m.span()
            skipped = codes.count(code, done, s)  # Inserts inside a stream, before this run
            c += sum(counts[p : p + skipped])
            p += skipped
            spans.append((s, e, p, c))
            c += sum(counts[p : p + e - s])
            p += e - s
            done = e
        return inserts[rel_i], counts, columns[1][kind_i], columns[1][value_i], spans
