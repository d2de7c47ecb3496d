"""Loaded values back as PostgreSQL's text: what the type's output function prints
(``SELECT v::text``) with DateStyle ISO, IntervalStyle postgres and TimeZone UTC, whichever
slot format the value came from. Range bounds, multiranges and text columns that hold another
type's values use it; ``to_jsonb``'s forms are in ``_json``."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from ipaddress import IPv4Address, IPv4Interface, IPv6Address, IPv6Interface, IPv6Network

from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from pgcdc.values import _pgtext
from pgcdc.values._special import Float4Range, OutOfRange, PgInterval

_FLOAT4, _INET = 700, 869
_IP = (IPv4Address, IPv6Address, IPv4Interface, IPv6Interface, IPv6Network)
_SPACE = set(" \t\n\r\v\f")  # C's isspace, which range_out asks (not Python's str.isspace)
_RANGE_SPECIAL = set('"\\()[],') | _SPACE


def _decimal_text(v: Decimal) -> str:
    if v.is_finite():
        return format(v, "f")  # numeric_out's digits: never an exponent
    if v.is_nan():
        return "NaN"
    return "Infinity" if v > 0 else "-Infinity"


def _interval_text(v: timedelta) -> str:
    if isinstance(v, PgInterval):
        return str(v)
    return _pgtext.format_interval(0, v.days, v.seconds * 1_000_000 + v.microseconds)


def _ipv6_text(ip: IPv6Address) -> str:
    """inet_net_ntop's form: ``::a.b.c.d`` and ``::ffff:a.b.c.d`` keep the IPv4 address
    dotted, where Python writes ``::102:304`` (before 3.13)."""
    words = ip.packed
    if not any(words[:10]) and words[10:12] in (b"\xff\xff", b"\0\0"):
        head = "::ffff:" if words[10] else "::"
        if head == "::ffff:" or any(words[12:14]):  # else the zeros run on: ::1, not ::0.0.0.1
            return head + str(IPv4Address(words[12:]))
    return str(ip)


def _ip_text(v) -> str:
    if isinstance(v, IPv6Interface):  # before IPv6Address, its base class
        return f"{_ipv6_text(v.ip)}/{v.network.prefixlen}"
    if isinstance(v, IPv6Address):
        return _ipv6_text(v)
    if isinstance(v, IPv6Network):
        return f"{_ipv6_text(v.network_address)}/{v.prefixlen}"
    return str(v)


# type -> text; a bool before int (it is one), a datetime before date (the same)
_BY_TYPE = (
    (bool, lambda v, oid: "t" if v else "f"),
    (float, lambda v, oid: _pgtext.pg_float_text(v, oid == _FLOAT4)),
    (int, lambda v, oid: str(v)),
    (str, lambda v, oid: v),
    (Decimal, lambda v, oid: _decimal_text(v)),
    (datetime, lambda v, oid: _pgtext.pg_datetime_text(v)),
    (date, lambda v, oid: _pgtext.pg_date_text(v)),
    (time, lambda v, oid: _pgtext.pg_time_text(v)),
    (timedelta, lambda v, oid: _interval_text(v)),
    ((bytes, bytearray, memoryview), lambda v, oid: "\\x" + bytes(v).hex()),
    (OutOfRange, lambda v, oid: v.text),
    (_IP, lambda v, oid: _ip_text(v)),
    (Range, lambda v, oid: range_text(v)),
    (Multirange, lambda v, oid: "{" + ",".join(range_text(r) for r in v) + "}"),
)


def pg_text(value, type_oid: int = 0) -> str:
    """A scalar value as PostgreSQL prints it: ``t``/``f``, float4out/float8out (float4
    when ``type_oid`` is float4's), numeric's digits, ISO dates and times (timestamptz in UTC
    as ``+00``), intervals, ``\\x`` hex, ranges and multiranges; uuid, inet, cidr, enums and
    the types loaded as text by ``str``."""
    for kind, text in _BY_TYPE:
        if isinstance(value, kind):
            return text(value, type_oid)
    if isinstance(value, (list, dict)):
        raise TypeError(f"pg_text renders scalars, not a {type(value).__name__}")
    return str(value)


def pg_cast_text(value, type_oid: int = 0) -> str:
    """A scalar value as ``value::text`` gives it, which is what ``ALTER COLUMN ... TYPE
    text`` writes: :func:`pg_text`, but for the types whose cast to text is not their output
    function: bool (``true``/``false``) and inet (always with its mask)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_oid == _INET and type(value) in (IPv4Address, IPv6Address):  # no mask of its own
        return f"{_ip_text(value)}/{value.max_prefixlen}"
    return pg_text(value, type_oid)


def _bound_text(v, float4: bool) -> str:
    text = pg_text(v, _FLOAT4 if float4 else 0)
    if text == "" or any(c in _RANGE_SPECIAL for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    return text


def range_text(r: Range) -> str:
    """A Range as PostgreSQL's range_out prints it (float bounds as float8out does, or as
    float4out does in a :class:`Float4Range`)."""
    if r.isempty:
        return "empty"
    float4 = isinstance(r, Float4Range)
    lo = "" if r.lower is None else _bound_text(r.lower, float4)
    hi = "" if r.upper is None else _bound_text(r.upper, float4)
    return f"{'[' if r.lower_inc else '('}{lo},{hi}{']' if r.upper_inc else ')'}"
