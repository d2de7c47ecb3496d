"""Enums, domains and composites in change events, against real PostgreSQL 15 and 18.

The rule (issue 14): types the stream does not describe fully fall back to their text, or are
typed when the capture knows them. pgoutput sends a Type message for each column type that is
not built in, naming it by (schema, name); for a domain it sends the *base* type's name, so a
domain over a built-in type is known from the stream alone and loads as that type. The
events name every column's type (``RelationInfo.type_names``, ``pgcdc changes --columns``).

Expected values come from the server: ``SELECT col::text`` for the text fallbacks,
``to_jsonb(t)`` for the domain's number, and the catalog (``format_type``) for the names.
"""

from __future__ import annotations

import json

import pytest

from pgcdc.jsonlines import EventRenderer
from pgcdc.events import EventReader
from tests.postgres import capture, servers
from tests.postgres.capture import Options

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ü')",
    "CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)",
    "CREATE TYPE pair AS (a int4, b text)",
    "CREATE TABLE typed (id int4 PRIMARY KEY, m mood, d posint, p pair, ma mood[])",
    "CREATE PUBLICATION typed_pub FOR TABLE typed",
    "SELECT pg_create_logical_replication_slot('typed_slot', 'pgoutput')",
]
ROWS = [
    "INSERT INTO typed VALUES (1, 'happy ü', 42, ROW(1, 'x'), '{sad,NULL,\"happy ü\"}')",
    "INSERT INTO typed VALUES (2, NULL, NULL, NULL, NULL)",
    "INSERT INTO typed VALUES (3, 'sad', 7, ROW(NULL, 'with \"quote\", comma'), '{}')",
    "UPDATE typed SET d = 8, m = 'ok' WHERE id = 3",
]
COLUMNS = ("m", "d", "p", "ma")


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def server_capture(request):
    """(server facts, {slot format: events}) for one server version."""
    with servers.running_server(request.param) as srv, srv.connect() as conn:
        for stmt in SCHEMA + ROWS:
            conn.execute(stmt)
        facts = {
            "text": {
                row[0]: row[1:]
                for row in conn.execute(
                    "SELECT id, m::text, d::text, p::text, ma::text FROM typed"
                ).fetchall()
            },
            "jsonb": {
                row[0]: row[1]
                for row in conn.execute("SELECT id, to_jsonb(t)::text FROM typed t").fetchall()
            },
            "oids": dict(
                conn.execute(
                    "SELECT attname::text, atttypid::int8 FROM pg_attribute "
                    "WHERE attrelid = 'typed'::regclass AND attnum > 0"
                ).fetchall()
            ),
        }
        origin = None if srv.major < 16 else "any"
        events = {}
        for binary in (False, True):
            opts = Options(2, binary, "off", messages=False, origin=origin, publication="typed_pub")
            records = capture.sql_capture(conn, "typed_slot", opts)
            events["binary" if binary else "text"] = list(EventReader().read(records))
    yield facts, events


def _last_rows(events) -> dict:
    """id -> (event, after as a dict) of each row's last change."""
    out = {}
    for ev in events:
        after = ev.after_dict()
        out[after["id"]] = (ev, after)
    return out


def test_type_messages_name_every_column(server_capture):
    facts, events = server_capture
    for fmt, evs in events.items():
        rel = evs[0].relation
        names = dict(zip(rel.names, rel.type_names))
        oids = dict(zip(rel.names, rel.type_oids))
        assert names == {
            "id": "int4",
            "m": "public.mood",
            "d": "int4",  # pgoutput names a domain by its base type
            "p": "public.pair",
            "ma": "public._mood",
        }, fmt
        assert oids == facts["oids"], fmt
        # the domain loads as its base type; the others keep their own OID
        value_oids = dict(zip(rel.names, rel.value_type_oids))
        assert value_oids["d"] == 23
        assert all(value_oids[c] == oids[c] for c in ("id", "m", "p", "ma"))


def test_text_slot_enums_and_composites_are_their_text_the_domain_is_typed(server_capture):
    facts, events = server_capture
    rows = _last_rows(events["text"])
    assert sorted(rows) == sorted(facts["text"])
    for row_id, server_text in facts["text"].items():
        _, after = rows[row_id]
        m, d, p, ma = server_text
        assert after["m"] == m
        assert after["p"] == p
        assert after["ma"] == ma  # an array of an enum: its text too
        assert after["d"] == (None if d is None else int(d))
        assert after["d"] is None or type(after["d"]) is int


def test_binary_slot_types_the_domain_and_keeps_the_others_as_sent(server_capture):
    facts, events = server_capture
    rows = _last_rows(events["binary"])
    text_rows = _last_rows(events["text"])
    for row_id, (m, d, p, _ma) in facts["text"].items():
        _, after = rows[row_id]
        assert after["d"] == text_rows[row_id][1]["d"]  # typed: equal to the text slot's
        # enum_send sends the label; composites and arrays stay in their binary form
        assert after["m"] == (None if m is None else m.encode())
        assert after["p"] is None if p is None else isinstance(after["p"], bytes)


def test_json_lines_name_the_types_and_render_the_domain_as_to_jsonb(server_capture):
    facts, events = server_capture
    render = EventRenderer(columns=True).render
    lines = [json.loads(render(ev)) for ev in events["text"]]
    last = {}
    for line in lines:
        last[line["after"]["id"]] = line
    for row_id, jsonb in facts["jsonb"].items():
        line = last[row_id]
        server = json.loads(jsonb)
        assert line["after"]["d"] == server["d"]  # a number, as to_jsonb renders it
        assert line["after"]["m"] == server["m"]  # an enum is a string for to_jsonb too
        assert line["after"]["p"] == facts["text"][row_id][2]  # its text (to_jsonb: object)
        types = {c["name"]: (c["type"], c["oid"], c["key"]) for c in line["columns"]}
        assert types["m"] == ("public.mood", facts["oids"]["m"], False)
        assert types["d"] == ("int4", facts["oids"]["d"], False)
        assert types["id"] == ("int4", 23, True)
