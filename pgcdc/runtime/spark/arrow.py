"""Column-at-a-time Arrow arrays from decoded message objects, for Spark's mapInArrow.

A plan says, for each field of a Spark struct, which attribute of the codec's dataclass it
comes from and its role (pgcdc.runtime.spark.plan). The Arrow type (from the Spark schema)
says how to convert: unsigned 64-bit values go through uint64 to decimal(20,0), repeats
become list arrays over their flattened elements, parts and elements become struct arrays.
Every column is built with one C-level pass (`map(attrgetter)`, `pa.array`), never a Python
loop per row and field. Strings that are not valid UTF-8 raise UnicodeEncodeError here; the
caller turns them into row errors.
"""

from __future__ import annotations

from functools import partial
from itertools import chain
from operator import is_

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.runtime.spark.plan import LSN_TEXT, TIMESTAMP, TS_MAX_US, TS_MIN_US, StructPlan

__all__ = ["struct_array", "values_array", "scatter"]

_is_none = partial(is_, None)
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SHIFTS = np.arange(28, -4, -4, dtype=np.uint32)  # each hex digit of a 32-bit half
_POWERS = (np.uint64(16) ** np.arange(1, 8, dtype=np.uint64)).astype(np.uint32)


def struct_array(objs: list, plan: StructPlan, struct_type: pa.StructType) -> pa.StructArray:
    """One struct per object (none of them None), its fields built column by column."""
    arrays = []
    raw: dict[str, pa.Array] = {}  # uint64/int64 of an attribute, for its _text/_ts column
    for column, arrow_field in zip(plan.columns, struct_type):
        kind = arrow_field.type
        if column.role == LSN_TEXT:
            arrays.append(_lsn_text(_raw(raw, objs, column, pa.uint64())).cast(kind))
        elif column.role == TIMESTAMP:
            arrays.append(_timestamps(_raw(raw, objs, column, pa.int64()), kind))
        elif pa.types.is_decimal(kind):
            arrays.append(_raw(raw, objs, column, pa.uint64()).cast(kind))
        else:
            arrays.append(values_array(list(map(column.get, objs)), kind, column.nested))
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type))


def _raw(cache: dict, objs: list, column, arrow_type) -> pa.Array:
    arr = cache.get(column.attr)
    if arr is None or arr.type != arrow_type:
        arr = cache[column.attr] = pa.array(list(map(column.get, objs)), arrow_type)
    return arr


def values_array(values: list, kind: pa.DataType, nested: StructPlan | None) -> pa.Array:
    """An Arrow array of `kind` for Python values as the codec holds them (None: null)."""
    if pa.types.is_struct(kind):
        return _nullable(values, lambda present: struct_array(present, nested, kind), kind)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _nullable(values, lambda present: _list_array(present, kind, nested), kind)
    if pa.types.is_decimal(kind):
        return pa.array(values, pa.uint64()).cast(kind)
    return pa.array(values, kind)


def _nullable(values: list, build, kind: pa.DataType) -> pa.Array:
    """build() on the values that are not None, spread back over the nulls."""
    if not any(map(_is_none, values)):  # by identity: `None in values` would call __eq__
        return build(values)
    present = [v for v in values if v is not None]
    if not present:
        return pa.nulls(len(values), kind)
    where = [i for i, v in enumerate(values) if v is not None]
    return scatter(build(present), np.asarray(where, np.int64), len(values))


def _list_array(tuples: list, kind, nested) -> pa.Array:
    offsets = np.zeros(len(tuples) + 1, np.int64 if pa.types.is_large_list(kind) else np.int32)
    np.cumsum(np.fromiter(map(len, tuples), np.int64, len(tuples)), out=offsets[1:])
    items = values_array(list(chain.from_iterable(tuples)), kind.value_type, nested)
    cls = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
    return cls.from_arrays(pa.array(offsets), items, type=kind)


def scatter(compact: pa.Array, where: np.ndarray, n: int) -> pa.Array:
    """An array of length n holding compact[j] at row where[j] and null elsewhere."""
    if len(where) == n:
        return compact
    take = np.full(n, -1, np.int64)
    take[where] = np.arange(len(where), dtype=np.int64)
    return compact.take(pa.array(take, mask=take < 0))


def _lsn_text(raw: pa.Array) -> pa.Array:
    """LSN text (X/Y, upper-case hex) for a uint64 array, computed without a Python loop."""
    text = _hex_halves(raw.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64))
    if raw.null_count:
        text = pc.if_else(raw.is_valid(), text, pa.scalar(None, pa.string()))
    return text


def _hex_halves(a: np.ndarray) -> pa.Array:
    """``f"{x >> 32:X}/{x & 0xFFFFFFFF:X}"`` of each x of a uint64 array, as Arrow strings."""
    n = len(a)
    text = np.empty((n, 17), np.uint8)  # 8 hex digits, "/", 8 hex digits
    kept = np.empty((n, 17), bool)  # without the leading zeros of each half
    length = np.ones(n, np.int64)
    for half, cols in (
        ((a >> np.uint64(32)).astype(np.uint32), slice(0, 8)),
        (a.astype(np.uint32), slice(9, 17)),
    ):
        digits = 1 + (half[:, None] >= _POWERS).sum(axis=1)
        text[:, cols] = _HEX[(half[:, None] >> _SHIFTS) & 15]
        kept[:, cols] = np.arange(8) >= (8 - digits)[:, None]
        length += digits
    text[:, 8] = ord("/")
    kept[:, 8] = True
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(length, out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text[kept]))


def _timestamps(raw: pa.Array, kind: pa.DataType) -> pa.Array:
    """<field>_ts for an int64 array of PostgreSQL micros: null outside the range both hold."""
    v = raw.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    ok = (v >= TS_MIN_US) & (v <= TS_MAX_US)
    if raw.null_count:
        ok &= raw.is_valid().to_numpy(zero_copy_only=False)
    # PostgreSQL timestamps count from 2000-01-01 UTC, Spark's from 1970-01-01 UTC
    out = np.where(ok, v + PG_EPOCH_UNIX_US, 0)
    return pa.array(out, type=pa.int64(), mask=~ok).view(kind)
