"""Floats as text, against real PostgreSQL 15 and 18: wherever pgcdc turns a float4 or float8
into text, it must print what the server's float4out/float8out print (the fewest digits that
read back, never a midpoint's; exponent form below 1e-4 and from 1e15, or 1e6 for float4;
``-0``, ``NaN``, ``Infinity``).

A table holds floats alone, in arrays, in ranges and multiranges of user types over float8
and float4 (and over a domain over float4), in arrays of those ranges, in a composite and in
a point. Its rows are captured through a text and a binary pgoutput slot and loaded with the
capture's catalog; each value's rendering (the JSON line of ``pgcdc changes``, the Spark
value of an applied table, ``pg_float_text``) must equal ``value::text`` as the server
prints it.

The formatter alone: hypothesis draws floats (doubles, float32s, powers of two where the
gap below is half the gap above), and one query per draw has the server print them all.
"""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pgcdc.events.reader import EventReader  # noqa: E402
from pgcdc.events.jsonlines import EventRenderer  # noqa: E402
from pgcdc.spark import types as pgtypes  # noqa: E402
from pgcdc.values import Catalog, pg_float_text, range_text, to_json_value  # noqa: E402
from pgcdc.values._pgtext import float4_shortest  # noqa: E402
from tests.postgres import capture  # noqa: E402
from tests.postgres.capture import Options  # noqa: E402

FLOAT8 = [
    "1", "4.5", "-2", "100", "0.1", "0.30000000000000004", "1e14", "1e15", "1e16", "1e-5",
    "1e-4", "0.0001", "0.00012345", "123456789012345680", "9007199254740993",
    "1.7976931348623157e308", "5e-324", "2.2250738585072014e-308", "1e22", "-1e-300",
    "123456.789", "3.2245067579005728e16", "'-0'", "0", "'NaN'", "'Infinity'", "'-Infinity'",
]  # fmt: skip
FLOAT4 = [
    "1", "4.5", "0.1", "1e6", "1e5", "999999", "1234567", "3.4028235e38", "1.17549435e-38",
    "1e-45", "16777217", "2.0^(-96)", "2.0^87", "2.0^90", "123456.7", "1e-5", "0.0001", "-3.25",
    "'-0'", "0", "'NaN'", "'Infinity'", "'-Infinity'",
]  # fmt: skip
N = max(len(FLOAT8), len(FLOAT4))

SCHEMA = [
    "CREATE TYPE floatrange AS RANGE (subtype = float8, multirange_type_name = floatmultirange)",
    "CREATE TYPE float4range AS RANGE (subtype = float4, multirange_type_name = float4multi)",
    "CREATE DOMAIN f4 AS float4",
    "CREATE TYPE f4drange AS RANGE (subtype = f4)",
    "CREATE TYPE fpair AS (a float4, b float8, r floatrange, r4 float4range)",
    """CREATE TABLE floats (id int4 PRIMARY KEY, f4 float4, f8 float8, a4 float4[],
        a8 float8[], r floatrange, r4 float4range, rd f4drange, m floatmultirange,
        m4 float4multi, ra floatrange[], p fpair, pt point)""",
    "CREATE PUBLICATION floats_pub FOR TABLE floats",
    "SELECT pg_create_logical_replication_slot('floats_slot', 'pgoutput')",
]
BOUNDS = ["[)", "(]", "[]", "()"]


