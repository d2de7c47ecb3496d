"""``pgcdc sync`` on a schema shaped like real ones, against a real PostgreSQL 18 and Spark.

What a new user's first day throws at it in one run: quoted, mixed-case, non-ASCII and spaced
names of schemas, tables and columns (a dot in a column's name among them), two tables whose
``schema.table`` is the same string, a table without a key (REPLICA IDENTITY FULL),
unchanged TOAST values, a partitioned table published through its root, a stored generated
column, a row filter, a column list, TRUNCATE, a 20k-row transaction with a rolled-back
savepoint, 60 small tables, a user range and multirange over float8, a table added while it
runs, a column added with a default and no change after it, and one SIGKILL.

The truth is the server's: each table's published columns and row filter are read from
``pg_publication_tables``, its rows by a ``SELECT`` of those columns through that filter
(ranges as the server's text), and each Delta table is read by delta-rs at the location
docs/sync.md gives for its names.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.delta import read_table
from tests.support.sync import QUICK_CHECKS, Sync  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

CONVERGE = 120
BIG = "x" * 5000  # stored out of line (TOAST): an update of another column leaves it unchanged

SCHEMA = """
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE SCHEMA "Sales";
CREATE TABLE "Sales"."Order Items" (
    "Id" int PRIMARY KEY, "note.text" text, "select" text, "ñandú" text, "Qty" int,
    "long" text, doubled int GENERATED ALWAYS AS ("Qty" * 2) STORED);
CREATE TABLE public."weird.name" (id int PRIMARY KEY, a text);
CREATE SCHEMA "public.weird";
CREATE TABLE "public.weird".name (id int PRIMARY KEY, b text, c text);
CREATE TABLE "log entries" (at int, what text);
ALTER TABLE "log entries" REPLICA IDENTITY FULL;
CREATE TABLE events (id int, day int, v text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100);
CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM (100) TO (200);
CREATE TABLE filtered (id int PRIMARY KEY, v int);
CREATE TABLE narrow (id int PRIMARY KEY, shown text, hidden text);
CREATE TABLE floats (id int PRIMARY KEY, r floatrange, m floatmultirange);
CREATE TABLE quiet (id int PRIMARY KEY, v text);
CREATE TABLE busy (id int PRIMARY KEY, v text);
"""
SMALL = 60


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _setup(conn) -> None:
    for stmt in filter(str.strip, SCHEMA.split(";")):
        conn.execute(stmt)
    for i in range(SMALL):
        conn.execute(f"CREATE TABLE small_{i} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO small_{i} VALUES (1, 'a'), (2, 'b')")
    conn.execute("""INSERT INTO "Sales"."Order Items" ("Id", "note.text", "select", "ñandú",
                    "Qty", long) SELECT g, 'n' || g, 's', 'ñ', g, %s
                    FROM generate_series(1, 50) g""", [BIG])  # fmt: skip
    conn.execute("""INSERT INTO public."weird.name" SELECT g, 'a' FROM generate_series(1, 200) g""")
    conn.execute(
        """INSERT INTO "public.weird".name SELECT g, 'b', 'c' FROM generate_series(1, 20) g"""
    )
    conn.execute("""INSERT INTO "log entries" SELECT g % 5, 'w' FROM generate_series(1, 30) g""")
    conn.execute("INSERT INTO events SELECT g, g % 200, 'e' FROM generate_series(1, 400) g")
    conn.execute("INSERT INTO filtered SELECT g, g FROM generate_series(-20, 20) g")
    conn.execute("INSERT INTO narrow SELECT g, 's', 'h' FROM generate_series(1, 10) g")
    conn.execute("""INSERT INTO floats VALUES (1, '[1,2)', '{[1,2),[3,4.5]}'),
                    (2, '[0.1,1e15)', '{[-1e-05,0.3]}'), (3, 'empty', '{}')""")  # fmt: skip
    conn.execute("INSERT INTO quiet SELECT g, 'q' FROM generate_series(1, 10) g")
    conn.execute("INSERT INTO busy VALUES (0, 'start')")
    tables = ", ".join(
        ['"Sales"."Order Items"', 'public."weird.name"', '"public.weird".name',
         '"log entries"', "events", "filtered WHERE (id > 0)", "narrow (id, shown)", "floats",
         "quiet", "busy", *(f"small_{i}" for i in range(SMALL))]
    )  # fmt: skip
    conn.execute(f"CREATE PUBLICATION pub FOR TABLE {tables} "
                 "WITH (publish_via_partition_root = true)")  # fmt: skip


def _published(conn) -> dict:
    """{(schema, table): (columns, row filter)} as the server publishes them."""
    rows = conn.execute("SELECT schemaname, tablename, attnames, rowfilter "
                        "FROM pg_publication_tables WHERE pubname = 'pub'").fetchall()  # fmt: skip
    return {(s, t): (list(cols), f) for s, t, cols, f in rows}


def _location(schema: str, table: str) -> str:
    """docs/sync.md's rule, written out: letters, digits, _ and - stay (a leading _ not)."""

    def part(s: str) -> str:
        return "".join(
            c if (c.isalnum() or c in "_-") and not (i == 0 and c == "_")
            else "".join(f"~{b:02X}" for b in c.encode())
            for i, c in enumerate(s)
        )  # fmt: skip

    return f"{part(schema)}.{part(table)}"


