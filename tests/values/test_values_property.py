"""Property: for values hypothesis draws, a real server's binary send format and its text
output (what a binary and a text slot send, made by the same type functions) load to the same
value through ``pgcdc.values.RowLoader``: the same Python type and the same ``to_jsonb``
rendering. PostgreSQL 15 and 18; the server parses each drawn literal, so the values are
what PostgreSQL holds, not what this test thinks it holds.

Covers the built-in scalar types, ``"char"`` over every byte 0-255, NaN and infinities
(float, numeric, dates and timestamps), and empty, NULL-holding and multi-dimensional arrays.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pgcdc.values import RowLoader, dumps, to_json_value  # noqa: E402


@dataclass(frozen=True)
class _Col:  # a TupleData column as RowLoader takes it
    kind: str
    value: bytes


def _float_text(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x)


_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40)
_SPECIAL_DATES = st.sampled_from(["infinity", "-infinity", "0044-03-15 BC", "10000-01-01"])
_TIMES = st.datetimes().map(lambda d: d.isoformat(sep=" "))


def _array_literal(values, render) -> str:
    """A PostgreSQL array literal of nested lists (NULL for None)."""
    if isinstance(values, list):
        return "{" + ",".join(_array_literal(v, render) for v in values) + "}"
    return "NULL" if values is None else render(values)


def _rectangular(elements, max_dims=3):
    """Nested lists of one shape per level (PostgreSQL arrays are rectangular), maybe empty."""
    return st.lists(st.integers(1, 3), min_size=1, max_size=max_dims).flatmap(
        lambda shape: _shaped(elements, shape)
    ) | st.just([])


def _shaped(elements, shape):
    if len(shape) == 1:
        return st.lists(st.none() | elements, min_size=shape[0], max_size=shape[0])
    return st.lists(_shaped(elements, shape[1:]), min_size=shape[0], max_size=shape[0])


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# (SQL type, strategy of the literal's text, SQL expression of the parameter $1)
CASES = [
    ("bool", st.booleans().map(lambda b: "t" if b else "f"), "$1::bool"),
    ("int2", st.integers(-(2**15), 2**15 - 1).map(str), "$1::int2"),
    ("int4", st.integers(-(2**31), 2**31 - 1).map(str), "$1::int4"),
    ("int8", st.integers(-(2**63), 2**63 - 1).map(str), "$1::int8"),
    ("float4", st.floats(width=32).map(_float_text), "$1::float4"),
    ("float8", st.floats().map(_float_text), "$1::float8"),
    (
        "numeric",
        st.decimals(allow_nan=False, allow_infinity=False, places=None).map(str)
        | st.sampled_from(["NaN", "Infinity", "-Infinity", "0.000", "-0", "1e-300"]),
        "$1::numeric",
    ),
    ("text", _TEXT, "$1::text"),
    ("varchar", _TEXT, "$1::varchar"),
    ("bpchar", _TEXT, "$1::char(12)"),
    # int4 -> "char" takes a signed byte: -128..-1 are the bytes 0x80..0xFF
    (
        '"char"',
        st.integers(0, 255).map(lambda b: str(b - 256 if b > 127 else b)),
        '$1::int4::"char"',
    ),  # fmt: skip
    ("bytea", st.binary(max_size=40).map(lambda b: "\\x" + b.hex()), "$1::bytea"),
    ("date", st.dates().map(str) | _SPECIAL_DATES, "$1::date"),
    ("timestamp", _TIMES | _SPECIAL_DATES, "$1::timestamp"),
    ("timestamptz", _TIMES.map(lambda t: t + "+05:30") | _SPECIAL_DATES, "$1::timestamptz"),
    ("time", st.times().map(str), "$1::time"),
    ("timetz", st.times().map(lambda t: f"{t}-02"), "$1::timetz"),
    (
        "interval",
        st.tuples(
            st.integers(-1000, 1000), st.integers(-(10**5), 10**5), st.integers(-(10**12), 10**12)
        ).map(lambda t: f"{t[0]} mons {t[1]} days {t[2]} microseconds"),
        "$1::interval",
    ),  # fmt: skip
    ("uuid", st.uuids().map(str), "$1::uuid"),
    (
        "jsonb",
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | _TEXT
            | st.floats(allow_nan=False, allow_infinity=False),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(_TEXT, c, max_size=3),
            max_leaves=8,
        ).map(json.dumps),
        "$1::jsonb",
    ),  # fmt: skip
    ("inet", st.ip_addresses().map(str), "$1::inet"),
    (
        "int4[]",
        _rectangular(st.integers(-(2**31), 2**31 - 1)).map(lambda v: _array_literal(v, str)),
        "$1::int4[]",
    ),  # fmt: skip
    (
        "float8[]",
        _rectangular(st.floats()).map(lambda v: _array_literal(v, _float_text)),
        "$1::float8[]",
    ),  # fmt: skip
    (
        "text[]",
        _rectangular(_TEXT).map(lambda v: _array_literal(v, _quoted)),
        "$1::text[]",
    ),  # fmt: skip
    (
        "numeric[]",
        _rectangular(st.sampled_from(["1.50", "NaN", "-Infinity", "0"])).map(
            lambda v: _array_literal(v, str)
        ),
        "$1::numeric[]",
    ),  # fmt: skip
    (
        "date[]",
        _rectangular(_SPECIAL_DATES).map(lambda v: _array_literal(v, _quoted)),
        "$1::date[]",
    ),  # fmt: skip
]


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def server(pg, request):
    with pg.database(request.param) as srv, srv.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")  # as a walsender sends timestamptz text
        yield conn


def _both_formats(conn, expr: str, literal: str) -> tuple[int, bytes, bytes]:
    """(type OID, text output, binary send) of ``expr`` with $1 = ``literal``, as the server
    makes them."""
    pg = conn.pgconn
    sql = f"SELECT {expr}".encode()
    out = []
    for fmt in (0, 1):
        res = pg.exec_params(sql, [literal.encode()], result_format=fmt)
        if res.status != 2:  # PGRES_TUPLES_OK
            raise ValueError(res.error_message.decode(errors="replace"))
        out.append((res.ftype(0), res.get_value(0, 0)))
    (oid, text), (_, binary) = out
    return oid, text, binary


def _rendered(value, oid: int) -> str:
    out = dumps(to_json_value(value, oid))
    return out.decode() if isinstance(out, bytes) else out


def _kinds(value):
    if isinstance(value, list):
        return [_kinds(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("typ,literals,expr", CASES, ids=[c[0] for c in CASES])
def test_binary_and_text_load_the_same(server, typ, literals, expr):
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(literals)
    def check(literal):
        try:
            oid, text, binary = _both_formats(server, expr, literal)
        except ValueError as e:  # out of the type's range: the server says so
            hypothesis.note(f"{literal!r}: {e}")
            hypothesis.assume(False)
        loader = RowLoader([oid])
        from_text = loader.load([_Col("t", text)])[0]
        from_binary = loader.load([_Col("b", binary)])[0]
        assert _kinds(from_binary) == _kinds(from_text), (literal, text)
        assert _rendered(from_binary, oid) == _rendered(from_text, oid), (literal, text)

    check()
