"""Values as JSON, the way PostgreSQL's ``to_jsonb(row)`` writes them."""

from __future__ import annotations

import json
import math
from functools import partial
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from ipaddress import IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface
from ipaddress import IPv6Network
from uuid import UUID

from psycopg.types.multirange import Multirange
from psycopg.types.range import Range

from pgcdc.values import _pgtext
from pgcdc.values._special import UNCHANGED, OutOfRange, PgInterval, RawValue
from pgcdc.values._text import pg_text, range_text

try:
    import orjson
except ImportError:  # the pure-json fallback below
    orjson = None

_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1
_FLOAT4, _FLOAT8, _FLOAT4_ARRAY = 700, 701, 1021


def _identity(v, oid=0):
    return v


def _float(v: float, oid=0):
    """A JSON number, which orjson writes with repr's digits: float8out's below 2**53. From
    there repr may end on a midpoint where PostgreSQL does not (3.224506757900573e16 for
    3.2245067579005728e+16): such a number is PostgreSQL's digits, as a Decimal, so that it
    equals ``to_jsonb``'s. A float of unknown type is taken for a float8."""
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    if -_pgtext.REPR_EXACT < v < _pgtext.REPR_EXACT:
        return v
    exact = Decimal(_pgtext.pg_float_text(v, oid == _FLOAT4))
    return v if exact == Decimal(repr(v)) else exact


def _float4(v: float, oid=0):
    return _float(v, _FLOAT4)


def _float4s(v):
    # a float4[]'s elements, at any depth
    if isinstance(v, list):
        return [_float4s(x) for x in v]
    return None if v is None else _float4(v)


def _decimal(v: Decimal, oid=0):
    # a finite Decimal stays: the dumpers write it as a JSON number with its exact digits
    if v.is_finite():
        return v
    if v.is_nan():
        return "NaN"
    return "Infinity" if v > 0 else "-Infinity"


def _int(v: int, oid=0):
    # orjson writes 64-bit integers only; larger ones (from json values) go as Decimal
    return v if _INT64_MIN <= v <= _UINT64_MAX else Decimal(v)


def _bytes(v, oid=0):
    return "\\x" + bytes(v).hex()


def _interval(v: timedelta, oid=0):
    if isinstance(v, PgInterval):
        return str(v)
    return _pgtext.format_interval(0, v.days, v.seconds * 1_000_000 + v.microseconds)


def _list(v: list, oid=0):
    return [to_json_value(x) for x in v]


def _dict(v: dict, oid=0):
    return {k: to_json_value(x) for k, x in v.items()}


def _out_of_range(v: OutOfRange, oid=0):
    return _pgtext.out_of_range_xsd(v.type_oid, v.text)


def _raw(v: RawValue, oid=0):
    if v.data is None:
        return None
    if v.kind == "t":
        try:
            return bytes(v.data).decode()
        except UnicodeDecodeError:
            pass
    return _bytes(v.data)


def _unchanged(v, oid=0):
    raise ValueError(
        "an UNCHANGED (unchanged TOAST) column has no JSON value: leave the column out or "
        "fill it from the previous row image first"
    )


def _range(v, oid=0):
    return range_text(v)


def _multirange(v, oid=0):
    return pg_text(v)


_BY_TYPE = {
    type(None): _identity,
    bool: _identity,
    str: _identity,
    int: _int,
    float: _float,
    Decimal: _decimal,
    bytes: _bytes,
    memoryview: _bytes,
    datetime: lambda v, oid=0: _pgtext.xsd_datetime(v),
    date: lambda v, oid=0: v.isoformat(),
    time: lambda v, oid=0: _pgtext.pg_time_text(v),
    timedelta: _interval,
    PgInterval: _interval,
    UUID: lambda v, oid=0: str(v),
    list: _list,
    dict: _dict,
    OutOfRange: _out_of_range,
    RawValue: _raw,
    type(UNCHANGED): _unchanged,
}
for _t in (IPv4Address, IPv4Interface, IPv4Network, IPv6Address, IPv6Interface, IPv6Network):
    _BY_TYPE[_t] = lambda v, oid=0: pg_text(v)


def _converter(value):
    conv = _BY_TYPE.get(type(value))
    if conv is not None:
        return conv
    if isinstance(value, Range):
        return _range
    if isinstance(value, Multirange):
        return _multirange
    for base, conv in _BY_TYPE.items():  # subclasses (e.g. of str, int, tuple-like)
        if base is not type(None) and isinstance(value, base):
            return conv
    if isinstance(value, tuple):
        return _list
    raise TypeError(f"no JSON rendering for a {type(value).__name__} value: {value!r}")


def _oid_text(v):
    # oid is not a JSON number for to_jsonb (its type category is not numeric)
    if isinstance(v, list):
        return [_oid_text(x) for x in v]
    return None if v is None else str(v)


def _int2vector(v):
    # int2vector and oidvector are arrays for to_jsonb; psycopg gives their text ("1 2 3")
    if isinstance(v, list):
        return [_int2vector(x) for x in v]
    return None if v is None else [int(x) for x in v.split()]


def _oidvector(v):
    if isinstance(v, list):
        return [_oidvector(x) for x in v]
    return None if v is None else v.split()


