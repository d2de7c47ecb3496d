"""A small SQL workload that makes pgoutput emit all 19 message types and all tuple kinds.

Order of use (see :func:`prepare`): schema + publication, then slots, then :func:`run`.

What triggers what:

* Begin/Commit, Relation, Insert/Update/Delete with 'n'/'t'/'b' columns: the ``kitchen`` table
  (many column types, a NULL-only row) with REPLICA IDENTITY DEFAULT (update changing the key
  -> 'K', not changing it -> no old tuple), ``full_t`` (REPLICA IDENTITY FULL -> 'O'),
  ``idx_t`` (REPLICA IDENTITY USING INDEX).
* Type 'Y': enum, domain, composite, enum[] and range-over-enum columns (non-built-in types).
* unchanged TOAST 'u': ``toasty.doc`` (STORAGE EXTERNAL, ~3 kB) is left alone by an UPDATE.
* Truncate 'T': TRUNCATE ... RESTART IDENTITY, TRUNCATE ... CASCADE (FK child).
* Message 'M': transactional and non-transactional pg_logical_emit_message (text and bytea).
* Origin 'O': a transaction replayed under replication origin ``wl_origin``.
* Begin Prepare/Prepare/Commit Prepared/Rollback Prepared: PREPARE TRANSACTION + COMMIT/ROLLBACK
  PREPARED (two_phase slots only).
* Stream Start/Stop/Commit/Abort/Prepare: transactions > logical_decoding_work_mem (64kB) with a
  rolled-back and a released subtransaction, a big rolled-back transaction, and a big prepared
  transaction (on 16+ the server also runs with debug_logical_replication_streaming=immediate).
* PG 18: a STORED generated column published via publish_generated_columns = stored.
* An empty transaction (DDL only) that PG 15+ skips.
* Last: a non-transactional message with prefix ``pgcap`` / content ``end``; the walsender capture
  stops when it sees it.
"""

from __future__ import annotations

END_PREFIX = "pgcap"
END_CONTENT = b"end"

PUBLICATION = "pub"
PUBLICATION_NO_GENERATED = "pub_nogen"  # PG 18 only: publish_generated_columns = none