def _row(i: int) -> str:
    """Row ``i``: the i-th edge values, and ranges between neighbouring ones."""
    x8, y8 = f"({FLOAT8[i % len(FLOAT8)]})::float8", f"({FLOAT8[(i + 1) % len(FLOAT8)]})::float8"
    x4, y4 = f"({FLOAT4[i % len(FLOAT4)]})::float4", f"({FLOAT4[(i + 3) % len(FLOAT4)]})::float4"
    b = BOUNDS[i % len(BOUNDS)]
    r8 = f"floatrange(least({x8}, {y8}), greatest({x8}, {y8}), '{b}')"
    r4 = f"float4range(least({x4}, {y4}), greatest({x4}, {y4}), '{b}')"
    rd = f"f4drange(least({x4}, {y4})::f4, greatest({x4}, {y4})::f4, '{b}')"
    half = f"floatrange({x8}, NULL)" if i % 2 else f"floatrange(NULL, {x8})"
    return (
        f"INSERT INTO floats VALUES ({i}, {x4}, {x8}, ARRAY[{x4}, NULL, {y4}], ARRAY[{x8}, {y8}],"
        f" {r8}, {r4}, {rd}, floatmultirange({r8}, floatrange(greatest({x8}, {y8}), NULL, '()')),"
        f" float4multi({r4}, float4range(NULL, least({x4}, {y4}), '()')),"
        f" ARRAY[{r8}, {half}, 'empty'], ROW({x4}, {x8}, {r8}, {r4})::fpair, point({x8}, {y8}))"
    )


# what the server prints, column by column; arrays element by element
TEXTS = """SELECT id, f4::text, f8::text, r::text, r4::text, rd::text, m::text, m4::text,
    ARRAY(SELECT x::text FROM unnest(a4) x), ARRAY(SELECT x::text FROM unnest(a8) x),
    ARRAY(SELECT x::text FROM unnest(ra) x),
    (p).a::text, (p).b::text, (p).r::text, (p).r4::text, pt::text, to_jsonb(t)::text
  FROM floats t ORDER BY id"""
COLUMNS = ("f4", "f8", "r", "r4", "rd", "m", "m4", "a4", "a8", "ra", "pa", "pb", "pr", "pr4", "pt")


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def server_capture(pg, request):
    """(connection, {id: server texts}, {id: to_jsonb}, catalog, {slot format: events})."""
    with pg.database(request.param) as srv, srv.connect() as conn:
        for stmt in SCHEMA + [_row(i) for i in range(N)]:
            conn.execute(stmt)
        texts, jsonb = {}, {}
        for row in conn.execute(TEXTS).fetchall():
            texts[row[0]] = dict(zip(COLUMNS, row[1:-1]))
            jsonb[row[0]] = _exact(row[-1])
        catalog = Catalog.from_connection(conn)
        origin = None if srv.major < 16 else "any"
        events = {}
        for binary in (False, True):
            opts = Options(
                2, binary, "off", messages=False, origin=origin, publication="floats_pub"
            )
            records = capture.sql_capture(conn, "floats_slot", opts)
            events["binary" if binary else "text"] = list(
                EventReader(catalog=catalog).read(records)
            )
        yield conn, texts, jsonb, catalog, events


def _exact(text) -> dict:
    return json.loads(text, parse_float=Decimal)


def _rows(events) -> dict:
    return {ev.after_dict()["id"]: ev for ev in events}


def _loaded(ev) -> dict:
    """Column -> (value, type OID as loaded) of an event's new row."""
    rel = ev.relation
    return {n: (v, o) for n, v, o in zip(rel.names, ev.after, rel.value_type_oids)}


