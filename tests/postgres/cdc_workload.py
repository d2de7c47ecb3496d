"""A workload for change events: after each step the server's tables are the truth that the
events, replayed, must rebuild (see tests/events/test_events_postgres.py).

It covers ALTER TABLE mid-stream (add and drop column), key changes, REPLICA IDENTITY DEFAULT /
FULL / NOTHING / USING INDEX, partitions (published through two publications, with and
without publish_via_partition_root), TRUNCATE ... CASCADE, big transactions that stream
(logical_decoding_work_mem = 64kB) with SAVEPOINT / ROLLBACK TO / RELEASE, a big aborted
transaction, two transactions streamed interleaved, two-phase commit and rollback (small and
streamed), large TOASTed values left unchanged by updates, and logical messages.

A step is a list of statements run in one transaction, unless it controls the transaction
itself (PREPARE / COMMIT PREPARED / ROLLBACK / a ``("other", sql)`` statement that a second
connection runs while the first one's transaction is open).
"""

from __future__ import annotations

PUB_LEAF = "cdc_leaf"  # partitions published as themselves
PUB_ROOT = "cdc_root"  # publish_via_partition_root = true

# table -> the columns that identify a row in the replay (None: insert-only, rows are a bag)
KEYS = {
    "kv": ("id",),
    "full_t": ("id",),
    "idx_t": ("code",),
    "nothing_t": None,
    "toast_t": ("id",),
    "parent": ("id",),
    "child": ("id",),
    "part": ("id", "region"),
    "part_eu": ("id", "region"),
    "part_us": ("id", "region"),
    "bulk": ("id",),
}
ROOT_ONLY = {"part"}
LEAF_ONLY = {"part_eu", "part_us"}

SCHEMA = [
    """CREATE TABLE kv (id int PRIMARY KEY, v text, n numeric, ts timestamptz, j jsonb,
        arr int[], grid int[], b bytea, f float8)""",
    "CREATE TABLE full_t (id int NOT NULL, note text, doc text)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    "ALTER TABLE full_t ALTER COLUMN doc SET STORAGE EXTERNAL",
    "CREATE TABLE idx_t (id int NOT NULL, code text NOT NULL, val text)",
    "CREATE UNIQUE INDEX idx_t_code ON idx_t (code)",
    "ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_code",
    "CREATE TABLE nothing_t (id int, v text)",
    "ALTER TABLE nothing_t REPLICA IDENTITY NOTHING",
    "CREATE TABLE toast_t (id int PRIMARY KEY, n int, doc text)",
    "ALTER TABLE toast_t ALTER COLUMN doc SET STORAGE EXTERNAL",
    "CREATE TABLE parent (id int PRIMARY KEY, name text)",
    "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent (id), v text)",
    """CREATE TABLE part (id int NOT NULL, region text NOT NULL, v text,
        PRIMARY KEY (id, region)) PARTITION BY LIST (region)""",
    "CREATE TABLE part_eu PARTITION OF part FOR VALUES IN ('eu')",
    "CREATE TABLE part_us PARTITION OF part FOR VALUES IN ('us')",
    "CREATE TABLE bulk (id int PRIMARY KEY, pad text)",
    f"CREATE PUBLICATION {PUB_LEAF} FOR ALL TABLES",
    f"CREATE PUBLICATION {PUB_ROOT} FOR ALL TABLES WITH (publish_via_partition_root = true)",
]

BIG_DOC = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 200) i)"  # 6.4 kB


def big_insert(first: int, count: int = 100) -> str:
    # 100 rows x 1000 bytes: past logical_decoding_work_mem (64kB), so the transaction streams
    return (
        f"INSERT INTO bulk SELECT g, repeat(chr(97 + g % 26), 1000) "
        f"FROM generate_series({first}, {first + count - 1}) g"
    )


