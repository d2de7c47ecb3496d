"""A column of PostgreSQL text values made an Arrow array by Arrow's casts, in C.

A change's values come as the text the server's output functions print. The exact path loads
each through :class:`pgcdc.values.RowLoader` (a Python object per value) and converts it to
the column's Spark type (:mod:`pgcdc.spark.types`); for the common types that is a parse Arrow
does itself, column at a time. :func:`text_array` takes that path only where Arrow's result is
the exact path's for every value it accepts, and where it accepts a value's text only if the
exact path gives a value (not a NULL with the text in ``_pg_text``):

- integers, ``oid``, ``xid``: Arrow parses decimal digits and refuses what overflows;
- ``float8``; ``float4`` through a double, as the exact path (a Python float) does; NaN and
  ±Infinity are values in both;
- ``numeric(p,s)`` within 38 digits: the server prints exactly ``s`` decimals; NaN and
  ±Infinity are refused (the exact path keeps their text);
- ``bool`` (``t``/``f``), the string types;
- ``date``, ``timestamp``, ``timestamptz`` in DateStyle ISO: Arrow refuses infinity, BC and
  five-digit years, and offsets with seconds (local mean time before 1900), which the exact
  path keeps exact.

Anything else, or a column holding a value Arrow refuses, gives None: the caller takes the
exact path for it. ``tests/spark/test_text_arrow.py`` checks both paths agree on values a server
printed.
"""

from __future__ import annotations

from functools import lru_cache

from pgcdc.spark.types import (
    BOOL,
    BPCHAR,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NAME,
    NUMERIC,
    OID,
    TEXT,
    TIMESTAMP,
    TIMESTAMPTZ,
    VARCHAR,
    XID,
    _decimal_fits,
)

__all__ = ["text_array", "handles"]


@lru_cache(maxsize=1)
def _targets() -> dict:
    import pyarrow as pa

    return {
        BOOL: pa.bool_(),
        INT2: pa.int16(),
        INT4: pa.int32(),
        INT8: pa.int64(),
        OID: pa.int64(),
        XID: pa.int64(),
        FLOAT4: pa.float32(),
        FLOAT8: pa.float64(),
        DATE: pa.date32(),
        TIMESTAMP: pa.timestamp("us"),
        TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
        TEXT: pa.string(),
        VARCHAR: pa.string(),
        BPCHAR: pa.string(),
        NAME: pa.string(),
    }


def handles(type_oid: int, typmod: int, target) -> bool:
    """Whether :func:`text_array` may make a column of this type for this Arrow type."""
    import pyarrow as pa

    if type_oid == NUMERIC:
        ps = _decimal_fits(typmod)
        return ps is not None and target == pa.decimal128(*ps)
    want = _targets().get(type_oid)
    return want is not None and want == target


def text_array(values: list, type_oid: int, typmod: int, target):
    """``values`` (the text of each, as bytes, or None for NULL) as an Arrow array of type
    ``target``; None where :func:`handles` says no or Arrow refuses a value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not handles(type_oid, typmod, target):
        return None
    try:
        texts = pa.array(values, pa.binary()).cast(pa.string())  # refuses bad UTF-8
        if pa.types.is_string(target):
            return texts
        if type_oid == BOOL:
            t = pc.equal(texts, "t")
            known = pc.all(pc.or_(t, pc.equal(texts, "f"))).as_py()  # None: all NULL
            return None if known is False else t
        if type_oid == FLOAT4:
            return texts.cast(pa.float64()).cast(pa.float32(), safe=False)
        out = texts.cast(target)
        if pa.types.is_timestamp(target) and not _in_python_range(pa, pc, out):
            return None
        return out
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


# a timestamptz near year 1 or 9999 may fall outside them in UTC: Python's datetime (the
# exact path) cannot hold it and keeps its text
_LOW_US = -62135596800 * 1_000_000  # 0001-01-01 00:00:00 UTC, since 1970
_HIGH_US = 253402300800 * 1_000_000  # 10000-01-01 00:00:00 UTC


def _in_python_range(pa, pc, arr) -> bool:
    us = arr.cast(pa.int64())
    lo, hi = pc.min_max(us).values()
    return lo.as_py() is None or (lo.as_py() >= _LOW_US and hi.as_py() < _HIGH_US)
