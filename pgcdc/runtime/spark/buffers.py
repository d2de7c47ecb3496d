"""Arrow arrays from the C accelerator's buffers: the fast batch path of decode_messages.

The generated accelerator's `decode_arrow` walks an Arrow binary array's buffers and writes
every decoded value straight into growable byte buffers, one block of them per message type
(ARROW_LAYOUT, rendered from the spec, says which buffer holds what):

- a scalar: 8 bytes per row (a choice: its byte), plus a validity byte per row when optional;
- a string or bytes value: a 4-byte length per row and the bytes appended, plus validity;
- a part: its validity when optional, then its own buffers, one row per row of its owner;
- a repeat: a 4-byte element count per row, then the element's buffers, one row per element.

A message type's rows sit at their own row numbers in the batch (zero elsewhere), so each
message struct is built at full length with no scatter; rows never written read as zero. This
module wraps the buffers with `pa.Array.from_buffers` (no Python object per value) and applies
the conversions of .arrow: uint64 -> decimal(20,0), the `_text` LSN columns, `_ts`
timestamps.
"""

from __future__ import annotations

import ast

import numpy as np
import pyarrow as pa

from pgcdc.runtime.spark.arrow import _lsn_text, _timestamps
from pgcdc.runtime.spark.plan import LSN_TEXT, TIMESTAMP, StructPlan

__all__ = ["ArrowBlocks", "TooLarge"]

_INT32_MAX = 2**31 - 1


class TooLarge(Exception):
    """A column's bytes do not fit Arrow's 32-bit offsets: the caller takes another path."""


class ArrowBlocks:
    """Builds message struct arrays from decode_arrow's blocks, for one codec."""

    def __init__(self, layout_text: str):
        # message class name -> {attribute: entry}; an entry is (attribute, kind, optional,
        # first buffer, nested entries or None, first buffer of the nested block)
        self.layout = {
            name: {e[0]: e for e in entries}
            for name, entries in ast.literal_eval(layout_text).items()
        }

    def message_struct(
        self, bufs: list, valid: np.ndarray, plan: StructPlan, kind: pa.StructType
    ) -> pa.Array:
        """The struct column of one message type: valid rows are that type's rows."""
        n = len(valid)
        entries = self.layout[plan.name]
        return _struct(bufs, entries, plan, kind, n, _bitmap(valid, n), valid)


def _struct(bufs, entries, plan: StructPlan, kind, rows: int, validity, live=None) -> pa.Array:
    """A struct array of `rows` rows from the buffers the entries name; `live`, when given,
    marks the rows whose values matter (the others are null at a level above)."""
    children = []
    raw: dict[tuple, pa.Array] = {}  # (attribute, Arrow type) -> its array, for _text / _ts
    for column, field in zip(plan.columns, kind):
        entry = entries[column.attr]
        if column.role == LSN_TEXT:
            values = _raw(raw, bufs, entry, rows, pa.uint64())
            children.append(_live_lsn_text(values, live).cast(field.type))
        elif column.role == TIMESTAMP:
            children.append(_timestamps(_raw(raw, bufs, entry, rows, pa.int64()), field.type))
        else:
            children.append(_value(bufs, entry, column.nested, field.type, rows))
    buffers, nulls = [None], 0
    if validity is not None:
        buffers, nulls = [validity[0]], validity[1]
    return pa.Array.from_buffers(kind, rows, buffers, null_count=nulls, children=children)


def _live_lsn_text(values: pa.Array, live) -> pa.Array:
    """LSN text of the live rows only (empty strings elsewhere): a message type's rows are
    often a small part of the batch."""
    if live is None or live.all():
        return _lsn_text(values)
    where = np.flatnonzero(live)
    compact = _lsn_text(values.take(pa.array(where)))
    _, offsets, data = compact.buffers()
    lengths = np.zeros(len(live), np.int32)
    lengths[where] = np.diff(np.frombuffer(offsets, np.int32)[: len(where) + 1])
    validity = None
    if compact.null_count:
        valid = np.zeros(len(live), np.bool_)
        valid[where] = compact.is_valid().to_numpy(zero_copy_only=False)
        validity = _bitmap(valid, len(live))
    return _var(pa.string(), len(live), lengths, data, validity)


def _raw(cache: dict, bufs, entry, rows: int, arrow_type) -> pa.Array:
    key = (entry[0], arrow_type)
    arr = cache.get(key)
    if arr is None:
        arr = cache[key] = _scalar(bufs, entry, rows, arrow_type)
    return arr