STEPS: list[tuple[str, list]] = [
    (
        "inserts of every identity kind",
        [
            """INSERT INTO kv VALUES
              (1, 'héllo ☃', 1234.5678901234567890123, '2024-01-02 03:04:05.123456+02',
               '{"a": [1, 2.50, null], "b": {"c": "d"}}', '{1,NULL,3}', '{{1,2},{3,4}}',
               '\\x00ff', 1.5),
              (2, '', 'NaN', 'infinity', '[]', '{}', NULL, '', '-Infinity'),
              (3, NULL, -0.000001, '-infinity', 'null', '{NULL}', '{{5}}', NULL, 'NaN')""",
            f"INSERT INTO full_t VALUES (1, 'n1', {BIG_DOC}), (2, 'n2', 'small')",
            "INSERT INTO idx_t VALUES (1, 'k1', 'v1'), (2, 'k2', 'v2'), (3, 'k3', 'v3')",
            "INSERT INTO nothing_t VALUES (1, 'a'), (1, 'a'), (2, NULL)",
            f"INSERT INTO toast_t VALUES (1, 0, {BIG_DOC}), (2, 0, 'short')",
            "INSERT INTO parent VALUES (1, 'p1'), (2, 'p2')",
            "INSERT INTO child VALUES (1, 1, 'c1'), (2, 2, 'c2')",
            "INSERT INTO part VALUES (1, 'eu', 'a'), (2, 'eu', 'b'), (3, 'us', 'c')",
            "SELECT pg_logical_emit_message(true, 'cdc', 'transactional')",
        ],
    ),
    (
        "updates (key changes, unchanged TOAST) and deletes",
        [
            "UPDATE kv SET v = 'changed', n = n * 2 WHERE id = 1",
            "UPDATE kv SET id = 20 WHERE id = 2",  # key change: old key sent
            "DELETE FROM kv WHERE id = 3",
            "UPDATE full_t SET note = 'n1b' WHERE id = 1",  # doc unchanged: old row fills it
            "DELETE FROM full_t WHERE id = 2",
            "UPDATE idx_t SET val = 'v1b' WHERE code = 'k1'",
            "UPDATE idx_t SET code = 'k2b' WHERE code = 'k2'",  # index key change
            "DELETE FROM idx_t WHERE code = 'k3'",
            "UPDATE toast_t SET n = n + 1",  # doc unchanged: left out, replay keeps it
            "INSERT INTO nothing_t VALUES (3, 'only inserts without an identity')",
        ],
    ),
    (
        "ALTER TABLE ADD COLUMN mid-stream",
        [
            "ALTER TABLE kv ADD COLUMN extra text",
            "UPDATE kv SET extra = 'x' WHERE id = 1",
            "INSERT INTO kv (id, v, extra) VALUES (4, 'four', 'e4')",
        ],
    ),
    (
        "ALTER TABLE DROP COLUMN, then changes",
        ["ALTER TABLE kv DROP COLUMN n", "UPDATE kv SET v = 'after drop'"],
    ),
    (
        "partitions: cross-partition update, update, delete",
        [
            "UPDATE part SET region = 'us' WHERE id = 1",
            "UPDATE part SET v = 'b2' WHERE id = 2",
            "DELETE FROM part WHERE id = 3",
            "INSERT INTO part VALUES (4, 'us', 'd')",
        ],
    ),
    ("TRUNCATE CASCADE", ["TRUNCATE parent CASCADE"]),
    (
        "refill after truncate",
        ["INSERT INTO parent VALUES (3, 'p3')", "INSERT INTO child VALUES (3, 3, 'c3')"],
    ),
    (
        "big streamed transaction with subtransaction aborts",
        [
            "INSERT INTO bulk VALUES (1, 'before savepoints')",
            "SAVEPOINT s1",
            big_insert(1000),
            "ROLLBACK TO SAVEPOINT s1",
            "SAVEPOINT s2",
            big_insert(2000),
            "SAVEPOINT s3",
            "UPDATE bulk SET pad = 'nested, rolled back' WHERE id < 2050",
            "ROLLBACK TO SAVEPOINT s3",
            "RELEASE SAVEPOINT s2",
            "UPDATE kv SET v = 'in a streamed transaction' WHERE id = 1",
            "SELECT pg_logical_emit_message(true, 'cdc', 'streamed')",
            big_insert(3000),
            "DELETE FROM bulk WHERE id BETWEEN 3000 AND 3009",
        ],
    ),
    ("big aborted transaction", [big_insert(4000), "ROLLBACK"]),
    (
        "two transactions streamed interleaved",
        [
            big_insert(6000),
            ("other", "INSERT INTO kv (id, v) VALUES (200, 'committed first')"),
            big_insert(7000),
            ("other", "UPDATE kv SET v = 'second' WHERE id = 200"),
        ],
    ),
    (
        "two-phase: prepare",
        ["INSERT INTO kv (id, v) VALUES (100, 'p')", "PREPARE TRANSACTION 'p1'"],
    ),
    ("two-phase: commit prepared", ["COMMIT PREPARED 'p1'"]),
    (
        "two-phase: prepare and roll back",
        ["INSERT INTO kv (id, v) VALUES (101, 'rolled back')", "PREPARE TRANSACTION 'p2'"],
    ),
    ("two-phase: rollback prepared", ["ROLLBACK PREPARED 'p2'"]),
    ("big two-phase: prepare", [big_insert(5000), "PREPARE TRANSACTION 'p3'"]),
    ("big two-phase: commit prepared", ["COMMIT PREPARED 'p3'"]),
    (
        "replica identity changes",
        [
            "ALTER TABLE kv REPLICA IDENTITY FULL",
            "UPDATE kv SET v = 'full identity' WHERE id = 4",
            "DELETE FROM kv WHERE id = 20",
            "ALTER TABLE kv REPLICA IDENTITY DEFAULT",
            "UPDATE kv SET id = 5 WHERE id = 4",
        ],
    ),
    (
        "unchanged TOAST with FULL identity, and a non-transactional message",
        [
            "UPDATE full_t SET note = 'n1c'",
            "SELECT pg_logical_emit_message(false, 'cdc', 'not transactional')",
        ],
    ),
]

TRANSACTION_CONTROL = ("PREPARE TRANSACTION", "COMMIT PREPARED", "ROLLBACK PREPARED")


def run_step(conn, other, statements) -> None:
    """Run one step on autocommit connections (``other`` for the interleaved statements)."""
    own = any(
        isinstance(s, str) and (s == "ROLLBACK" or s.startswith(TRANSACTION_CONTROL))
        for s in statements
    )
    standalone = len(statements) == 1 and statements[0].startswith(
        ("COMMIT PREPARED", "ROLLBACK PREPARED")
    )
    if not standalone:
        conn.execute("BEGIN")
    for s in statements:
        if isinstance(s, tuple):
            other.execute(s[1])
        else:
            conn.execute(s)
    if not own:
        conn.execute("COMMIT")
