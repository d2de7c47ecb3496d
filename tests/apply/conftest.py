"""``runs`` (module scope): the two-phase workload on a database of the session PostgreSQL 18,
captured, applied in runs (tests/apply/test_apply_runs.py, test_delta_apply.py,
test_delta_s3.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
import pytest
from tests.support.truth import _truth  # noqa: E402

pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")

from pgcdc.cli import capture as capture_cli  # noqa: E402
from tests.support.apply_runs import TABLES  # noqa: E402


SCHEMA = [
    "CREATE TABLE acct (id int PRIMARY KEY, name text NOT NULL, bal numeric(12,2), tags text[])",
    "CREATE TABLE bag (v int, s text)",
    "ALTER TABLE bag REPLICA IDENTITY FULL",
    "CREATE TABLE note (id bigint PRIMARY KEY, body text, at timestamptz)",
    "CREATE PUBLICATION runs_pub FOR TABLE acct, bag, note",
    "SELECT pg_create_logical_replication_slot('runs', 'pgoutput')",
]


PHASE1 = [
    "INSERT INTO acct SELECT g, 'n' || g, g * 1.5, ARRAY['a', g::text] FROM generate_series(1, 300) g",
    "INSERT INTO bag SELECT g % 7, 's' || (g % 3) FROM generate_series(1, 60) g",
    "INSERT INTO note SELECT g, repeat('x', g), '2024-01-01'::timestamptz + g * interval '1 h'"
    " FROM generate_series(1, 50) g",
    "UPDATE acct SET bal = bal + 1 WHERE id % 3 = 0",
    "DELETE FROM acct WHERE id % 10 = 0",
    "UPDATE acct SET id = id + 1000 WHERE id % 25 = 1",  # key changes
    "DELETE FROM bag WHERE v = 3",
    "UPDATE bag SET s = 'changed' WHERE v = 2",
    "UPDATE note SET body = 'edited' WHERE id % 4 = 0",
]


PHASE2 = [
    "UPDATE acct SET name = 'again ' || id, bal = NULL WHERE id % 7 = 0",
    "DELETE FROM acct WHERE id % 11 = 0",
    "INSERT INTO acct SELECT g, 'new' || g, 'NaN', NULL FROM generate_series(2000, 2100) g",
    "UPDATE acct SET id = id + 5000 WHERE id BETWEEN 2000 AND 2010",
    "INSERT INTO acct VALUES (10, 'back', 1, '{}')",  # a deleted key comes back
    "INSERT INTO bag VALUES (3, 's0'), (3, 's0')",
    "DELETE FROM note WHERE id > 40",
    "UPDATE note SET at = 'infinity' WHERE id = 1",
]


def _capture(srv, capdir: Path, until: str) -> None:
    code = capture_cli.main(
        ["--dsn", srv.conninfo(), "--slot", "runs", "--publication", "runs_pub", "--out",
         str(capdir), "--until-lsn", until, "--log-format", "json", "--no-fsync"]
    )  # fmt: skip
    assert code == 0


def _phase(conn, statements) -> str:
    for stmt in statements:
        conn.execute(stmt)
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


@pytest.fixture(scope="module")
def runs(pg, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    cap = tmp / "cap"
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        for stmt in SCHEMA:
            conn.execute(stmt)
        _capture(srv, cap, _phase(conn, PHASE1))
        truth1 = {t: _truth(conn, t) for t in TABLES}
        cap1 = tmp / "cap1"
        shutil.copytree(cap, cap1)
        _capture(srv, cap, _phase(conn, PHASE2))
        truth2 = {t: _truth(conn, t) for t in TABLES}
    return {"cap1": cap1, "cap": cap, "truth1": truth1, "truth2": truth2}
