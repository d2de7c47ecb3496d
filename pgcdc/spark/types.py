"""PostgreSQL column types as Spark types, and loaded values as Spark/Arrow values.

:func:`spark_type` maps a column's (type OID, type modifier), as a Relation message sends
them, to a Spark ``DataType``; :func:`value_converter` gives the function that turns a value
loaded by :mod:`pgcdc.values` (what :mod:`pgcdc.events.reader` puts in ``before``/``after``) into the
Python value ``pyarrow``/Spark takes for that type. The mapping is lossless: a value the typed
column cannot hold is never clamped or dropped, it becomes null in the typed column and its
PostgreSQL text goes into the row's side column :data:`SPECIAL_COLUMN`
(``map<string,string>``: column name -> text), so a reader can always tell a real NULL
(absent from the map) from "not representable here" (present).

=========================================  ======================  ==================================
PostgreSQL type                            Spark type              notes
=========================================  ======================  ==================================
bool                                       BooleanType
int2 / int4 / int8                         Short / Integer / Long
oid, xid                                   LongType                unsigned 32-bit
float4 / float8                            Float / DoubleType      NaN and +-Infinity kept
numeric(p,s), p <= 38 and 0 <= s <= p      DecimalType(p,s)        NaN -> null + text 'NaN'
numeric (unconstrained, or p > 38, s < 0)  StringType              PostgreSQL's text, exact digits
text, varchar, bpchar, name, "char"        StringType
bytea                                      BinaryType
date                                       DateType                infinity, BC, > 9999: null + text
timestamp                                  TimestampNTZType        same (text as PostgreSQL prints it)
timestamptz                                TimestampType           same; instants are UTC
time, timetz, interval                     StringType              PostgreSQL's text (IntervalStyle
                                                                   postgres)
uuid                                       StringType              lower-case hex with dashes
json, jsonb                                StringType              the JSON text (compact; equal as
                                                                   JSON, spacing not kept)
T[] (built-in element type)                ArrayType(map of T)     1-dimensional; a value with more
                                                                   dimensions, or an element the
                                                                   element type cannot hold: null +
                                                                   the array as JSON text
inet, cidr, macaddr, money, ranges,        StringType              PostgreSQL's text
geometric, bit strings, xml, others
enums (catalog)                            StringType              the label
T[] (T an enum or composite, catalog)      ArrayType(map of T)     as for built-in element types
domains (catalog)                          the base type's         typed as the base type
composites (catalog)                       StructType              one field per attribute, typed
                                                                   as above (attribute typmods are
                                                                   not sent: numeric is text)
types no catalog describes                 StringType              the value does not load: null +
                                                                   its text as sent in _pg_text
                                                                   (lenient), else an error
=========================================  ======================  ==================================

Special values of the side column hold PostgreSQL's text: ``'infinity'``/``'-infinity'``
(date, timestamp, timestamptz), ``'10000-01-01 00:00:00+00'`` or ``'0044-03-15 BC'`` (outside
Spark's years 1-9999), ``'NaN'`` (numeric(p,s)), and for arrays their JSON text
(``'[[1,2],[3,4]]'``, ``'["infinity"]'``). A value that did not load (lenient mode,
:class:`pgcdc.values.RawValue`) is null plus its text as sent (binary: ``\\x`` hex).
An unchanged TOAST value (:data:`pgcdc.values.UNCHANGED`) is null in the typed column: the
change event lists it in its ``unchanged`` column (see :mod:`pgcdc.spark.changes`).

Why these choices: Spark's timestamps and dates stop at years 1 and 9999 and have no
infinity; DecimalType stops at 38 digits and a non-negative scale; PostgreSQL's array types
do not fix their dimensions (an ``int[]`` column may hold ``'{{1,2},{3,4}}'``). Clamping would
make a real value indistinguishable from a sentinel, so the side column keeps the exact text.

API (stable; the snapshot reader uses it too)::

    spark_type(type_oid, typmod=-1, catalog=None) -> DataType
    pg_arrow_type(type_oid, typmod=-1, catalog=None) -> the same type in Arrow (no Spark)
    value_converter(type_oid, typmod=-1, catalog=None) -> value -> spark value; raises
        Unrepresentable
    columns_schema(names, type_oids, typmods, catalog=None) -> StructType of the columns
        (no side column)
    RowConverter(names, type_oids, typmods, catalog=None).convert(values)
        -> (list of values, dict | None)

``catalog`` (a :class:`pgcdc.values.Catalog`, what the capture recorded) types the columns
of types that are not built in; without it they are StringType.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from psycopg import postgres

from pgcdc.errors import DataError
from pgcdc.values import UNCHANGED, OutOfRange, RawValue, dumps, pg_cast_text, pg_text
from pgcdc.values import to_json_value

__all__ = [
    "SPECIAL_COLUMN",
    "RowConverter",
    "Unrepresentable",
    "columns_schema",
    "type_namespace",
    "element_oid",
    "numeric_precision_scale",
    "column_type",
    "pg_arrow_type",
    "spark_type",
    "value_converter",
]

#: Side column: column name -> PostgreSQL text of a value the typed column holds as null.
SPECIAL_COLUMN = "_pg_text"

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, XID = 16, 17, 18, 19, 20, 21, 23, 25, 26, 28
FLOAT4, FLOAT8, BPCHAR, VARCHAR = 700, 701, 1042, 1043
DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC = 1082, 1114, 1184, 1700
JSON, JSONB = 114, 3802

_STRINGS = {TEXT, VARCHAR, BPCHAR, NAME, CHAR}
_MAX_DECIMAL_PRECISION = 38
_VARHDRSZ = 4

# array type OID -> element type OID, for the built-in types (psycopg's registry)
_ELEMENTS = {info.array_oid: info.oid for info in postgres.types if info.array_oid}


class Unrepresentable(DataError, ValueError):
    """A value the Spark type cannot hold; ``text`` is what goes into the side column."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def element_oid(type_oid: int) -> int | None:
    """The element type of a built-in array type, else None."""
    return _ELEMENTS.get(type_oid)


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None when unconstrained. The scale may
    be negative or above the precision (PostgreSQL 15+)."""
    if typmod < _VARHDRSZ:
        return None
    mod = typmod - _VARHDRSZ
    scale = ((mod & 0x7FF) ^ 1024) - 1024  # 11-bit signed, as numeric_typmod_scale
    return (mod >> 16) & 0xFFFF, scale


def _decimal_fits(typmod: int) -> tuple[int, int] | None:
    ps = numeric_precision_scale(typmod)
    if ps is None:
        return None
    p, s = ps
    return ps if p <= _MAX_DECIMAL_PRECISION and 0 <= s <= p else None


FIRST_NORMAL_OID = 16384  # types made by initdb have smaller OIDs


def spark_type(type_oid: int, typmod: int = -1, catalog=None):
    """The Spark DataType of a PostgreSQL column (see the table in the module docstring)."""
    return column_type("spark", type_oid, typmod, catalog)


def pg_arrow_type(type_oid: int, typmod: int = -1, catalog=None):
    """The Arrow type of a PostgreSQL column: what :func:`spark_type`'s type is in Arrow
    (``batches.arrow_type``), without importing Spark (the driver's own cycles of ``pgcdc
    sync`` never need it: 0.08-0.15 s of a rerun's first cycle)."""
    return column_type("arrow", type_oid, typmod, catalog)


# decimal digits that every value of a signed integer of this many bits fits in
_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}


