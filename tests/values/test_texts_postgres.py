"""Values as text, against real PostgreSQL 15 and 18: wherever pgcdc turns a loaded value back
into PostgreSQL's text (a range's bounds, a multirange, a column whose type changed and so is
held as text), it must print what the server's output function prints: ``t``/``f``, times
and timestamps with only the fraction digits they have, timestamptz in UTC as ``+00``, BC
dates and infinity, numeric's digits, intervals, ``\\x`` bytea, and a range bound quoted
exactly when range_out quotes it.

A table holds the built-in ranges and multiranges with edge bounds (infinite, empty,
inclusive and exclusive, BC, fractional seconds, offsets), user ranges over time, timetz,
text with odd characters, interval, bool, inet, bytea and a domain over timestamptz, and
scalar columns of those subtypes. Its rows are captured through a text and a binary pgoutput
slot and loaded with the capture's catalog; each value is checked four ways against the
server: ``pg_text``, ``pgcdc changes``' JSON line and the streaming source's after_json
(against ``to_jsonb``), and what apply writes (a range's text column, and any column held as
text after its type changed).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from pgcdc.events.reader import EventReader
from pgcdc.events.jsonlines import EventRenderer
from pgcdc.spark import types as pgtypes
from pgcdc.values import Catalog, pg_text
from tests.postgres import capture
from tests.postgres.capture import Options

SCHEMA = [
    "CREATE TYPE timerange AS RANGE (subtype = time)",
    "CREATE TYPE timetzrange AS RANGE (subtype = timetz)",
    'CREATE TYPE textrange AS RANGE (subtype = text, collation = "C")',
    "CREATE TYPE intervalrange AS RANGE (subtype = interval)",
    "CREATE TYPE boolrange AS RANGE (subtype = bool)",
    "CREATE TYPE inetrange AS RANGE (subtype = inet)",
    "CREATE TYPE bytearange AS RANGE (subtype = bytea)",
    "CREATE DOMAIN moment AS timestamptz",
    "CREATE TYPE momentrange AS RANGE (subtype = moment)",
]

# column -> (type, SQL values, one a row; the rows cycle through the shorter lists)
COLUMNS = {
    "i4": ("int4range", ["[1,5)", "(1,5]", "[,5]", "(,)", "empty", "[-2147483648,2147483646]"]),
    "i8": ("int8range", ["[-9223372036854775808,0]", "(,9223372036854775806]", "empty"]),
    "n": ("numrange", [
        "[1.500,2.25]", "(0.000000001,1e20)", "[-Infinity,Infinity]", "(,0)", "[1,NaN]",
        "[0.0000,0.0000]", "empty",
    ]),
    "ts": ("tsrange", [
        '["2020-01-01 12:00:00.5","2020-01-01 12:00:01.123456")', "[-infinity,infinity]",
        '["0044-03-15 12:00 BC","0001-01-01 00:00:00.01"]', '("9999-12-31 23:59:59.999999",)',
        "empty", '["2000-02-29 00:00","2000-02-29 00:00"]',
    ]),
    "tz": ("tstzrange", [
        '["2020-01-01 12:00:00.5+05:30","2020-06-01 00:00-08")', "(-infinity,)",
        '["0044-03-15 12:00+00 BC","1900-01-01 00:00+01:02:03"]', "empty",
        '["10000-01-01 00:00+00",infinity]', '[,"2000-01-01 00:00:00.000001+14"]',
    ]),
    "d": ("daterange", [
        "[2000-01-01,2000-01-05]", "(-infinity,infinity)", "[0044-03-15 BC,0001-01-01]",
        "empty", "[9999-12-31,10000-01-01)", "(,2000-01-01]",
    ]),
    "tr": ("timerange", [
        "[12:00:00.5,12:00:01.123456)", "[00:00,24:00:00]", "(,01:02:03.04]", "empty",
    ]),
    "tt": ("timetzrange", [
        '["12:00:00.5+05:30","13:00-08")', '["00:00+00","12:00:00.25+01:02:03"]', "empty",
    ]),
    "tx": ("textrange", [
        '["","a b")', '["a,b","a\\\\b"]', '("x""y","z(1)")', '[NULL,null]', "(\xa0é,\xa0ü]",
        '["\ttab","\ttab"]', "empty",
    ]),
    "iv": ("intervalrange", [
        '["1 day 02:00:00","1 year 2 mons")', '("-1 days +02:00:00.5",)',
        '["00:00:00","00:00:00.000001"]', "empty",
    ]),
    "b": ("boolrange", ["[f,t]", "(f,t]", "[t,t]", "empty", "(,f]"]),
    "ip": ("inetrange", ["[10.0.0.0/8,192.168.0.1)", '["::1","::ffff:1.2.3.4/128"]', "empty"]),
    "by": ("bytearange", ['["\\\\x01","\\\\xff00")', '(,"\\\\x")', "empty"]),
    "mo": ("momentrange", ['["2020-01-01 12:00:00.5+05:30",)', "empty"]),
    "f": ("bool", ["t", "f"]),
    "tm": ("time", ["12:00:00.5", "00:00", "24:00:00", "23:59:59.999999"]),
    "ttz": ("timetz", ["12:00:00.5+05:30", "00:00-08", "12:00+01:02:03"]),
    "sts": ("timestamp", [
        "2020-01-01 12:00:00.5", "infinity", "0044-03-15 12:00 BC", "10000-01-01", "2000-01-01",
    ]),
    "stz": ("timestamptz", [
        "2020-01-01 12:00:00.5+05:30", "-infinity", "0044-03-15 12:00+00 BC",
        "1900-01-01 00:00+01:02:03", "2000-01-01 00:00:00.000001+14",
    ]),
    "sd": ("date", ["2000-01-01", "infinity", "0044-03-15 BC", "10000-01-01"]),
    "siv": ("interval", ["1 year 2 mons -3 days 00:00:00.5", "-00:00:01", "0"]),
    "sn": ("numeric", ["1.500", "1e20", "0.000000001", "NaN", "-Infinity", "0.0000"]),
    "sby": ("bytea", ["\\x", "\\x00ff"]),
    "sip": ("inet", ["::ffff:1.2.3.4", "192.168.0.1/24", "10.0.0.1"]),
    "scidr": ("cidr", ["10.0.0.0/8", "::/0"]),
    "su": ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    "sf4": ("float4", ["1e6", "0.1"]),
    "si8": ("int8", ["-9223372036854775808"]),
    "sj": ("jsonb", ['"a b"', "1.50", "true", "{}", "[]"]),  # no spaces, which jsonb adds
}  # fmt: skip
# multiranges: each row's range with the next row's
MULTI = {"mi4": "i4", "mn": "n", "mts": "ts", "mtz": "tz", "md": "d", "mt": "tr", "mtx": "tx"}
N = max(len(values) for _, values in COLUMNS.values())


def _literal(i: int, column: str) -> str:
    typ, values = COLUMNS[column]
    text = values[i % len(values)].replace("'", "''")
    return f"'{text}'::{typ}"


def _row(i: int) -> str:
    cells = [str(i)] + [_literal(i, c) for c in COLUMNS]
    cells += [
        f"multirange({_literal(i, r)}) + multirange({_literal(i + 1, r)})" for r in MULTI.values()
    ]
    return f"INSERT INTO texts VALUES ({', '.join(cells)})"


def _table() -> str:
    cols = [f"{c} {typ}" for c, (typ, _) in COLUMNS.items()]
    cols += [f"{m} {COLUMNS[r][0].replace('range', 'multirange')}" for m, r in MULTI.items()]
    return f"CREATE TABLE texts (id int4 PRIMARY KEY, {', '.join(cols)})"


NAMES = (*COLUMNS, *MULTI)
# each column as its output function prints it (format's %s), then as cast to text, which
# differs for bool ('true'), inet (always a mask); then the row as to_jsonb gives it
OUTS = ", ".join(f"format('%s', {c})" for c in NAMES)
CASTS = ", ".join(f"{c}::text" for c in NAMES)
TEXTS = f"SELECT id, {OUTS}, {CASTS}, to_jsonb(t)::text FROM texts t"


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def server_capture(pg, request):
    """({id: output texts}, {id: cast texts}, {id: to_jsonb}, catalog, {format: events})."""
    with pg.database(request.param) as srv, srv.connect() as conn:
        schema = [*SCHEMA, _table(), "CREATE PUBLICATION texts_pub FOR TABLE texts"]
        schema.append("SELECT pg_create_logical_replication_slot('texts_slot', 'pgoutput')")
        for stmt in schema + [_row(i) for i in range(N)]:
            conn.execute(stmt)
        texts, casts, jsonb = {}, {}, {}
        for row in conn.execute(TEXTS).fetchall():
            texts[row[0]] = dict(zip(NAMES, row[1:]))
            casts[row[0]] = dict(zip(NAMES, row[1 + len(NAMES) : -1]))
            jsonb[row[0]] = json.loads(row[-1], parse_float=Decimal)
        catalog = Catalog.from_connection(conn)
        origin = None if srv.major < 16 else "any"
        events = {}
        for binary in (False, True):
            opts = Options(2, binary, "off", messages=False, origin=origin, publication="texts_pub")
            records = capture.sql_capture(conn, "texts_slot", opts)
            events["binary" if binary else "text"] = list(
                EventReader(catalog=catalog).read(records)
            )
        yield texts, casts, jsonb, catalog, events


def _loaded(ev) -> dict:
    """Column -> (value, type OID) of an event's new row."""
    rel = ev.relation
    return {n: (v, o) for n, v, o in zip(rel.names, ev.after, rel.value_type_oids)}


