"""psycopg loaders for the values of a replication stream, registered in a private
``AdaptersMap`` (psycopg's global adapters are not touched).

psycopg's own C loaders do the work where they are exact. The loaders here cover what psycopg
cannot do offline or does differently for text and binary values:

- date/time values Python cannot hold (infinity, BC, after 9999, 24:00:00) become
  :class:`OutOfRange` instead of raising;
- intervals keep PostgreSQL's fields (:class:`PgInterval`);
- a binary float4 is read as the shortest decimal, as the text form is; a range over float4
  (a user's type, through the catalog) loads as :class:`Float4Range`, so that its bounds
  print as float4out prints them;
- json/jsonb keep the exact digits of their numbers (``Decimal``);
- the built-in types psycopg leaves as text in a text slot (money, geometric types, bit
  strings, tsvector, ...) give the same text from their binary form.

Arrays, ranges and multiranges use psycopg's loaders, which look their element loaders up in
this map, so the rules above apply inside them too.
"""

from __future__ import annotations

import json
import struct
from datetime import date, datetime, time
from decimal import Decimal
from functools import partial

import psycopg
from psycopg import postgres, pq
from psycopg.adapt import AdaptersMap, Loader
from psycopg.types import TypeInfo, array, json as pg_json
from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from pgcdc.values import _binary_text, _pgtext
from pgcdc.values._special import Float4Range, OutOfRange, PgInterval

TEXT, BINARY = pq.Format.TEXT, pq.Format.BINARY

DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
FLOAT4 = 700

# Built-in types psycopg's registry lacks (oid, array oid, delimiter).
EXTRA_TYPES = (TypeInfo("pg_snapshot", 5038, 5039),)


def _native(oid: int, fmt: pq.Format) -> type[Loader]:
    cls = psycopg.adapters.get_loader(oid, fmt)
    if cls is None:
        raise LookupError(f"psycopg has no loader for oid {oid} format {fmt.name}")
    return cls


class _Wrapped(Loader):
    """psycopg's own loader first; :meth:`fallback` when it raises."""

    native_oid = 0

    def __init__(self, oid: int, context=None):
        super().__init__(oid, context)
        self._load = _native(self.native_oid, self.format)(oid, context).load

    def load(self, data):
        try:
            return self._load(data)
        except (psycopg.DataError, ValueError, OverflowError):
            return self.fallback(data)

    def fallback(self, data):
        raise NotImplementedError


# --- dates and times -------------------------------------------------------------------------