def schema_sql(major: int) -> list[str]:
    stmts = [
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
        "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
        "CREATE TYPE pair AS (a int, b text)",
        """CREATE TABLE kitchen (
            id int PRIMARY KEY,
            c_bool bool, c_i2 int2, c_i8 int8, c_num numeric(12,3), c_f4 float4, c_f8 float8,
            c_text text, c_vc varchar(20), c_char char(3), c_bytea bytea,
            c_date date, c_time time, c_ts timestamp, c_tstz timestamptz, c_iv interval,
            c_uuid uuid, c_json json, c_jsonb jsonb, c_iarr int[], c_tarr text[],
            c_inet inet, c_point point, c_range int4range, c_oid oid,
            c_mood mood, c_posint posint, c_pair pair, c_moods mood[])""",
        "CREATE TABLE full_t (id int, note text, amount numeric)",
        "ALTER TABLE full_t REPLICA IDENTITY FULL",
        "CREATE TABLE idx_t (id int NOT NULL, code text NOT NULL, val text)",
        "CREATE UNIQUE INDEX idx_t_code ON idx_t (code)",
        "ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_code",
        "CREATE TABLE toasty (id int PRIMARY KEY, n int, doc text)",
        "ALTER TABLE toasty ALTER COLUMN doc SET STORAGE EXTERNAL",
        "CREATE TABLE parent (id serial PRIMARY KEY, name text)",
        "CREATE TABLE child (id serial PRIMARY KEY, parent_id int REFERENCES parent (id), v text)",
        "CREATE TABLE bulk (id int, pad text)",  # insert-only (no replica identity)
        "CREATE TABLE gen_t (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED)",
    ]
    if major >= 18:
        stmts.append(
            f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES "
            "WITH (publish_generated_columns = stored)"
        )
        stmts.append(f"CREATE PUBLICATION {PUBLICATION_NO_GENERATED} FOR ALL TABLES")
    else:
        stmts.append(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
    stmts.append("SELECT pg_replication_origin_create('wl_origin')")
    return stmts


KITCHEN_ROW = """INSERT INTO kitchen VALUES ({id}, true, -12, 9000000000, 1234.567, 1.5, -2.25e100,
    'héllo wörld', 'vc', 'ab', '\\x00ff10'::bytea,
    '2024-02-29', '12:34:56.789', '2024-01-02 03:04:05.678901', '2024-01-02 03:04:05+02',
    '1 year 2 mons 3 days 04:05:06',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"a": [1, 2]}}', '{{"b": null}}',
    '{{1,NULL,3}}', '{{"x","y z",NULL}}', '192.168.0.1/24', '(1.5,-2)', '[3,7)', 4242,
    'happy', 7, ROW(1, 'one'), '{{sad,ok}}')"""


def _big_rows(table: str, first: int, count: int, width: int = 900) -> str:
    # ~count * width bytes of change data: 80 rows x 900 bytes > 64kB logical_decoding_work_mem
    return (
        f"INSERT INTO {table} SELECT g, repeat(chr(97 + g % 26), {width}) "
        f"FROM generate_series({first}, {first + count - 1}) g"
    )


def transactions(major: int, *, small: bool = False) -> list[list[str]]:
    """The workload as a list of transactions (each a list of statements run in one
    BEGIN/COMMIT unless it manages its own transaction control)."""
    big = 30 if small else 80
    txns: list[list[str]] = [
        # plain DML, all tuple kinds except 'u'
        [
            KITCHEN_ROW.format(id=1),
            "INSERT INTO kitchen (id) VALUES (2)",  # NULLs everywhere
            "SELECT pg_logical_emit_message(true, 'wl', 'transactional text')",
        ],
        [
            "UPDATE kitchen SET c_text = 'changed', c_mood = 'ok' WHERE id = 1",  # no old tuple
            "UPDATE kitchen SET id = 3 WHERE id = 2",  # key changes -> 'K'
            "DELETE FROM kitchen WHERE id = 3",
        ],  # 'K'
        [
            "INSERT INTO full_t VALUES (1, 'a', 1.5), (2, NULL, NULL)",
            "UPDATE full_t SET note = 'b' WHERE id = 1",  # 'O'
            "DELETE FROM full_t WHERE id = 2",
        ],  # 'O' with NULLs
        [
            "INSERT INTO idx_t VALUES (1, 'k1', 'v1'), (2, 'k2', 'v2')",
            "UPDATE idx_t SET val = 'v1b' WHERE code = 'k1'",  # key unchanged -> no old tuple
            "UPDATE idx_t SET code = 'k2b' WHERE code = 'k2'",  # key changed -> 'K'
            "DELETE FROM idx_t WHERE code = 'k1'",
        ],
        [
            "INSERT INTO toasty SELECT 1, 0, string_agg(md5(i::text), '') "
            "FROM generate_series(1, 100) i"
        ],
        ["UPDATE toasty SET n = n + 1 WHERE id = 1"],  # doc unchanged TOAST -> 'u'
        # non-transactional messages, text and binary
        [
            "SELECT pg_logical_emit_message(false, 'wl', 'non-transactional')",
            "SELECT pg_logical_emit_message(false, 'wl', '\\x00ff7f'::bytea)",
        ],
        # only a transactional message
        ["SELECT pg_logical_emit_message(true, 'wl', '\\x0102'::bytea)"],
        # empty transaction (catalog only): skipped by pgoutput on PG 15+
        ["CREATE TABLE scratch (i int)", "DROP TABLE scratch"],
        # truncates
        [
            "INSERT INTO parent (name) VALUES ('p1'), ('p2')",
            "INSERT INTO child (parent_id, v) VALUES (1, 'c1')",
        ],
        ["TRUNCATE parent, child RESTART IDENTITY"],
        [
            "INSERT INTO parent (name) VALUES ('p3')",
            "INSERT INTO child (parent_id, v) VALUES (1, 'c3')",
        ],
        ["TRUNCATE parent CASCADE"],
        ["INSERT INTO bulk VALUES (0, 'x')", "TRUNCATE bulk"],
        # generated column
        ["INSERT INTO gen_t (id, a) VALUES (1, 21)", "UPDATE gen_t SET a = 22 WHERE id = 1"],
        # schema change mid-stream: Relation is sent again
        ["ALTER TABLE kitchen ADD COLUMN c_extra text"],
        [KITCHEN_ROW.format(id=4).replace("'{{sad,ok}}')", "'{{sad,ok}}', 'extra')")],
        # two-phase: committed and rolled back
        [
            "INSERT INTO kitchen (id, c_text) VALUES (10, 'prepared')",
            "PREPARE TRANSACTION 'wl_commit'",
            "COMMIT PREPARED 'wl_commit'",
        ],
        [
            "INSERT INTO kitchen (id, c_text) VALUES (11, 'rolled back')",
            "PREPARE TRANSACTION 'wl_rollback'",
            "ROLLBACK PREPARED 'wl_rollback'",
        ],
        # big transaction with subtransactions: streamed; subxact abort -> Stream Abort(subxid)
        [
            "INSERT INTO bulk VALUES (1, 'before savepoint')",
            "SAVEPOINT s1",
            _big_rows("bulk", 1000, big),
            "ROLLBACK TO SAVEPOINT s1",
            "SAVEPOINT s2",
            "INSERT INTO bulk VALUES (2, 'released')",
            "RELEASE SAVEPOINT s2",
            "SELECT pg_logical_emit_message(true, 'wl', 'in a streamed transaction')",
            _big_rows("bulk", 2000, big),
        ],
        # big aborted transaction -> Stream Abort(xid = subxid)
        [_big_rows("bulk", 3000, big), "ROLLBACK"],
        # big prepared transaction -> Stream Prepare
        [_big_rows("bulk", 4000, big), "PREPARE TRANSACTION 'wl_big'", "COMMIT PREPARED 'wl_big'"],
    ]
    return txns


def run(conn, major: int, *, small: bool = False) -> None:
    """Run the workload on an autocommit psycopg connection."""
    for stmts in transactions(major, small=small):
        conn.execute("BEGIN")
        ended = False
        for s in stmts:
            if s == "ROLLBACK" or s.startswith("PREPARE TRANSACTION"):
                ended = True
            conn.execute(s)
        if not ended:
            conn.execute("COMMIT")
    # a transaction under a replication origin -> Origin message
    conn.execute("SELECT pg_replication_origin_session_setup('wl_origin')")
    conn.execute("BEGIN")
    conn.execute(
        "SELECT pg_replication_origin_xact_setup('0/1234ABCD', '2024-05-06 07:08:09.123456+00')"
    )
    conn.execute("INSERT INTO full_t VALUES (100, 'from origin', 0)")
    conn.execute("COMMIT")
    conn.execute("SELECT pg_replication_origin_session_reset()")
    conn.execute(f"SELECT pg_logical_emit_message(false, '{END_PREFIX}', '{END_CONTENT.decode()}')")
    # A non-transactional message is not flushed by itself and decoding only reads flushed WAL:
    # commit a catalog-only (hence empty, skipped) transaction to flush it.
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE flush_marker ()")
    conn.execute("COMMIT")


def prepare_schema(conn, major: int) -> None:
    for s in schema_sql(major):
        conn.execute(s)