def widens(narrow, wide) -> bool:
    """Whether every value of Arrow type ``narrow`` is a value of ``wide`` too, unchanged:
    a column retyped by ``ALTER TABLE ... ALTER COLUMN ... TYPE`` from an integer to a wider
    integer or to a decimal holding its digits, or from a decimal to one with as many
    digits before and after the point (PostgreSQL converts those rows without loss, and no
    change says so). Floats are not: a float4 value is not the float8 PostgreSQL makes of
    it from its text here."""
    import pyarrow.types as pt

    if narrow == wide:
        return True
    if pt.is_signed_integer(narrow):
        if pt.is_signed_integer(wide):
            return narrow.bit_width <= wide.bit_width
        if pt.is_decimal(wide):
            return _INTEGER_DIGITS[narrow.bit_width] <= wide.precision - wide.scale
        return False
    if pt.is_decimal(narrow) and pt.is_decimal(wide):
        return wide.scale >= narrow.scale and (
            wide.precision - wide.scale >= narrow.precision - narrow.scale
        )
    return False


def column_type(kind: str, type_oid: int, typmod: int = -1, catalog=None):
    """The type of a PostgreSQL column among ``kind``'s types (:func:`type_namespace`):
    :func:`spark_type` for "spark", :func:`pg_arrow_type` for "arrow"."""
    if catalog is None or type_oid < FIRST_NORMAL_OID:
        return _builtin_type(kind, type_oid, typmod)
    return _catalog_type(kind, type_oid, typmod, catalog, 0)