def _ts_text(oid: int, data) -> OutOfRange:
    usec, has_time = _pgtext.parse_datetime_text(bytes(data).decode())
    if oid == DATE:
        if usec in (_pgtext.TS_PINF, _pgtext.TS_NINF):
            return OutOfRange(oid, "infinity" if usec > 0 else "-infinity")
        return OutOfRange(oid, _pgtext.format_date(usec // _pgtext.USECS_PER_DAY))
    return OutOfRange(oid, _pgtext.format_timestamp(usec, oid == TIMESTAMPTZ))


class DateLoader(_Wrapped):
    native_oid = DATE

    def fallback(self, data):
        return _ts_text(DATE, data)


class DateBinaryLoader(_Wrapped):
    format = BINARY
    native_oid = DATE

    def fallback(self, data):
        return OutOfRange(DATE, _pgtext.format_date(struct.unpack("!i", data)[0]))


class TimestampLoader(_Wrapped):
    native_oid = TIMESTAMP

    def fallback(self, data):
        return _ts_text(TIMESTAMP, data)


class TimestampBinaryLoader(_Wrapped):
    format = BINARY
    native_oid = TIMESTAMP

    def fallback(self, data):
        return OutOfRange(TIMESTAMP, _pgtext.format_timestamp(struct.unpack("!q", data)[0], False))


class TimestamptzLoader(_Wrapped):
    native_oid = TIMESTAMPTZ

    def fallback(self, data):
        return _ts_text(TIMESTAMPTZ, data)


class TimestamptzBinaryLoader(_Wrapped):
    format = BINARY
    native_oid = TIMESTAMPTZ

    def fallback(self, data):
        return OutOfRange(TIMESTAMPTZ, _pgtext.format_timestamp(struct.unpack("!q", data)[0], True))


class TimeLoader(_Wrapped):
    native_oid = TIME

    def fallback(self, data):  # only 24:00:00 does not fit datetime.time
        text = bytes(data).decode()
        if not text.startswith("24:00:00"):
            raise psycopg.DataError(f"time out of range: {text!r}")
        return OutOfRange(TIME, text)


class TimeBinaryLoader(_Wrapped):
    format = BINARY
    native_oid = TIME

    def fallback(self, data):
        return OutOfRange(TIME, _pgtext.format_time(struct.unpack("!q", data)[0]))


class TimetzLoader(_Wrapped):
    native_oid = TIMETZ

    def fallback(self, data):
        text = bytes(data).decode()
        if not text.startswith("24:00:00"):
            raise psycopg.DataError(f"timetz out of range: {text!r}")
        return OutOfRange(TIMETZ, text)


class TimetzBinaryLoader(_Wrapped):
    format = BINARY
    native_oid = TIMETZ

    def fallback(self, data):
        usec, west = struct.unpack("!qi", data)
        return OutOfRange(TIMETZ, _pgtext.format_time(usec) + _pgtext._offset_text(-west, False))


# --- intervals -------------------------------------------------------------------------------


def _interval(months: int, days: int, usec: int):
    text = None
    if (months, days) in ((0x7FFFFFFF, 0x7FFFFFFF), (-0x80000000, -0x80000000)):
        text = _pgtext.format_interval(months, days, usec)
        if text in ("infinity", "-infinity"):
            return OutOfRange(INTERVAL, text)
    try:
        return PgInterval(months, days, usec)
    except OverflowError:  # beyond timedelta's +-999999999 days
        return OutOfRange(INTERVAL, text or _pgtext.format_interval(months, days, usec))


class IntervalLoader(Loader):
    def load(self, data):
        return _interval(*_pgtext.parse_interval_text(bytes(data).decode()))


class IntervalBinaryLoader(Loader):
    format = BINARY

    def load(self, data):
        usec, days, months = struct.unpack("!qii", data)
        return _interval(months, days, usec)


# --- numbers, json ---------------------------------------------------------------------------


class Float4BinaryLoader(Loader):
    format = BINARY

    def load(self, data):
        return _pgtext.float4_shortest(struct.unpack("!f", data)[0])


def _float4_range(r: Range) -> Float4Range:
    return Float4Range(empty=True) if r.isempty else Float4Range(r.lower, r.upper, r.bounds)


def float4_range_loader(cls: type[Loader]) -> type[Loader]:
    """psycopg's loader ``cls`` of a range (or multirange) over float4, loading
    :class:`Float4Range` values: a range does not know its subtype, and its text needs it."""

    class _Loader(cls):
        def load(self, data):
            value = super().load(data)
            if isinstance(value, Multirange):
                return Multirange(map(_float4_range, value))
            return _float4_range(value)

    _Loader.__name__ = f"Float4{cls.__name__}"
    return _Loader


json_loads = partial(json.loads, parse_float=Decimal)


# --- types psycopg keeps as text: their binary form gives the same text --------------------


def _text_from_binary(convert):
    class _Loader(Loader):
        format = BINARY

        def load(self, data):
            return convert(data)

    _Loader.__name__ = f"{convert.__name__.title()}BinaryTextLoader"
    return _Loader


WRAPPED = (
    (DATE, DateLoader),
    (DATE, DateBinaryLoader),
    (TIMESTAMP, TimestampLoader),
    (TIMESTAMP, TimestampBinaryLoader),
    (TIMESTAMPTZ, TimestamptzLoader),
    (TIMESTAMPTZ, TimestamptzBinaryLoader),
    (TIME, TimeLoader),
    (TIME, TimeBinaryLoader),
    (TIMETZ, TimetzLoader),
    (TIMETZ, TimetzBinaryLoader),
)


def build_adapters(careful: bool) -> AdaptersMap:
    """``careful``: the date/time loaders turn what psycopg rejects into OutOfRange. Without
    it psycopg's C loaders raise on those values; RowLoader uses that map for whole rows (no
    Python call per date value) and loads a row that raised again with the careful one."""
    adapters = AdaptersMap(psycopg.adapters)
    for info in EXTRA_TYPES:
        info.register(adapters)
    for oid, loader in (
        *(WRAPPED if careful else ()),
        (INTERVAL, IntervalLoader),
        (INTERVAL, IntervalBinaryLoader),
        (FLOAT4, Float4BinaryLoader),
    ):
        adapters.register_loader(oid, loader)
    for oid, convert in _binary_text.CONVERTERS.items():
        adapters.register_loader(oid, _text_from_binary(convert))
    pg_json.set_json_loads(json_loads, adapters)
    # Arrays of every built-in type, so their elements use the loaders above.
    for info in (*postgres.types, *EXTRA_TYPES):
        if info.array_oid:
            array.register_array(info, adapters)
    return adapters


#: Array types of the built-in types (their binary values are checked before psycopg reads them)
ARRAY_OIDS = frozenset(i.array_oid for i in (*postgres.types, *EXTRA_TYPES) if i.array_oid)
ADAPTERS = build_adapters(careful=True)
FAST_ADAPTERS = build_adapters(careful=False)


class AdaptContext:
    """What psycopg's Transformer wants as a context, without a connection."""

    def __init__(self, adapters: AdaptersMap):
        self.adapters = adapters
        self.connection = None


#: Python types the loaders give for date/time values (OutOfRange aside).
DATETIME_TYPES = (date, datetime, time)
