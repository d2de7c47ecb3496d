"""Typed column values of change events, and their JSON.

:class:`RowLoader` turns a row's pgoutput TupleData columns into Python values through
psycopg 3's loaders, with no connection (psycopg's C loaders where they are exact; see
``_loaders``). A text slot and a binary slot give equal values for every built-in type.

Values
------
- SQL NULL ('n') is ``None``; an unchanged TOAST value ('u') is :data:`UNCHANGED`, never None.
- Built-in types psycopg loads: bool, int, float, ``Decimal`` (numeric, with NaN and
  ±Infinity), bytes (bytea), str, ``UUID``, ``ipaddress`` objects, date/time types, json/jsonb
  (parsed, floats as ``Decimal`` so no digit is lost), ranges/multiranges (psycopg's
  ``Range``/``Multirange``), arrays as (nested) lists with ``None`` for NULL elements.
- interval: :class:`PgInterval`, a ``timedelta`` equal to psycopg's (a month is 30 days) that
  keeps PostgreSQL's months/days/microseconds for exact rendering.
- Date/time values Python cannot hold (infinity, BC dates, years after 9999, ``24:00:00``,
  infinite intervals) are :class:`OutOfRange` ``(type_oid, text)``, holding PostgreSQL's text
  (DateStyle ISO, timestamptz in UTC: ``'infinity'``, ``'10000-01-01 00:00:00+00'``,
  ``'0044-03-15 BC'``), the same from a text and a binary slot. They never raise.
- Other built-in types psycopg has no loader for (money, geometric types, bit strings,
  macaddr, tsvector/tsquery, pg_lsn, xid, tid, xml, ...) are ``str``: PostgreSQL's text. Their
  binary form is converted to that text (money assumes lc_monetary C).
- Types that are not built in (enums, composites, domains over them, ranges of user subtypes,
  arrays of those) load only when a :class:`Catalog` describes them (``pgcdc capture`` records
  one: :mod:`pgcdc.capture.catalog`): enum -> ``str``, composite -> :class:`PgComposite` (a
  dict by attribute), domain -> its base type, arrays -> lists, a range over float4 ->
  :class:`Float4Range` (a ``Range`` whose bounds print as float4's). Without one their values
  are a :class:`ValueLoadError` (lenient: :class:`RawValue` plus the error): an enum's bytes or a
  composite's text would otherwise pass for something they are not. Likewise a reg* value
  from a binary slot (an OID) loads as the name the catalog recorded, never as digits.

Server settings assumed for text values: DateStyle ISO, IntervalStyle postgres,
extra_float_digits > 0 (the three defaults), lc_monetary C for money's binary form. psycopg's C
loaders trust the lengths in binary values, so fixed-size values and binary arrays are checked
before they are read; a bad value is a :class:`ValueLoadError` (column index, type OID,
kind), or with :meth:`RowLoader.load_lenient` a :class:`RawValue` plus that error.

PostgreSQL itself cannot send an aclitem[] in a binary slot (no send function).

JSON
----
:func:`to_json_value` and :func:`dumps_row` render values as PostgreSQL's ``to_jsonb(row)``
does (see :func:`to_json_value`); timestamptz is written in UTC, as ``to_jsonb`` does with
``TimeZone=UTC``. orjson is used when installed (``postgres`` extra), else the standard
library (same output, checked by the live test). A float is a JSON number equal to
to_jsonb's (``1.0`` for ``1``; PostgreSQL's digits where repr's end on a midpoint, which
Ryu in PostgreSQL never writes); where a float becomes text (range bounds, geometric types
from a binary slot, text columns) it is :func:`pg_float_text`: float8out's or float4out's.
"""

from pgcdc.values._catalog import Catalog, LiveCatalog, PgComposite, TypeEntry
from pgcdc.values._json import dumps, dumps_images, dumps_row, to_json_value
from pgcdc.values._text import pg_cast_text, pg_text, range_text
from pgcdc.values._pgtext import pg_float_text
from pgcdc.values._rowloader import RowLoader
from pgcdc.values._special import (
    UNCHANGED,
    Float4Range,
    OutOfRange,
    PgInterval,
    RawValue,
    ValueLoadError,
)

__all__ = [
    "UNCHANGED",
    "Catalog",
    "Float4Range",
    "LiveCatalog",
    "PgComposite",
    "OutOfRange",
    "PgInterval",
    "RawValue",
    "RowLoader",
    "TypeEntry",
    "ValueLoadError",
    "dumps",
    "dumps_images",
    "dumps_row",
    "pg_cast_text",
    "pg_float_text",
    "pg_text",
    "range_text",
    "to_json_value",
]
