"""``format("pgcdc")`` with ``option("table", ...)``: one table's change events with typed
columns, against real PostgreSQL 15 and 18.

A table of several types (an enum the catalog types among them) takes inserts, updates, a
key change, deletes and a truncate; a query streams it (a processing-time trigger, batches
collected by ``foreachBatch``); while it runs, ``ALTER TABLE ... ADD COLUMN`` and changes
that set the new column; the query is stopped and started again from its checkpoint, and
more changes come. The truth is the server's:

- the events, replayed key by key, give the server's rows (``to_jsonb``), the column added
  while the first query ran included: its values are in ``_pg_text`` until the restart,
  typed after it;
- each event once, the same (commit LSN, ordinal, op) as a peek of a twin slot read by
  ``EventReader``; the events of the other published table are not in the stream;
- the schema is the table's as the server publishes it (Spark types from the catalog), and a
  table the publication does not publish is refused with the tables it does.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal

import pytest


from pgcdc.lsn import parse_lsn  # noqa: E402
from tests.postgres.slots import peeked_events  # noqa: E402
from tests.wait import until  # noqa: E402

PUB = "typed_pub"
SLOT, TWIN = "typed_slot", "typed_twin"
SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE tt (id int8 PRIMARY KEY, t text, b bool, d date, n numeric(12,2),"
    " ts timestamptz, a int4[], f float8, m mood)",
    "CREATE TABLE other_t (id int PRIMARY KEY, v text)",
    f"CREATE PUBLICATION {PUB} FOR TABLE tt, other_t",
]


def _insert(lo: int, hi: int) -> str:
    return (
        "INSERT INTO tt SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'row ' || g || ' é\"' END,"
        " g % 2 = 0, '2020-02-29'::date + g, g * 1.25, '2024-01-01 00:00:00+00'::timestamptz"
        " + g * interval '1.5 second', ARRAY[g, NULL, -g]::int4[], g / 8.0,"
        f" (ARRAY['sad', 'ok', 'happy']::mood[])[g % 3 + 1] FROM generate_series({lo}, {hi}) g"
    )


def _first_part(conn) -> None:
    with conn.transaction():
        conn.execute(_insert(1, 40))
        conn.execute("INSERT INTO other_t SELECT g, 'o' || g FROM generate_series(1, 10) g")
    conn.execute("TRUNCATE tt")
    conn.execute(_insert(1, 300))
    for i in range(5):
        with conn.transaction():
            conn.execute("UPDATE tt SET t = 'u' || id, m = 'happy' WHERE id %% 5 = %s", [i])
            conn.execute("DELETE FROM tt WHERE id = %s", [100 + i])
    conn.execute("UPDATE tt SET id = id + 1000 WHERE id BETWEEN 10 AND 19")  # key changes
    conn.execute("UPDATE other_t SET v = 'x'")


def _collect(rows: list, schemas: list):
    def each(batch_df, batch_id):
        schemas.append(batch_df.schema)
        rows.extend(r.asDict(recursive=True) for r in batch_df.collect())

    return each


def _start(spark, srv, chk, rows, schemas):  # noqa: F811
    from pgcdc.streaming.slot import PgcdcDataSource

    spark.dataSource.register(PgcdcDataSource)
    return (
        spark.readStream.format("pgcdc")
        .option("dsn", srv.conninfo())
        .option("slot", SLOT)
        .option("publication", PUB)
        .option("table", "tt")
        .load()
        .writeStream.foreachBatch(_collect(rows, schemas))
        .option("checkpointLocation", str(chk))
        .trigger(processingTime="1 second")
        .start()
    )


def _wait_applied(conn, query, timeout: float = 180) -> None:
    """Until the query has committed every batch up to the server's flush position (the
    source advances the slot after each)."""
    (want,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()

    def reached():
        assert query.exception() is None, query.exception()
        (got,) = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            [SLOT],
        ).fetchone()
        return parse_lsn(got) >= parse_lsn(want) and not query.status["isDataAvailable"]

    until(f"the query at {want} (status: {query.status})", reached, timeout, 0.1)


def _as_json(name: str, value):
    """A collected value as to_jsonb writes it (UTC session)."""
    if isinstance(value, dt.datetime):  # to_jsonb leaves no trailing zero in the fraction
        text = re.sub(r"(\.\d*?)0+(?=\+)", r"\1", value.astimezone(dt.timezone.utc).isoformat())
        return text.replace(".+", "+")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _replay(rows) -> dict:
    state: dict = {}
    for r in sorted(rows, key=lambda r: (r["commit_lsn"], r["tx_ordinal"])):
        if r["op"] == "t":
            state.clear()
            continue
        if r["op"] in ("u", "d"):
            key = (r["before"] or r["after"])["id"]
            assert key in state, r
            del state[key]
        if r["op"] in ("c", "u"):
            after = r["after"]
            row = {k: _as_json(k, v) for k, v in after.items() if k != "_pg_text"}
            for k, text in (after["_pg_text"] or {}).items():
                assert row.get(k) is None, (k, r)
                assert text is not None, (k, r)
                row[k] = json.loads(text)  # the column added while the query ran: an int
            row.setdefault("extra", None)  # typed before the column was added
            state[after["id"]] = row
    return state


def _twin(conn, major: int) -> set:
    events = peeked_events(conn, TWIN, PUB, major, lenient=True)  # the enum raw: not compared
    return {
        (e.commit_lsn, e.tx_ordinal, e.op)
        for e in events
        if e.op in ("c", "u", "d", "t") and e.relation.table == "tt"
    }


@pytest.mark.parametrize("key", ["pg15", "pg18"])
def test_typed_table_events_replay_to_the_servers_rows(pg, key, tmp_path, spark):  # noqa: F811
    from pyspark.sql import types as T

    rows: list = []
    schemas: list = []
    chk = tmp_path / "chk"
    with pg.database(key) as srv, srv.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for stmt in SCHEMA:
            conn.execute(stmt)
        for slot in (SLOT, TWIN):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        _first_part(conn)
        query = _start(spark, srv, chk, rows, schemas)
        try:
            _wait_applied(conn, query)
            conn.execute("ALTER TABLE tt ADD COLUMN extra int")
            conn.execute("UPDATE tt SET extra = id * 3 WHERE id % 4 = 0")
            conn.execute(_insert(400, 420))
            conn.execute("UPDATE tt SET extra = 7 WHERE id BETWEEN 400 AND 405")
            _wait_applied(conn, query)
        finally:
            query.stop()
        before_restart = len(rows)
        query = _start(spark, srv, chk, rows, schemas)
        try:
            conn.execute("UPDATE tt SET extra = -1, t = 'late' WHERE id BETWEEN 403 AND 410")
            _wait_applied(conn, query)
        finally:
            query.stop()
        truth = {
            r[0]: json.loads(r[1], parse_float=Decimal)
            for r in conn.execute("SELECT id, to_jsonb(x)::text FROM tt x").fetchall()
        }
        twin = _twin(conn, srv.major)

    # the schema the server publishes, typed (the enum from the catalog)
    after = schemas[0]["after"].dataType
    assert [f.name for f in after.fields] == [
        "id", "t", "b", "d", "n", "ts", "a", "f", "m", "_pg_text",
    ]  # fmt: skip
    assert after["n"].dataType == T.DecimalType(12, 2)
    assert after["ts"].dataType == T.TimestampType()
    assert after["a"].dataType == T.ArrayType(T.IntegerType())
    assert after["m"].dataType == T.StringType()
    assert "extra" in schemas[-1]["after"].dataType.names  # the restarted query's schema

    got = {(r["commit_lsn"], r["tx_ordinal"], r["op"]) for r in rows}
    assert len(got) == len(rows) == len(twin), "each event once"
    assert got == twin
    assert {"c", "u", "d", "t"} <= {r["op"] for r in rows}
    assert schemas[0].names == [
        "op", "before", "after", "before_is_key", "unchanged", "detail_json", "lsn",
        "commit_lsn", "tx_ordinal", "commit_time", "xid", "errors",
    ]  # fmt: skip
    assert json.loads(next(r for r in rows if r["op"] == "t")["detail_json"]) == {
        "cascade": False, "restart_identity": False,
    }  # fmt: skip

    # the changes made while the first query ran: the new column's text in _pg_text, and a
    # word on what to do; after the restart, typed
    early = rows[:before_restart]
    kept = [r for r in early if r["after"] and (r["after"]["_pg_text"] or {}).get("extra")]
    assert kept and all("restart the query" in " ".join(r["errors"]) for r in kept)
    late = rows[before_restart:]
    assert late and all(r["after"]["extra"] == -1 and not r["errors"] for r in late)

    replayed = _replay(rows)
    assert sorted(replayed) == sorted(truth)
    for i, want in truth.items():
        assert replayed[i] == want, i


def test_a_table_not_published_is_refused_with_the_ones_that_are(pg, spark):  # noqa: F811
    with pg.database("pg18") as srv, srv.connect() as conn:
        for stmt in SCHEMA:
            conn.execute(stmt)
        conn.execute("CREATE TABLE hidden (id int PRIMARY KEY)")
        from pgcdc.streaming.slot import PgcdcDataSource

        spark.dataSource.register(PgcdcDataSource)
        reader = (
            spark.readStream.format("pgcdc")
            .option("dsn", srv.conninfo())
            .option("slot", SLOT)
            .option("publication", PUB)
            .option("table", "public.hidden")
        )
        with pytest.raises(Exception) as got:
            reader.load()
    text = str(got.value)
    assert "'public.hidden' is not published by typed_pub" in text, text
    assert "public.other_t, public.tt" in text, text