def _by_id(events) -> dict:
    return {ev.after_dict()["id"]: ev for ev in events}


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_every_value_prints_as_the_server_prints_it(server_capture, fmt):
    texts, _, _, _, events = server_capture
    rows = _by_id(events[fmt])
    assert sorted(rows) == sorted(texts) == list(range(N))
    for row_id, server in texts.items():
        want = dict(server)
        loaded = _loaded(rows[row_id])
        del loaded["id"], loaded["sj"], want["sj"]  # json's text is the JSON dumps writes
        assert {c: pg_text(v, oid) for c, (v, oid) in loaded.items()} == want, (fmt, row_id)


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_changes_lines_are_what_to_jsonb_gives(server_capture, fmt):
    _, _, jsonb, _, events = server_capture
    render = EventRenderer().render
    for ev in events[fmt]:
        after = json.loads(render(ev), parse_float=Decimal)["after"]
        assert after == jsonb[after["id"]], (fmt, after["id"])


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_streaming_rows_hold_what_to_jsonb_gives(server_capture, fmt):
    pytest.importorskip("pyspark")
    from pgcdc.streaming import event_rows as source

    _, _, jsonb, _, events = server_capture
    for text in source.events_batch(events[fmt]).column("after_json").to_pylist():
        after = json.loads(text, parse_float=Decimal)
        assert after == jsonb[after["id"]], (fmt, after["id"])


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_applied_tables_hold_the_servers_text(server_capture, fmt):
    """What apply writes: a range's text column; and any column's text once its type changed
    between Relation messages (the table then holds it as text, through text_converter)."""
    texts, casts, _, catalog, events = server_capture
    rows = _by_id(events[fmt])
    ranges = [c for c in NAMES if "range" in _type(c)]
    for row_id, want in texts.items():
        ev = rows[row_id]
        rel = ev.relation
        spark, retyped = {}, {}
        for name, v, oid, mod in zip(rel.names, ev.after, rel.type_oids, rel.type_modifiers):
            if name in ranges:
                spark[name] = pgtypes.value_converter(oid, mod, catalog)(v)
            retyped[name] = pgtypes.text_converter(oid)(v)
        assert spark == {c: want[c] for c in ranges}, (fmt, row_id)
        del retyped["id"]
        assert retyped == casts[row_id], (fmt, row_id)


def _type(column: str) -> str:
    return COLUMNS[column][0] if column in COLUMNS else "multirange"