def _server_rows(conn, schema: str, table: str, cols: list[str], where: str | None):
    types = dict(conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0",
        [f"{_ident(schema)}.{_ident(table)}"]).fetchall())  # fmt: skip
    items = ", ".join(f"{_ident(c)}::text" if "range" in types[c] else _ident(c) for c in cols)
    sql = f"SELECT {items} FROM {_ident(schema)}.{_ident(table)}"
    if where:
        sql += f" WHERE {where}"
    return sorted(map(tuple, conn.execute(sql).fetchall()), key=repr)


def _lake_rows(path, cols: list[str]):
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path)
    if sorted(n for n in t.column_names if not n.startswith("_")) != sorted(cols):
        return ("columns", sorted(t.column_names))
    return sorted(zip(*(t.column(c).to_pylist() for c in cols)), key=repr)


def _converged(conn, out, sync: Sync | None = None) -> None:
    deadline = time.monotonic() + CONVERGE
    for (schema, table), (cols, where) in sorted(_published(conn).items()):
        want = _server_rows(conn, schema, table, cols, where)

        seen = []

        def equal(schema=schema, table=table, cols=cols, want=want, seen=seen):
            if sync is not None:
                assert sync.proc.poll() is None, sync.log()
            seen[:] = [_lake_rows(out / _location(schema, table), cols)]
            return seen[0] == want

        try:
            until(f"{schema}.{table} in the lake", equal, max(deadline - time.monotonic(), 0), 0.1)
        except WaitTimeout:
            got = seen[0]
            got_s = got if not isinstance(got, list) else got[:3]
            pytest.fail(f"{schema}.{table}: {got_s} want {want[:3]}\n"
                        f"{sync.log() if sync else ''}")  # fmt: skip


def _day_one(conn) -> None:
    """Writes of every kind, on every table."""
    conn.execute("""UPDATE "Sales"."Order Items" SET "Qty" = "Qty" + 1, "note.text" = 'u'
                    WHERE "Id" <= 10""")  # (long: unchanged TOAST)
    conn.execute("""DELETE FROM "Sales"."Order Items" WHERE "Id" = 50""")
    conn.execute("""UPDATE public."weird.name" SET a = 'a2' WHERE id <= 5""")
    conn.execute("""UPDATE "public.weird".name SET b = 'b2' WHERE id <= 5""")
    conn.execute("""DELETE FROM "log entries" WHERE ctid = (SELECT min(ctid) FROM "log entries")""")
    conn.execute("""UPDATE "log entries" SET what = 'x' WHERE at = 3""")
    conn.execute("UPDATE events SET day = day + 100 WHERE id <= 20 AND day < 100")  # moves
    # (a row filter may name only the replica identity's columns: the key moves)
    conn.execute("UPDATE filtered SET id = -id - 100 WHERE id BETWEEN 1 AND 5")  # out of it
    conn.execute("UPDATE filtered SET id = 7000 WHERE id = -7")  # into it
    conn.execute("UPDATE narrow SET hidden = 'h2', shown = 's2' WHERE id <= 3")
    conn.execute("UPDATE floats SET r = '[2.5,3)' WHERE id = 1")
    conn.execute("TRUNCATE small_3")
    with conn.transaction():  # a big one with a savepoint rolled back
        conn.execute("INSERT INTO busy SELECT g, 'big' FROM generate_series(1, 20000) g")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO busy SELECT g, 'gone' FROM generate_series(-500, -1) g")
                raise RuntimeError("roll back the savepoint")
        except RuntimeError:
            pass
        conn.execute("UPDATE busy SET v = 'big2' WHERE id % 1000 = 0")


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        _setup(conn)
        yield srv, conn


def test_a_real_schema_day_one(server, tmp_path):
    srv, conn = server
    out = tmp_path / "lake"
    sync = Sync(srv, out, *QUICK_CHECKS)
    sync.wait_for("ready")
    _converged(conn, out, sync)
    _day_one(conn)
    _converged(conn, out, sync)

    # killed; writes while it is down; a rerun
    assert sync.stop(signal.SIGKILL) == -signal.SIGKILL
    conn.execute("""INSERT INTO "Sales"."Order Items" ("Id", "Qty") VALUES (100, 1)""")
    conn.execute("""INSERT INTO public."weird.name" VALUES (1000, 'after kill')""")
    sync = Sync(srv, out, *QUICK_CHECKS)
    try:
        sync.wait_for("ready")
        _converged(conn, out, sync)
        # a table added while it runs, and a column added with no change after it
        conn.execute('CREATE TABLE "Late Table" ("K" int PRIMARY KEY, "v.v" text)')
        conn.execute("""INSERT INTO "Late Table" VALUES (1, 'l')""")
        conn.execute('ALTER PUBLICATION pub ADD TABLE "Late Table"')
        conn.execute("ALTER TABLE quiet ADD COLUMN c text DEFAULT 'd'")
        conn.execute("UPDATE busy SET v = 'tick' WHERE id = 0")  # cycles go on
        _converged(conn, out, sync)
        assert not sync.named("error"), sync.log()
    finally:
        assert sync.stop() == 0, sync.log()
    assert "Traceback" not in "".join(sync.other), sync.log()