_MAX_NESTING = 32  # composites of composites: PostgreSQL forbids cycles; a bad catalog may not


def _catalog_type(kind: str, type_oid: int, typmod: int, catalog, depth: int):
    T = type_namespace(kind)
    e = catalog.types.get(type_oid)
    if e is None or depth > _MAX_NESTING:
        return T.StringType()
    if e.kind == "domain":
        return _typed(kind, e.base_oid, typmod, catalog, depth + 1)
    if e.kind == "array":
        return T.ArrayType(
            _typed(kind, e.element_oid, typmod, catalog, depth + 1), containsNull=True
        )
    if e.kind == "composite" and e.fields:  # Parquet has no struct without fields
        return T.StructType(
            [T.StructField(n, _typed(kind, t, -1, catalog, depth + 1), True) for n, t in e.fields]
        )
    return T.StringType()  # enums (their label), ranges, extension types: text


def _typed(kind: str, type_oid: int, typmod: int, catalog, depth: int):
    if type_oid < FIRST_NORMAL_OID:
        return _builtin_type(kind, type_oid, typmod)
    return _catalog_type(kind, type_oid, typmod, catalog, depth)


@lru_cache(maxsize=4096)
def _builtin_type(kind: str, type_oid: int, typmod: int = -1):
    T = type_namespace(kind)
    simple = {
        BOOL: T.BooleanType,
        INT2: T.ShortType,
        INT4: T.IntegerType,
        INT8: T.LongType,
        OID: T.LongType,
        XID: T.LongType,
        FLOAT4: T.FloatType,
        FLOAT8: T.DoubleType,
        BYTEA: T.BinaryType,
        DATE: T.DateType,
        TIMESTAMP: T.TimestampNTZType,
        TIMESTAMPTZ: T.TimestampType,
    }.get(type_oid)
    if simple is not None:
        return simple()
    if type_oid == NUMERIC:
        ps = _decimal_fits(typmod)
        return T.DecimalType(*ps) if ps else T.StringType()
    elem = _ELEMENTS.get(type_oid)
    if elem is not None:
        return T.ArrayType(_builtin_type(kind, elem, typmod), containsNull=True)
    return T.StringType()


def type_namespace(kind: str):
    """The types the mapping builds: Spark's (``pyspark.sql.types``, kind "spark"), or the
    Arrow types Spark exchanges with Python for them (kind "arrow", under Spark's names:
    ``StructType``, ``MapType``...; a test holds the two equal through pyspark's own
    ``to_arrow_type``)."""
    if kind == "spark":
        from pyspark.sql import types as T

        return T
    return _arrow_namespace()


@lru_cache(maxsize=1)
def _arrow_namespace():
    import pyarrow as pa

    return SimpleNamespace(
        BooleanType=pa.bool_,
        ShortType=pa.int16,
        IntegerType=pa.int32,
        LongType=pa.int64,
        FloatType=pa.float32,
        DoubleType=pa.float64,
        BinaryType=pa.binary,
        StringType=pa.string,
        DateType=pa.date32,
        TimestampNTZType=lambda: pa.timestamp("us"),
        TimestampType=lambda: pa.timestamp("us", tz="UTC"),
        DecimalType=pa.decimal128,
        ArrayType=lambda element, containsNull=True: pa.list_(element),  # noqa: N803
        MapType=lambda key, value, valueContainsNull=True: pa.map_(key, value),  # noqa: N803
        StructField=pa.field,  # (name, type, nullable)
        StructType=pa.struct,
    )


