"""Arrow arrays from the C accelerator's column sets: the batch path of decode_messages.

The generated accelerator's `decode_columns` walks an Arrow binary array's buffers and, for
every message type, appends each decoded value to its column (a plain list, in dataclass field
order) instead of building a dataclass per message and per part. A part's or repeat's column
is a pair [presence (True / None) or element count per row, the nested columns]. This module
turns those lists into the Spark struct's Arrow arrays, one `pa.array` call per leaf column,
with the same conversions as .arrow (uint64 -> decimal, `_text`, `_ts`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from pgcdc.runtime.spark.arrow import _lsn_text, _timestamps, scatter
from pgcdc.runtime.spark.plan import LSN_TEXT, TIMESTAMP, StructPlan

__all__ = ["columns_struct_array"]

_FIELD_INDEX: dict[type, dict[str, int]] = {}


def _field_index(cls: type) -> dict[str, int]:
    """Attribute name -> its column in a column set (the dataclass's field order)."""
    index = _FIELD_INDEX.get(cls)
    if index is None:
        index = _FIELD_INDEX[cls] = {f.name: i for i, f in enumerate(dataclasses.fields(cls))}
    return index


def columns_struct_array(cs: list, plan: StructPlan, struct_type: pa.StructType) -> pa.StructArray:
    """One struct per row of the column set `cs`, built column by column."""
    index = _field_index(plan.cls)
    arrays = []
    raw: dict[tuple, pa.Array] = {}  # (attribute, Arrow type) -> its array, for _text / _ts
    for column, arrow_field in zip(plan.columns, struct_type):
        kind = arrow_field.type
        values = cs[index[column.attr]]
        if column.role == LSN_TEXT:
            arrays.append(_lsn_text(_raw(raw, column.attr, values, pa.uint64())).cast(kind))
        elif column.role == TIMESTAMP:
            arrays.append(_timestamps(_raw(raw, column.attr, values, pa.int64()), kind))
        elif pa.types.is_decimal(kind):
            arrays.append(_raw(raw, column.attr, values, pa.uint64()).cast(kind))
        elif pa.types.is_struct(kind):
            presence, nested = values
            arrays.append(_part(presence, nested, column.nested, kind))
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            counts, nested = values
            arrays.append(_list(counts, nested, column.nested, kind))
        else:
            arrays.append(pa.array(values, kind))
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type))


def _raw(cache: dict, attr: str, values: list, arrow_type) -> pa.Array:
    key = (attr, arrow_type)
    arr = cache.get(key)
    if arr is None:
        arr = cache[key] = pa.array(values, arrow_type)
    return arr


def _part(presence: list, nested: list, plan: StructPlan, kind: pa.StructType) -> pa.Array:
    """A nullable struct column: the part's rows exist only where presence is True."""
    compact = columns_struct_array(nested, plan, kind)
    if len(compact) == len(presence):
        return compact
    where = np.flatnonzero(np.fromiter((p is not None for p in presence), bool, len(presence)))
    return scatter(compact, where, len(presence))


def _list(counts: list, nested, plan: StructPlan | None, kind) -> pa.Array:
    large = pa.types.is_large_list(kind)
    offsets = np.zeros(len(counts) + 1, np.int64 if large else np.int32)
    np.cumsum(np.asarray(counts, np.int64), out=offsets[1:])
    if plan is None:  # a repeat of scalars: the values themselves
        if pa.types.is_decimal(kind.value_type):
            items = pa.array(nested, pa.uint64()).cast(kind.value_type)
        else:
            items = pa.array(nested, kind.value_type)
    else:
        items = columns_struct_array(nested, plan, kind.value_type)
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets), items, type=kind)
