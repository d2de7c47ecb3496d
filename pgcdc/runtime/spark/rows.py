"""The documented Spark mapping in plain Python: a decoded message <-> a MESSAGE_SCHEMA value.

What createDataFrame accepts and what a collected Row gives back; decode_messages builds the
same values column-wise in Arrow (.arrow). Unsigned 64-bit values are Decimal, bytes
stay bytes, repeats are lists, parts and elements are dicts, and the convenience columns
(`_text`, `_ts`) are filled in. Converters are compiled once per struct from its plan and its
Spark type.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from pgcdc.runtime.semantics import PG_EPOCH, lsn_text
from pgcdc.runtime.spark.plan import LSN_TEXT, TIMESTAMP, TS_MAX_US, TS_MIN_US, StructPlan

__all__ = ["to_row_converter", "from_row_converter"]


def _timestamp(v):
    if v is None or not TS_MIN_US <= v <= TS_MAX_US:
        return None
    return PG_EPOCH + timedelta(microseconds=v)


def _lsn_text(v):
    return None if v is None else lsn_text(v)


def _decimal(v):
    return None if v is None else Decimal(v)


def to_row_converter(plan: StructPlan, struct_type):
    """A function: dataclass instance (or None) -> dict in `struct_type` (a Spark StructType)."""
    steps = [
        (column.name, column.get, _to_value(column, field.dataType))
        for column, field in zip(plan.columns, struct_type.fields)
    ]

    def to_row(obj):
        if obj is None:
            return None
        return {name: get(obj) if conv is None else conv(get(obj)) for name, get, conv in steps}

    return to_row


def _to_value(column, kind):
    if column.role == LSN_TEXT:
        return _lsn_text
    if column.role == TIMESTAMP:
        return _timestamp
    return _to_plain(kind, column.nested)


def _to_plain(kind, nested):
    from pyspark.sql.types import ArrayType, DecimalType, StructType

    if isinstance(kind, DecimalType):
        return _decimal
    if isinstance(kind, StructType):
        return to_row_converter(nested, kind)
    if isinstance(kind, ArrayType):
        item = _to_plain(kind.elementType, nested)
        if item is None:
            return list
        return lambda values: [item(v) for v in values]
    return None


def from_row_converter(plan: StructPlan, struct_type):
    """The inverse: a collected Row or dict (or None) -> the codec's dataclass; convenience
    columns are ignored."""
    steps = [
        (column.attr, column.name, _from_plain(field.dataType, column.nested))
        for column, field in zip(plan.columns, struct_type.fields)
        if column.role not in (LSN_TEXT, TIMESTAMP)
    ]
    cls = plan.cls

    def from_row(row):
        if row is None:
            return None
        return cls(**{attr: conv(row[name]) for attr, name, conv in steps})

    return from_row


def _from_plain(kind, nested):
    from pyspark.sql.types import ArrayType, BinaryType, DecimalType, StructType

    if isinstance(kind, DecimalType):
        return lambda v: None if v is None else int(v)
    if isinstance(kind, BinaryType):
        return lambda v: None if v is None else bytes(v)
    if isinstance(kind, StructType):
        return from_row_converter(nested, kind)
    if isinstance(kind, ArrayType):
        item = _from_plain(kind.elementType, nested)
        return lambda values: tuple(item(v) for v in values)
    return lambda v: v