def columns_schema(
    names: Sequence[str], type_oids: Sequence[int], typmods: Sequence[int], catalog=None
):
    """StructType with one nullable field per column, typed by :func:`spark_type`."""
    from pyspark.sql.types import StructField, StructType

    return StructType(
        [
            StructField(n, spark_type(o, m, catalog), True)
            for n, o, m in zip(names, type_oids, typmods)
        ]
    )


# --- values ----------------------------------------------------------------------------------


def _text_of(value, type_oid: int) -> str:
    """PostgreSQL's text for a value of a string-mapped type: the JSON text of json/jsonb
    (and of a list or dict no array or struct type holds), else what the server prints."""
    if isinstance(value, RawValue):  # never passed off as a value, even in a text column
        raise Unrepresentable(_raw_text(value))
    if type_oid in (JSON, JSONB) or isinstance(value, (list, dict)):
        return _json_text(value, type_oid)
    return pg_text(value, type_oid)


def _decimal_special(d: Decimal) -> str:
    return "NaN" if d.is_nan() else ("Infinity" if d > 0 else "-Infinity")


def _raw_text(value: RawValue) -> str:
    if value.data is None:
        return ""
    if value.kind == "t":
        try:
            return bytes(value.data).decode()
        except UnicodeDecodeError:
            pass
    return "\\x" + bytes(value.data).hex()


def _json_text(value, type_oid: int) -> str:
    out = dumps(to_json_value(value, type_oid))
    return out.decode() if isinstance(out, bytes) else out


def _special(value, type_oid: int):
    """Raise Unrepresentable for values no typed column holds (shared by every converter)."""
    if isinstance(value, OutOfRange):
        raise Unrepresentable(value.text)
    if isinstance(value, RawValue):
        raise Unrepresentable(_raw_text(value))
    raise TypeError(
        f"a {type(value).__name__} value ({value!r:.60}) for a column of type OID {type_oid}"
    )


def _scalar_converter(type_oid: int, typmod: int) -> Callable[[Any], Any] | None:
    if type_oid in (BOOL, INT2, INT4, INT8, OID, XID, FLOAT4, FLOAT8):
        py = bool if type_oid == BOOL else (float if type_oid in (FLOAT4, FLOAT8) else int)

        def number(v):
            if type(v) is py or (py is float and type(v) is int):
                return v
            if type_oid == XID and type(v) is str:
                return int(v)  # xid loads as its digits (psycopg has no loader for it)
            return _special(v, type_oid)

        return number
    if type_oid == BYTEA:

        def binary(v):
            if isinstance(v, (bytes, bytearray, memoryview)):
                return bytes(v)
            return _special(v, type_oid)

        return binary
    if type_oid in (DATE, TIMESTAMP, TIMESTAMPTZ):
        py = date if type_oid == DATE else datetime

        def when(v):
            if type(v) is py:
                return v
            return _special(v, type_oid)

        return when
    if type_oid == NUMERIC and _decimal_fits(typmod):

        def decimal(v):
            if type(v) is Decimal and v.is_finite():
                return v
            if type(v) is Decimal:
                raise Unrepresentable(_decimal_special(v))
            return _special(v, type_oid)

        return decimal
    return lambda v: _text_of(v, type_oid)


def _array_converter(type_oid: int, inner: Callable | None) -> Callable[[Any], Any]:
    """``inner``: the element type's converter (None: arrays of arrays, held as text)."""

    def array(v):
        if not isinstance(v, list):
            if isinstance(v, str):  # an array psycopg could not type: keep its text
                raise Unrepresentable(v)
            return _special(v, type_oid)
        out = []
        for x in v:
            if x is None:
                out.append(None)
                continue
            if isinstance(x, list) or inner is None:  # more than one dimension
                raise Unrepresentable(_json_text(v, type_oid))
            try:
                out.append(inner(x))
            except Unrepresentable:
                raise Unrepresentable(_json_text(v, type_oid)) from None
        return out

    return array


def value_converter(type_oid: int, typmod: int = -1, catalog=None) -> Callable[[Any], Any]:
    """value (as :mod:`pgcdc.values` loads it, never None or UNCHANGED) -> the Python value
    pyarrow takes for :func:`spark_type` of the column. Raises :class:`Unrepresentable` with
    the side-column text for values the type cannot hold."""
    if catalog is None or type_oid < FIRST_NORMAL_OID:
        return _builtin_converter(type_oid, typmod)
    return _catalog_converter(type_oid, typmod, catalog, 0)


@lru_cache(maxsize=4096)
def _builtin_converter(type_oid: int, typmod: int = -1) -> Callable[[Any], Any]:
    elem = _ELEMENTS.get(type_oid)
    if elem is not None:
        inner = _scalar_converter(elem, typmod) if elem not in _ELEMENTS else None
        return _array_converter(type_oid, inner)
    return _scalar_converter(type_oid, typmod)


def _catalog_converter(type_oid: int, typmod: int, catalog, depth: int):
    e = catalog.types.get(type_oid)
    if e is None or depth > _MAX_NESTING:
        return lambda v: _text_of(v, type_oid)
    if e.kind == "domain":
        return _converter_in(e.base_oid, typmod, catalog, depth + 1)
    if e.kind == "array":
        elem = catalog.types.get(e.element_oid)
        nested = e.element_oid in _ELEMENTS or (elem is not None and elem.kind == "array")
        inner = None if nested else _converter_in(e.element_oid, typmod, catalog, depth + 1)
        return _array_converter(type_oid, inner)
    if e.kind == "composite" and e.fields:
        return _composite_converter(
            type_oid, [(n, _converter_in(t, -1, catalog, depth + 1)) for n, t in e.fields]
        )
    if e.kind == "enum":

        def label(v):
            if type(v) is str:
                return v
            return _special(v, type_oid)

        return label
    return lambda v: _text_of(v, type_oid)


def _converter_in(type_oid: int, typmod: int, catalog, depth: int):
    if type_oid < FIRST_NORMAL_OID:
        return _builtin_converter(type_oid, typmod)
    return _catalog_converter(type_oid, typmod, catalog, depth)


def _composite_converter(type_oid: int, fields: list) -> Callable[[Any], Any]:
    """A composite (:class:`pgcdc.values.PgComposite`, a dict by attribute) as a struct's
    dict; an attribute the struct cannot hold makes the whole value its JSON text."""

    def composite(v):
        if not isinstance(v, dict):
            return _special(v, type_oid)
        out = {}
        try:
            for name, conv in fields:
                x = v.get(name)
                out[name] = None if x is None else conv(x)
        except Unrepresentable:
            raise Unrepresentable(_json_text(v, type_oid)) from None
        return out

    return composite


class RowConverter:
    """Converts one relation version's rows: built once, used for every row."""

    __slots__ = ("names", "converters")

    def __init__(
        self,
        names: Sequence[str],
        type_oids: Sequence[int],
        typmods: Sequence[int],
        catalog=None,
    ):
        self.names = tuple(names)
        self.converters = tuple(value_converter(o, m, catalog) for o, m in zip(type_oids, typmods))

    def convert(self, values: Sequence) -> tuple[list, dict | None]:
        """(typed values in column order, {name: text} of unrepresentable ones or None).
        None and UNCHANGED become None (the event's ``unchanged`` list says which is which)."""
        out = []
        special = None
        for name, conv, v in zip(self.names, self.converters, values):
            if v is None or v is UNCHANGED:
                out.append(None)
                continue
            try:
                out.append(conv(v))
            except Unrepresentable as u:
                out.append(None)
                if special is None:
                    special = {}
                special[name] = u.text
        return out, special


@lru_cache(maxsize=4096)
def text_converter(type_oid: int) -> Callable[[Any], Any]:
    """value -> PostgreSQL's text for it: the converter of a column whose Spark type is
    StringType for another reason (its type changed between Relation messages)."""

    def text(v):  # as the cast ALTER COLUMN ... TYPE text makes (bool: 'true')
        if isinstance(v, (RawValue, list, dict)) or type_oid in (JSON, JSONB):
            return _text_of(v, type_oid)
        return pg_cast_text(v, type_oid)

    return text