def _value(bufs, entry, nested: StructPlan | None, kind, rows: int) -> pa.Array:
    _, what, optional, first, inner, start = entry
    if what == "scalar":
        if pa.types.is_decimal(kind):
            return _scalar(bufs, entry, rows, pa.uint64()).cast(kind)
        arr = _scalar(bufs, entry, rows, pa.int64())
        return arr if arr.type == kind else arr.cast(kind)
    if what == "choice":
        return _choice(bufs, entry, rows, kind)
    if what in ("string", "bytes"):
        lengths = _fixed(bufs[first], rows, np.int32)
        validity = _validity(bufs, first + 2, rows) if optional else None
        return _var(kind, rows, lengths, bufs[first + 1], validity)
    if what == "part":
        validity = _validity(bufs, first, rows) if optional else None
        return _struct(bufs, dict((e[0], e) for e in inner), nested, kind, rows, validity)
    # a repeat: element counts, then the elements (a struct, or the one field's values)
    counts = _fixed(bufs[first], rows, np.int32)
    large = pa.types.is_large_list(kind)
    offsets = np.zeros(rows + 1, np.int64 if large else np.int32)
    np.cumsum(counts, out=offsets[1:], dtype=offsets.dtype)
    total = int(offsets[-1])
    if nested is None:
        items = _value(bufs, inner[0], None, kind.value_type, total)
    else:
        elements = dict((e[0], e) for e in inner)
        items = _struct(bufs, elements, nested, kind.value_type, total, None)
    return pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(offsets)], children=[items])


def _scalar(bufs, entry, rows: int, arrow_type) -> pa.Array:
    """A scalar's 64-bit values as int64 or uint64 (the bits are the same), with validity."""
    _, _, optional, first, _, _ = entry
    values = _fixed(bufs[first], rows, np.int64)
    buffers, nulls = [None], 0
    if optional:
        validity = _validity(bufs, first + 1, rows)
        if validity is not None:
            buffers, nulls = [validity[0]], validity[1]
    return pa.Array.from_buffers(
        arrow_type, rows, [*buffers, pa.py_buffer(values)], null_count=nulls
    )


_CHOICES = pa.array([chr(b) for b in range(256)], pa.string())


def _choice(bufs, entry, rows: int, kind) -> pa.Array:
    """A Byte1 choice: the one-character string of its byte."""
    _, _, optional, first, _, _ = entry
    codes = _fixed(bufs[first], rows, np.uint8)
    valid = _fixed(bufs[first + 1], rows, np.bool_) if optional else None
    if valid is not None and valid.all():
        valid = None
    if codes.max(initial=0) < 0x80:  # ASCII: the bytes are the strings' data
        if valid is None:
            offsets = np.arange(rows + 1, dtype=np.int32)
            data = codes
        else:
            offsets = np.zeros(rows + 1, np.int32)
            np.cumsum(valid, out=offsets[1:], dtype=np.int32)
            data = codes[valid]
        validity = None if valid is None else _bitmap(valid, rows)
        arr = _from_var(pa.string(), rows, offsets, pa.py_buffer(data), validity)
    else:
        mask = None if valid is None else pa.array(~valid)
        arr = _CHOICES.take(pa.array(codes, mask=mask))
    return arr if arr.type == kind else arr.cast(kind)


def _var(kind, rows: int, lengths: np.ndarray, data: bytes, validity) -> pa.Array:
    large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
    if not large and len(data) > _INT32_MAX:
        raise TooLarge
    offsets = np.zeros(rows + 1, np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=offsets.dtype)
    return _from_var(kind, rows, offsets, pa.py_buffer(data), validity)


def _from_var(kind, rows: int, offsets: np.ndarray, data, validity) -> pa.Array:
    buffers, nulls = [None], 0
    if validity is not None:
        buffers, nulls = [validity[0]], validity[1]
    return pa.Array.from_buffers(
        kind, rows, [*buffers, pa.py_buffer(offsets), data], null_count=nulls
    )


def _fixed(buf: bytes, rows: int, dtype) -> np.ndarray:
    """rows values of a row-addressed buffer; the rows past its end are zero."""
    values = np.frombuffer(buf, dtype)
    if len(values) >= rows:
        return values[:rows]
    out = np.zeros(rows, dtype)
    out[: len(values)] = values
    return out


def _validity(bufs, index: int, rows: int):
    """(Arrow validity bitmap, null count) from a validity byte buffer, or None if no null."""
    return _bitmap(_fixed(bufs[index], rows, np.bool_), rows)


def _bitmap(valid: np.ndarray, rows: int):
    nulls = rows - int(np.count_nonzero(valid))
    if not nulls:
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls
