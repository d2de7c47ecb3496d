"""The values that are not plain Python values: unchanged TOAST, raw bytes that did not load,
values Python's types cannot hold, PostgreSQL intervals, and ranges over float4."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from psycopg.types.range import Range
from pgcdc.errors import DataError

from pgcdc.values._pgtext import format_interval


class _Unchanged:
    """The type of :data:`UNCHANGED`; there is one instance."""

    __slots__ = ()
    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"  # pickles as the module attribute: stays the singleton

    def __bool__(self) -> bool:
        # truth-testing a column value should not silently treat "unchanged" as "empty"
        raise TypeError("UNCHANGED has no truth value: compare with `is UNCHANGED`")


#: A column whose value the server did not send because it is an unchanged TOASTed value
#: (TupleData kind 'u'). Never ``None``: ``None`` is SQL NULL.
UNCHANGED = _Unchanged()


@dataclass(frozen=True, slots=True)
class RawValue:
    """A column value that did not load (lenient mode): the kind ('t' or 'b'), the bytes as
    the server sent them and the column's type OID."""

    kind: str
    data: bytes | None
    type_oid: int


class ValueLoadError(DataError, ValueError):
    """A column value that does not load as its type. ``column`` is the 0-based column index,
    ``type_oid`` the column's type and ``kind`` 't' (text) or 'b' (binary); ``name`` and
    ``type_name`` the column's and its type's names when the loader knows them."""

    def __init__(
        self, column: int, type_oid: int, kind: str, message: str, name=None, type_name=None
    ):
        self.column = column
        self.type_oid = type_oid
        self.kind = kind
        self.message = message
        self.name = name
        self.type_name = type_name
        fmt = {"t": "text", "b": "binary"}.get(kind, repr(kind))
        if name is None:
            where = f"column {column} (type oid {type_oid}, {fmt} value)"
        else:
            typ = f"type {type_name}, oid {type_oid}" if type_name else f"type oid {type_oid}"
            where = f"column {name!r} (#{column}, {typ}, {fmt} value)"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # pickled by Spark with the events that carry it
        args = (self.column, self.type_oid, self.kind, self.message, self.name, self.type_name)
        return (type(self), args)


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """A date/time value PostgreSQL holds but Python's ``datetime`` types cannot: infinity
    (``'infinity'``, ``'-infinity'``), years before 1 AD or after 9999, and ``24:00:00``.

    ``text`` is PostgreSQL's text output for it in DateStyle ISO, with timestamptz in UTC
    (e.g. ``'10000-01-01 00:00:00+00'``, ``'0044-03-15 BC'``), whichever slot format it came
    from, so a text slot and a binary slot give equal values."""

    type_oid: int
    text: str

    @property
    def is_infinite(self) -> bool:
        return self.text in ("infinity", "-infinity")


class Float4Range(Range):
    """A range whose subtype is float4 (a user's range type, ``CREATE TYPE ... AS RANGE
    (subtype = float4)``): its bounds are floats like any range's, and it says they print as
    float4out prints them (``1e+06``), where a float8 range's print as float8out does
    (``1000000``). Equal to a ``Range`` with the same bounds, like psycopg's own subclasses."""

    # no __slots__ of its own: Range.__getstate__ pickles the slots self.__slots__ names


def _months_to_days(months: int) -> int:
    # psycopg's rule (types/datetime.py): a year is 365 days, a month 30 days
    years, rest = divmod(abs(months), 12)
    days = 365 * years + 30 * rest
    return days if months >= 0 else -days


class PgInterval(timedelta):
    """A PostgreSQL interval: a ``timedelta`` equal to what psycopg returns (a month counts
    30 days, a year 365), that also keeps PostgreSQL's three fields (``months``, ``days``,
    ``micros``) so the value renders exactly as PostgreSQL prints it (``str(value)``)."""

    __slots__ = ("months", "pg_days", "micros")

    def __new__(cls, months: int, days: int, micros: int) -> PgInterval:
        self = super().__new__(cls, days=days + _months_to_days(months), microseconds=micros)
        self.months = months
        self.pg_days = days
        self.micros = micros
        return self

    def __repr__(self) -> str:
        return f"PgInterval(months={self.months}, days={self.pg_days}, micros={self.micros})"

    def __str__(self) -> str:
        return format_interval(self.months, self.pg_days, self.micros)

    def __reduce__(self):
        return (PgInterval, (self.months, self.pg_days, self.micros))

    # timedelta's __eq__ and __hash__ compare the duration; PostgreSQL's interval '1 mon' equals
    # '30 days' too, so the inherited comparison is the right one.