# type oid (and its array's) -> rendering that depends on the type, not only on the value
_BY_OID = {
    26: _oid_text,
    1028: _oid_text,
    22: _int2vector,
    1006: _int2vector,
    30: _oidvector,
    1013: _oidvector,
    _FLOAT4_ARRAY: _float4s,
}


def to_json_value(value, type_oid: int = 0):
    """``value`` (as loaded by :class:`RowLoader`) ready for :func:`dumps`: what PostgreSQL's
    ``to_jsonb`` gives for it. Numbers are JSON numbers (a finite ``Decimal`` stays a Decimal
    so its exact digits are written), NaN and infinities strings (``"NaN"``, ``"Infinity"``);
    date/timestamp/timestamptz in ISO 8601 (timestamptz in UTC: ``+00:00``); bytea ``\\x``
    hex; arrays nested lists; json/jsonb embedded; everything else PostgreSQL's text."""
    by_oid = _BY_OID.get(type_oid)
    if by_oid is not None and not isinstance(value, (RawValue, OutOfRange, type(UNCHANGED))):
        return by_oid(value)
    return _converter(value)(value, type_oid)


# --- dumping ---------------------------------------------------------------------------------


def _decimal_text(d: Decimal) -> str:
    return format(d, "f")


def _stdlib_dumps(obj) -> str:
    if isinstance(obj, Decimal):
        return _decimal_text(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_stdlib_dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_stdlib_dumps(v) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=False)


def dumps_stdlib(obj) -> bytes:
    """:func:`dumps` with the standard library only (used when orjson is not installed)."""
    return _stdlib_dumps(to_json_value(obj)).encode()


if orjson is not None:
    # orjson writes datetimes and dataclasses its own way: hand them (and every type it does
    # not know) to default, which renders them as to_jsonb does
    _OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS

    def _orjson_default(obj):
        t = type(obj)
        if t is Decimal and obj.is_finite():
            return orjson.Fragment(_decimal_text(obj))
        return (_BY_TYPE.get(t) or _converter(obj))(obj, 0)

    def dumps(obj) -> bytes:
        """JSON of a value tree from :func:`to_json_value` (Decimals as exact numbers)."""
        return orjson.dumps(obj, default=_orjson_default, option=_OPTIONS)

else:
    dumps = dumps_stdlib


# Column types whose loaded values orjson writes as to_jsonb does, or hands to the default
# hook above (Decimal, datetimes, ranges, ...): no per-value work in dumps_row.
_AS_IS = {16, 17, 18, 19, 20, 21, 23, 25, 1042, 1043, 1700, 2950, 1082, 1083, 1114, 1184, 1266}
_AS_IS |= {1000, 1001, 1002, 1003, 1005, 1007, 1009, 1014, 1015, 1016, 1231, 2951}
_plans: dict[tuple, tuple] = {}


def _renderer(oid: int):
    """How dumps_row prepares a column's values: None (as they are) or a function."""
    if orjson is not None and oid in _AS_IS:
        return None
    if oid == _FLOAT8:
        return _float
    if oid == _FLOAT4:
        return _float4
    return partial(_render_by_oid, oid)


def _render_by_oid(oid, v):
    return to_json_value(v, oid)


def _plan(type_oids) -> tuple:
    """((column index, renderer), ...) of the columns whose values need preparing."""
    key = tuple(type_oids)
    plan = _plans.get(key)
    if plan is None:
        plan = tuple((i, r) for i, r in enumerate(map(_renderer, key)) if r is not None)
        if len(_plans) > 10_000:
            _plans.clear()
        _plans[key] = plan
    return plan


def dumps_row(names, values, type_oids) -> bytes:
    """One JSON object ``{name: value}``, each value rendered by :func:`to_json_value`."""
    row = dict(zip(names, values))  # the values orjson writes as they are, in one C call
    for i, render in _plan(type_oids):
        value = values[i]
        if value is not None:
            row[names[i]] = render(value)
    try:
        return dumps(row)
    except TypeError:
        for value in values:  # orjson hides the renderer's error: raise it here
            to_json_value(value)
        raise


def dumps_images(ev) -> tuple[bytes | None, bytes | None]:
    """A change event's before and after images as JSON objects (None where it has none):
    before by the key columns when it is the key, after without its unchanged TOAST columns."""
    rel = ev.relation
    before = after = None
    if ev.before is not None:
        if ev.before_is_key:
            before = _as_bytes(dumps_row(rel.key_names, ev.before, rel.key_type_oids))
        else:
            before = _as_bytes(dumps_row(rel.names, ev.before, rel.value_type_oids))
    if ev.after is not None:
        if ev.unchanged:
            keep = [i for i, v in enumerate(ev.after) if v is not UNCHANGED]
            after = dumps_row(
                [rel.names[i] for i in keep],
                [ev.after[i] for i in keep],
                [rel.value_type_oids[i] for i in keep],
            )
        else:
            after = dumps_row(rel.names, ev.after, rel.value_type_oids)
        after = _as_bytes(after)
    return before, after


def _as_bytes(out) -> bytes:
    return out.encode() if isinstance(out, str) else out  # the stdlib fallback gives str


def dumps_row_stdlib(names, values, type_oids) -> bytes:
    """:func:`dumps_row` with the standard library only."""
    row = {n: to_json_value(v, oid) for n, v, oid in zip(names, values, type_oids)}
    return _stdlib_dumps(row).encode()
