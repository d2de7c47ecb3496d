"""Tables named as real schemas name them, through ``pgcdc sync``, ``changes``, ``apply`` and
``status``, against a real PostgreSQL 18 and real Spark.

The names: ``public."weird.name"`` beside ``"public.weird".name`` (one location each, although
``schema.table`` is the same string), mixed case and a space, non-ASCII, reserved words, a
schema starting with ``_``, a 63-byte name, quotes and glob characters. Each Delta table must sit
at the location docs/sync.md gives for its names (written out here by that rule, not by
pgcdc's function) and hold the server's rows, read by delta-rs; nothing else may be there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.delta import read_table
from tests.support.sync import CONVERGE_TIMEOUT, QUICK_CHECKS, Sync  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

LONG = "l" * 63
# (schema, table, its location by docs/sync.md's rule: every character but letters, digits,
# "_" and "-" as "~" and its UTF-8 bytes in hex; a leading "_" too; the parts joined by ".")
TABLES = [
    ("public", "weird.name", "public.weird~2Ename"),
    ("public.weird", "name", "public~2Eweird.name"),
    ("Sales", "Order Items", "Sales.Order~20Items"),
    ("ñandú", "列", "ñandú.列"),
    ("select", "from", "select.from"),
    ("_staging", "t", "~5Fstaging.t"),
    ("public", LONG, f"public.{LONG}"),
    ("public", 'q"uote*[1]', "public.q~22uote~2A~5B1~5D"),
]
# the other table's location a collision would have used
NOT_THERE = "public.weird.name"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _q(schema: str, table: str) -> str:
    return f"{_ident(schema)}.{_ident(table)}"


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        for i, (schema, table, _) in enumerate(TABLES):
            if schema != "public":
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(schema)}")
            # each table its own column and row count: rows of one in another show
            conn.execute(f"CREATE TABLE {_q(schema, table)} (id int PRIMARY KEY, c{i} text)")
            conn.execute(f"INSERT INTO {_q(schema, table)} SELECT g, '{i}-' || g "
                         f"FROM generate_series(1, {100 + 50 * i}) g")  # fmt: skip
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        yield srv, conn


def _server_rows(conn, schema: str, table: str) -> list[tuple]:
    return sorted(conn.execute(f"SELECT * FROM {_q(schema, table)}").fetchall())


def _lake_rows(path) -> tuple[list[str], list[tuple]] | None:
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path)
    names = [n for n in t.column_names if not n.startswith("_")]
    return names, sorted(zip(*(t.column(n).to_pylist() for n in names)))


def _converged(conn, out) -> None:
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    for i, (schema, table, where) in enumerate(TABLES):
        want = (["id", f"c{i}"], _server_rows(conn, schema, table))
        left = max(deadline - time.monotonic(), 0)
        until(f"{schema}.{table} at {where}", lambda w=where, r=want: _lake_rows(out / w) == r,
              left, 0.1)  # fmt: skip


def _writes(conn, n: int) -> None:
    for i, (schema, table, _) in enumerate(TABLES):
        q = _q(schema, table)
        conn.execute(f"INSERT INTO {q} VALUES (%s, %s)", [10_000 + n, f"new {n}"])
        conn.execute(f"UPDATE {q} SET c{i} = c{i} || '+' WHERE id = %s", [n])
        conn.execute(f"DELETE FROM {q} WHERE id = %s", [n + 1])


def _pgcdc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_every_name_has_its_own_place(server, tmp_path):
    srv, conn = server
    out = tmp_path / "sync"
    sync = Sync(srv, out, *QUICK_CHECKS)
    try:
        sync.wait_for("ready")
        _converged(conn, out)
        _writes(conn, 7)
        _converged(conn, out)
        # a table added while it runs, whose name holds the other's: its own place too
        conn.execute('CREATE TABLE "public.weird"."weird.name" (id int PRIMARY KEY, z text)')
        conn.execute("""INSERT INTO "public.weird"."weird.name" VALUES (1, 'z')""")
        want = (["id", "z"], [(1, "z")])
        until(f"public.weird.weird.name in the lake\n{sync.log()}",
              lambda: _lake_rows(out / "public~2Eweird.weird~2Ename") == want,
              CONVERGE_TIMEOUT, 0.1)  # fmt: skip
        _converged(conn, out)
        assert not sync.named("error"), sync.log()
        assert not [e for e in sync.events if e.get("event") == "table_renamed"], sync.log()
    finally:
        assert sync.stop() == 0, sync.log()
    assert "Traceback" not in "".join(sync.other), sync.log()
    tables = {p.name for p in out.iterdir() if not p.name.startswith(("_", "."))}
    assert NOT_THERE not in tables
    assert tables == {w for *_, w in TABLES} | {"public~2Eweird.weird~2Ename"}

    # status names each table by its location, and counts its rows
    st = _pgcdc("status", str(out), "--json")
    assert st.returncode == 0, st.stderr
    doc = json.loads(st.stdout)
    counts = {n: t.get("rows") for n, t in doc["apply"]["tables"].items()}
    for schema, table, where in TABLES:
        assert counts[where] == len(_server_rows(conn, schema, table))

    # changes: --table takes the names as PostgreSQL spells them, or the location
    capture = out / "_capture"
    for pattern in ("public.weird.name", "public~2Eweird.name"):
        ch = _pgcdc("changes", str(capture), "--table", pattern)
        assert ch.returncode == 0, ch.stderr
        seen = {(e["source"]["schema"], e["source"]["table"])
                for e in map(json.loads, ch.stdout.splitlines())}  # fmt: skip
        # a glob on schema.table matches both tables that spell it; the location only one
        want = {("public.weird", "name")}
        if pattern == "public.weird.name":
            want.add(("public", "weird.name"))
        assert seen == want

    # apply of the same capture into a directory of its own: the same places
    applied = tmp_path / "applied"
    ap = _pgcdc("apply", str(capture), "--out", str(applied), "--master", "local[1]",
                "--table", "public.weird.name")  # fmt: skip
    assert ap.returncode == 0, ap.stderr
    assert {p.name for p in applied.iterdir() if not p.name.startswith("_")} <= {
        "public.weird~2Ename", "public~2Eweird.name"}  # fmt: skip

    # prune of the capture as far as the tables hold: the names do not matter to it
    pr = _pgcdc("prune", str(capture), "--applied-state", str(out), "--dry-run", "--json")
    assert pr.returncode == 0, pr.stderr


def test_a_snapshot_puts_each_table_in_its_place(server, tmp_path):
    srv, conn = server
    snap = tmp_path / "snap"
    sn = _pgcdc("snapshot", "--dsn", srv.conninfo(), "--slot", "names_snap", "--publication",
                "pub", "--out", str(snap), "--cores", "1")  # fmt: skip
    try:
        assert sn.returncode == 0, sn.stderr
    finally:
        conn.execute("SELECT pg_drop_replication_slot('names_snap')")
    import pyarrow.parquet as pq

    for i, (schema, table, where) in enumerate(TABLES):
        t = pq.read_table(snap / where)
        got = sorted(zip(t.column("id").to_pylist(), t.column(f"c{i}").to_pylist()))
        assert got == _server_rows(conn, schema, table), where
