"""Enums, domains and composites in change events, against real PostgreSQL 15 and 18.

The rule: a value is typed from what the stream says and the capture's catalog knows, or it
is not rendered at all. pgoutput sends a Type message for each column type that is not built
in, naming it by (schema, name); for a domain it sends the *base* type's name, so a domain over
a built-in type is known from the stream alone and loads as that type. Enums, composites and
arrays of them need the catalog (pgcdc capture records it): with it, a text and a binary slot
give the same values, rendered as ``to_jsonb`` renders them; without it, such a value is an
error that names the column and type (lenient reading keeps it raw, with the error). The
events name every column's type (``RelationInfo.type_names``, ``pgcdc changes --columns``).

Expected values come from the server: ``to_jsonb(t)`` and the catalog (``pg_attribute``).
"""

from __future__ import annotations

import json

import pytest

from pgcdc.events.reader import EventReader
from pgcdc.events.jsonlines import EventRenderer
from pgcdc.events.transactions import ChangeStreamError
from pgcdc.values import Catalog
from tests.postgres import capture
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
def server_capture(pg, request):
    """(server facts, {slot format: events}) for one server version."""
    with pg.database(request.param) as srv, srv.connect() as conn:
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
        catalog = Catalog.from_connection(conn)
        origin = None if srv.major < 16 else "any"
        events, records = {}, {}
        for binary in (False, True):
            fmt = "binary" if binary else "text"
            opts = Options(2, binary, "off", messages=False, origin=origin, publication="typed_pub")
            records[fmt] = capture.sql_capture(conn, "typed_slot", opts)
            events[fmt] = list(EventReader(catalog=catalog).read(records[fmt]))
    facts["records"] = records
    yield facts, events


def _last_rows(events) -> dict:
    """id -> (event, after as a dict) of each row's last change."""
    out = {}
    for ev in events:
        after = ev.after_dict()
        out[after["id"]] = (ev, after)
    return out


def test_type_messages_and_the_catalog_name_every_column(server_capture):
    facts, events = server_capture
    for fmt, evs in events.items():
        rel = evs[0].relation
        names = dict(zip(rel.names, rel.type_names))
        oids = dict(zip(rel.names, rel.type_oids))
        assert names == {
            "id": "int4",
            "m": "public.mood",
            "d": "public.posint",  # pgoutput names the base type; the catalog the domain
            "p": "public.pair",
            "ma": "public.mood[]",
        }, fmt
        assert oids == facts["oids"], fmt
        # the domain loads as its base type; the others keep their own OID
        value_oids = dict(zip(rel.names, rel.value_type_oids))
        assert value_oids["d"] == 23
        assert all(value_oids[c] == oids[c] for c in ("id", "m", "p", "ma"))


def test_text_and_binary_slots_give_the_values_to_jsonb_gives(server_capture):
    facts, events = server_capture
    text, binary = _last_rows(events["text"]), _last_rows(events["binary"])
    assert sorted(text) == sorted(binary) == sorted(facts["jsonb"])
    render = EventRenderer(columns=True).render
    for fmt, evs in events.items():
        last = {}
        for ev in evs:
            line = json.loads(render(ev))
            last[line["after"]["id"]] = line
        for row_id, jsonb in facts["jsonb"].items():
            line = last[row_id]
            assert line["after"] == json.loads(jsonb), (fmt, row_id)
            types = {c["name"]: (c["type"], c["oid"], c["key"]) for c in line["columns"]}
            assert types["m"] == ("public.mood", facts["oids"]["m"], False)
            assert types["d"] == ("public.posint", facts["oids"]["d"], False)
            assert types["id"] == ("int4", 23, True)


@pytest.mark.parametrize("fmt", ["text", "binary"])
def test_without_the_catalog_values_are_refused_or_kept_raw(server_capture, fmt):
    facts, _ = server_capture
    records = facts["records"][fmt]
    with pytest.raises(ChangeStreamError, match=r"column 'm' \(#1, type public.mood, oid \d+"):
        list(EventReader().read(records))
    events = list(EventReader(lenient=True).read(records))
    first = _last_rows(events)[1][0]
    assert first.after[1].data == "happy ü".encode()  # the value as sent, marked raw
    assert sorted(e.column for e in first.errors) == [1, 3, 4]  # m, p, ma; d is typed
