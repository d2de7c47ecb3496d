"""pytest plugin (tests/conftest.py registers it): the catalog workload (enums, domains,
composites, ranges, ALTER TYPE) captured by a text and a binary slot on PostgreSQL 15 and 18
(``captured``), and a capture cut into segments (``segmented_capture``); used by
tests/capture/test_capture_catalog.py and tests/apply/test_apply_catalog.py."""

from __future__ import annotations

import json
import subprocess
import sys
import pytest
from pgcdc.cli import capture


SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TYPE pair AS (a int, b text, m mood)",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE DOMAIN nice AS mood",
    "CREATE TYPE floatrange AS RANGE (subtype = float8)",
    """CREATE TABLE t (id int PRIMARY KEY, m mood, ms mood[], p pair, ps pair[], d posint,
        n nice, r floatrange, c "char", rc regclass, rt regtype, rts regtype[], doc text)""",
    "ALTER TABLE t ALTER COLUMN doc SET STORAGE EXTERNAL",
    "CREATE TABLE plain (id int PRIMARY KEY, v text)",
    "CREATE PUBLICATION pub FOR TABLE t",
    "CREATE PUBLICATION pub_plain FOR TABLE plain",
]


ROWS = [
    """INSERT INTO t VALUES (1, 'happy', '{sad,ok}', ROW(7, 'se,ven', 'ok'),
        ARRAY[ROW(1, 'x', 'sad')::pair, NULL], 5, 'ok', '[1.5,2.5)', '\\303', 't', 'pair',
        '{int4,mood,NULL}', repeat('x', 5000))""",
    """INSERT INTO t VALUES (2, NULL, '{}', ROW(NULL, NULL, NULL), '{}', NULL, NULL, 'empty', '',
        'pg_class', 'text', '{}', 'a')""",
    "INSERT INTO t (id, m, c) VALUES (3, 'sad', 'z')",
    "UPDATE t SET m = 'ok' WHERE id = 1",  # doc is unchanged TOAST
    "ALTER TYPE mood ADD VALUE 'ecstatic'",
    "INSERT INTO t (id, m, ms) VALUES (4, 'ecstatic', '{ecstatic,sad}')",
    "ALTER TABLE t ADD COLUMN extra text DEFAULT 'd'",
    "INSERT INTO t (id, m) VALUES (5, 'ok')",
    "INSERT INTO plain VALUES (1, 'x')",
]


def _capture(srv, slot, out, *extra) -> None:
    code = capture.main(["--dsn", srv.conninfo(), "--slot", slot, "--publication", "pub",
                         "--out", str(out), "--idle-exit", "0.5", "--log-format", "json",
                         *extra])  # fmt: skip
    assert code == 0


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def captured(pg, request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    with pg.database(request.param) as srv, srv.connect() as conn:
        for sql in SCHEMA:
            conn.execute(sql)
        for slot in ("text_s", "bin_s", "plain_s"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        for sql in ROWS:
            conn.execute(sql)
        _capture(srv, "text_s", root / "text")
        _capture(srv, "bin_s", root / "bin", "--binary")
        code = capture.main(["--dsn", srv.conninfo(), "--slot", "plain_s", "--publication",
                             "pub_plain", "--out", str(root / "plain"), "--idle-exit", "0.5",
                             "--binary", "--log-format", "json"])  # fmt: skip
        assert code == 0
        truth = {
            i: doc for i, doc in conn.execute("SELECT id, to_jsonb(t)::text FROM t ORDER BY id")
        }
        oids = dict(conn.execute("SELECT typname::text, oid::int8 FROM pg_type WHERE typname IN "
                                 "('mood', 'pair', 'posint', 'nice', 'floatrange')"))  # fmt: skip
    yield root, {i: json.loads(doc) for i, doc in truth.items()}, oids


def segmented_capture(srv, conn, out, *extra: str) -> subprocess.Popen:
    """The schema made, and a capture of slot 's' started while the changes come, made
    durable (and its segment closed past 4 kB) every 20 ms: one walsender session, so each
    Relation message is in one segment only. It exits 2 s after the last change."""
    for sql in SCHEMA:
        conn.execute(sql)
    conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    return subprocess.Popen([sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(),
                             "--slot", "s", "--publication", "pub", "--out", str(out),
                             "--idle-exit", "2", "--binary", "--segment-bytes", "4096",
                             "--flush-interval", "0.02", "--log-format", "json", *extra],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