def _element_text(x, float4: bool):
    if x is None:
        return None
    return pg_float_text(x, float4) if isinstance(x, float) else range_text(x)


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_every_float_prints_as_the_server_prints_it(server_capture, fmt):
    _, texts, _, _, events = server_capture
    rows = _rows(events[fmt])
    assert sorted(rows) == sorted(texts) == list(range(N))
    for row_id, want in texts.items():
        got = _loaded(rows[row_id])
        p = got["p"][0]
        rendered = {
            "f4": pg_float_text(got["f4"][0], float4=True),
            "f8": pg_float_text(got["f8"][0]),
            "a4": [_element_text(x, True) for x in got["a4"][0]],
            "a8": [_element_text(x, False) for x in got["a8"][0]],
            "ra": [_element_text(x, False) for x in got["ra"][0]],
            "pa": pg_float_text(p["a"], float4=True),
            "pb": pg_float_text(p["b"]),
            "pr": range_text(p["r"]),
            "pr4": range_text(p["r4"]),
            "pt": got["pt"][0],  # a binary slot's point is printed from its two float8s
        }
        for c in ("r", "r4", "rd", "m", "m4"):
            rendered[c] = to_json_value(*got[c])
        assert rendered == want, (fmt, row_id)


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_changes_lines_are_what_to_jsonb_gives(server_capture, fmt):
    """``pgcdc changes``: ranges are strings, exactly the server's; numbers are equal (jsonb
    holds a float4's digits as numeric: 3.4028235e+38 is 340282350000000000000000000000000000000
    there)."""
    _, _, jsonb, _, events = server_capture
    render = EventRenderer().render
    for ev in events[fmt]:
        after = _exact(render(ev))["after"]
        assert after == jsonb[after["id"]], (fmt, after["id"])


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_streaming_rows_hold_what_to_jsonb_gives(server_capture, fmt):
    """``format("pgcdc")``'s after_json, rendered a column at a time."""
    pytest.importorskip("pyspark")
    from pgcdc.streaming import event_rows as source

    _, _, jsonb, _, events = server_capture
    for text in source.events_batch(events[fmt]).column("after_json").to_pylist():
        after = _exact(text)
        assert after == jsonb[after["id"]], (fmt, after["id"])


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_applied_tables_hold_the_servers_text(server_capture, fmt):
    """What apply writes: a range's (or a point's) text column, its elements in an array, its
    fields in a struct; a float column retyped between versions (a text column) holds the
    float's text."""
    _, texts, _, catalog, events = server_capture
    rows = _rows(events[fmt])
    for row_id, want in texts.items():
        ev = rows[row_id]
        rel = ev.relation
        spark = {}
        for name, v, oid, mod in zip(rel.names, ev.after, rel.type_oids, rel.type_modifiers):
            spark[name] = pgtypes.value_converter(oid, mod, catalog)(v)
        texts = ("r", "r4", "rd", "m", "m4", "ra", "pt")
        assert {c: spark[c] for c in texts} == {c: want[c] for c in texts}, (fmt, row_id)
        assert (spark["p"]["r"], spark["p"]["r4"]) == (want["pr"], want["pr4"])
        f4, f8 = _loaded(ev)["f4"][0], _loaded(ev)["f8"][0]
        assert pgtypes.text_converter(700)(f4) == want["f4"], (fmt, row_id)
        assert pgtypes.text_converter(701)(f8) == want["f8"], (fmt, row_id)


# --- the formatter alone ---------------------------------------------------------------------

_F4 = struct.Struct("!f")


def _float32(x: float) -> float:
    return _F4.unpack(_F4.pack(x))[0]


_DOUBLES = st.floats() | st.integers(-1074, 1023).map(lambda e: math.ldexp(1.0, e))
_FLOAT32S = st.floats(width=32) | st.integers(-149, 127).map(lambda e: math.ldexp(1.0, e))


@pytest.mark.parametrize("kind", ["float8", "float4"])
def test_pg_float_text_is_what_the_server_prints(server_capture, kind):
    conn = server_capture[0]
    float4 = kind == "float4"
    sql = f"SELECT x::{kind}::text FROM unnest(%b::float8[]) WITH ORDINALITY u(x, n) ORDER BY n"

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(st.lists(_FLOAT32S if float4 else _DOUBLES, min_size=1, max_size=60))
    def check(values):
        printed = [r[0] for r in conn.execute(sql, [values]).fetchall()]
        assert [pg_float_text(x, float4) for x in values] == printed
        if float4:  # a binary float4 loads as the double of the text a text slot sends
            for x, text in zip(values, printed):
                loaded = float4_shortest(_float32(x))
                if text == "NaN":
                    assert math.isnan(loaded)
                    continue
                sign = -1.0 if text.startswith("-") else 1.0
                assert (loaded, math.copysign(1.0, loaded)) == (float(text), sign), text

    check()
