"""``pgcdc sync`` brings a table's Delta table to its columns when they change with no change
of the table since (issue 61): pgoutput sends a table's Relation message only before its
next change, so ``ALTER TABLE d ADD COLUMN c int DEFAULT 5`` and no write to ``d`` left the
Delta table without ``c`` while every server row holds 5.

A real PostgreSQL 18 (one server for the module) and real Spark (a ``python -m pgcdc sync``
subprocess with ``--tables-check 2s``); another table, ``w``, is written all along so that
cycles run. After each DDL of ``d``, with no write to ``d``, the Delta table read by delta-rs
must equal the server's ``SELECT *`` (names, types, values) within a check and a cycle or
the snapshot sync takes; then a write to ``d`` follows and it must still equal, with no
second snapshot. :func:`pgcdc.sync.drift.plan` is checked alone first (no server).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from pgcdc.sync.drift import VARIES, Col, plan
from tests.support.delta import read_table
from tests.support.sync import QUICK_CHECKS, Sync  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402

INT4, INT8, TEXT, NUMERIC = 23, 20, 25, 1700
CONVERGE_TIMEOUT = 90  # seconds: a snapshot taken again starts Spark's read of the table


def _cols(*specs) -> tuple:
    return tuple(Col(*s) for s in specs)


LAKE = _cols((1, "id", INT4, -1), (2, "v", TEXT, -1), (3, "n", NUMERIC, 524294))
PLANS = [
    # (what the server's columns are now, attmissingval, rewritten, action, said)
    ((*LAKE, Col(4, "c", INT4, -1)), {"c": "5"}, False, "reshape", "added with DEFAULT '5'"),
    ((*LAKE, Col(4, "c", INT4, -1)), {"c": "5"}, True, "reshape", "added with DEFAULT '5'"),
    ((*LAKE, Col(4, "c", TEXT, -1)), {}, False, "reshape", "added (null in every row)"),
    ((*LAKE, Col(4, "c", TEXT, -1)), {}, True, "snapshot", "a value per row"),
    ((*LAKE, Col(4, "c", TEXT, -1)), {}, None, "snapshot", "may have been rewritten"),
    ((*LAKE, Col(4, "c", INT4, -1)), {"c": VARIES}, False, "snapshot", "among the partitions"),
    (LAKE[:2], {}, True, "reshape", "column n dropped"),
    (LAKE[1:], {}, False, "snapshot", "key column id dropped"),
    ((LAKE[0], Col(2, "w", TEXT, -1), LAKE[2]), {}, False, "snapshot", "v renamed to w"),
    ((Col(1, "id", INT8, -1), *LAKE[1:]), {}, True, "reshape", "column id widened"),
    ((*LAKE[:2], Col(3, "n", NUMERIC, 786440)), {}, True, "reshape", "column n widened"),
    ((*LAKE[:2], Col(3, "n", NUMERIC, 458758)), {}, True, "record", "values stand"),
    # numeric(8,2) to (6,0): fewer digits after the point, which the server rounds
    ((*LAKE[:2], Col(3, "n", NUMERIC, 393220)), {}, True, "snapshot", "column n retyped"),
    ((*LAKE[:2], Col(3, "n", TEXT, -1)), {}, True, "snapshot", "column n retyped"),
    ((LAKE[0], Col(2, "v", 1043, 24), LAKE[2]), {}, False, "record", "values stand"),
    # a column dropped and another added in one look: numbers tell them apart
    ((*LAKE[:2], Col(4, "m", TEXT, -1)), {}, False, "reshape", "n dropped, column m added"),
]


@pytest.mark.parametrize("server, missing, rewritten, action, said", PLANS)
def test_plan(server, missing, rewritten, action, said):
    got = plan(LAKE, server, missing, rewritten, keys=["id"])
    assert got.action == action and said in got.what, got


def test_plan_by_name_takes_a_drop_and_an_add_for_a_rename():
    """Columns of a Relation message have no numbers: a column dropped while another is added
    may be a rename, so the snapshot is taken."""
    lake = tuple(c._replace(attnum=None) for c in LAKE)
    got = plan(lake, (*LAKE[:2], Col(4, "m", TEXT, -1)), {}, False, keys=["id"])
    assert got == ("snapshot", "column(s) n dropped and m added (a rename reads so)")
    got = plan(lake, (LAKE[0], Col(2, "w", TEXT, -1), LAKE[2]), {}, False, keys=["id"])
    assert got == ("snapshot", "column v renamed to w")
    got = plan(lake, (*LAKE, Col(4, "c", INT4, -1)), {"c": "5"}, False, keys=["id"])
    assert got.action == "reshape"


pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv:
        yield srv


class Writes:
    """Rows written to ``table`` every 0.2 s in a thread, so that sync's cycles run."""

    def __init__(self, srv, table: str = "w"):
        self.srv, self.table, self.done = srv, table, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.srv.connect() as conn:
            i = 0
            while not self.done.wait(0.2):
                i += 1
                conn.execute(f"INSERT INTO {self.table} VALUES (%s, %s)", [i, i])

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)


def _server_rows(conn, table: str) -> tuple[list[str], list[tuple]]:
    cur = conn.execute(f"SELECT * FROM {table}")
    return [c.name for c in cur.description], sorted(tuple(r) for r in cur.fetchall())


def _delta_rows(out, table: str, names: list[str]):
    path = out / f"public.{table}"
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path)
    if "_is_current" in t.column_names:  # SCD2: the current versions
        t = t.filter(t.column("_is_current"))
    if [n for n in t.column_names if not n.startswith("_")] != names:
        return None
    return sorted(zip(*(t.column(n).to_pylist() for n in names)))


def _types(out, table: str) -> dict[str, str]:
    return {f.name: str(f.type) for f in read_table(out / f"public.{table}").schema}


def _converge(conn, out, sync: Sync, table: str, step: str, since: float, types=None) -> float:
    """Seconds from ``since`` until the Delta table equals the server's (names in order,
    values, and the Arrow ``types`` of those columns); fails after CONVERGE_TIMEOUT."""
    names, want = _server_rows(conn, table)
    types = types or {}
    while True:
        got = _delta_rows(out, table, names)
        if got == want and {k: _types(out, table)[k] for k in types} == types:
            took = time.monotonic() - since
            print(f"{step}: equal after {took:.1f}s")
            return took
        assert sync.proc.poll() is None, sync.log()
        if time.monotonic() - since > CONVERGE_TIMEOUT:
            have = read_table(out / f"public.{table}").column_names
            pytest.fail(f"{step}: columns {have} against {names}; rows {(got or [])[:2]} "
                        f"against {want[:2]}\n{sync.log()}")  # fmt: skip
        time.sleep(0.2)


def _said(sync: Sync, event: str, n: int) -> None:
    """``event`` said ``n`` times by now (its line may trail the commit it follows)."""
    with contextlib.suppress(WaitTimeout):
        until(f"{n} {event!r} events", lambda: len(sync.named(event)) >= n, 10)
    assert len(sync.named(event)) == n, sync.log()


def _write(conn, table: str, lo: int) -> None:
    """Rows of ``table`` inserted (their columns' defaults) and updated: a change after the
    DDL, whose Relation message brings the columns the Delta table already has."""
    conn.execute(f"INSERT INTO {table} (id) SELECT g FROM generate_series({lo}, {lo + 9}) g")
    conn.execute(f"UPDATE {table} SET id = id WHERE id % 7 = 0")


def test_columns_changed_with_no_change_of_the_table_reach_the_lake(server, tmp_path):
    """SCD1, the default engine: each DDL of ``d`` with no write to it, then a write."""
    srv, out = server, tmp_path / "sync"
    with srv.connect() as conn:
        conn.execute("CREATE TABLE d (id int PRIMARY KEY, v text, n numeric(8,2))")
        conn.execute("INSERT INTO d SELECT g, 'a' || g, g / 8.0 FROM generate_series(1, 200) g")
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, x int)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE d, w")
        sync = Sync(srv, out, *QUICK_CHECKS)
        writes = None
        try:
            sync.wait_for("ready")
            writes = Writes(srv)
            _converge(conn, out, sync, "d", "start", time.monotonic())
            steps = [  # (DDL, in place or by a snapshot, Delta types to check)
                ("ALTER TABLE d ADD COLUMN c int DEFAULT 5", "columns_followed", {"c": "int32"}),
                ("ALTER TABLE d ADD COLUMN note text", "columns_followed", {"note": "string"}),
                ("ALTER TABLE d DROP COLUMN v", "columns_followed", {}),
                ("ALTER TABLE d ALTER COLUMN c TYPE bigint", "columns_followed", {"c": "int64"}),
                ("ALTER TABLE d ADD COLUMN r float8 DEFAULT random()", "table_added",
                 {"r": "double"}),
                ("ALTER TABLE d ADD COLUMN at timestamptz DEFAULT clock_timestamp()",
                 "table_added", {"at": "timestamp[us, tz=UTC]"}),
                ("ALTER TABLE d RENAME COLUMN note TO memo", "table_added", {"memo": "string"}),
                ("ALTER TABLE d ALTER COLUMN n TYPE text USING (n * 2)::text", "table_added",
                 {"n": "string"}),
            ]  # fmt: skip
            took = {}
            for i, (ddl, how, types) in enumerate(steps):
                before = {e: len(sync.named(e)) for e in ("columns_followed", "table_added")}
                t0 = time.monotonic()
                conn.execute(ddl)
                took[ddl] = _converge(conn, out, sync, "d", ddl, t0, types)
                _said(sync, how, before[how] + 1)
                _write(conn, "d", 1000 * (i + 1))  # its Relation message: no snapshot again
                _converge(conn, out, sync, "d", f"a write after {ddl}", time.monotonic())
                assert {e: len(sync.named(e)) for e in before} == {
                    e: before[e] + (e == how) for e in before
                }, sync.log()
            said = [e["message"] for e in sync.named("table_added")]
            assert "column note renamed to memo" in said[2] and "column n retyped" in said[3]
            assert "a value per row" in said[0], said

            # a volatile DEFAULT and a write at once: the write's Relation message brings the
            # column, null in the rows it did not change; the table rewritten says they hold
            # a value each: the snapshot is taken again
            ddl = "ALTER TABLE d ADD COLUMN r2 float8 DEFAULT random(), then a write"
            t0 = time.monotonic()
            with conn.transaction():  # (one commit: the look sees the change's Relation too)
                conn.execute("ALTER TABLE d ADD COLUMN r2 float8 DEFAULT random()")
                _write(conn, "d", 10_000)
            took[ddl] = _converge(conn, out, sync, "d", ddl, t0)
            _said(sync, "table_added", len(said) + 1)
            said = sync.named("table_added")[-1]["message"]
            assert "column r2 added with a value per row" in said, said

            # a table renamed, no write: its new name is snapshotted as a table added, and
            # the old directory stays as it was (its changes no longer come)
            old = sorted(read_table(out / "public.d").to_pylist(), key=lambda r: r["id"])
            t0 = time.monotonic()
            conn.execute("ALTER TABLE d RENAME TO e")
            took["RENAME TO e"] = _converge(conn, out, sync, "e", "RENAME TO e", t0)
            assert sync.named("table_renamed")[0]["to"] == "public.e", sync.log()
            assert sorted(read_table(out / "public.d").to_pylist(), key=lambda r: r["id"]) == old
            _write(conn, "e", 20_000)
            _converge(conn, out, sync, "e", "a write after RENAME TO e", time.monotonic())
            print({k: round(v, 1) for k, v in took.items()})
            writes.stop()
            assert sync.stop() == 0, sync.log()
        finally:
            if writes is not None:
                writes.stop()
            if sync.proc.poll() is None:
                sync.proc.kill()


def test_with_scd2_columns_added_and_dropped_in_place_and_a_rename_said(server, tmp_path):
    """``--scd 2`` (and ``--engine loop``): a column added with a constant DEFAULT and one
    dropped are done in place, the history kept (its closed versions hold null in the column
    added, as apply's own run gives them). A rename would need the snapshot, which would
    replace the history: said once (``columns_changed``), the table left as it is until its
    next change, which reads as the stream gives it (null in ``memo`` where not changed)."""
    srv, out = server, tmp_path / "sync"
    with srv.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, note text, x int)")
        conn.execute("INSERT INTO h SELECT g, 'a' || g, g FROM generate_series(1, 20) g")
        conn.execute("CREATE TABLE w2 (id int PRIMARY KEY, x int)")
        conn.execute("CREATE PUBLICATION pub2 FOR TABLE h, w2")
        sync = Sync(srv, out, "--scd", "2", "--engine", "loop", *QUICK_CHECKS, slot="s2",
                    publication="pub2")  # fmt: skip
        writes = None
        try:
            sync.wait_for("ready")
            writes = Writes(srv, "w2")
            conn.execute("UPDATE h SET note = note || '+' WHERE id <= 5")  # closed versions
            _converge(conn, out, sync, "h", "updates", time.monotonic())

            def closed() -> list[dict]:
                t = read_table(out / "public.h")
                return sorted((r for r in t.to_pylist() if not r["_is_current"]),
                              key=lambda r: r["id"])  # fmt: skip

            for i, ddl in enumerate(["ALTER TABLE h ADD COLUMN c int DEFAULT 5",
                                     "ALTER TABLE h DROP COLUMN x"]):  # fmt: skip
                t0 = time.monotonic()
                conn.execute(ddl)
                _converge(conn, out, sync, "h", ddl, t0)
                _said(sync, "columns_followed", i + 1)
                assert [(r["id"], r["note"], r["c"]) for r in closed()] == [
                    (n, f"a{n}", None) for n in range(1, 6)
                ]
            assert "x" not in read_table(out / "public.h").column_names

            conn.execute("ALTER TABLE h RENAME COLUMN note TO memo")
            said = sync.wait_for("columns_changed", CONVERGE_TIMEOUT)
            assert said["table"] == "public.h", sync.log()
            assert "column note renamed to memo" in said["message"], sync.log()
            assert "note" in read_table(out / "public.h").column_names  # left as it is
            conn.execute("UPDATE h SET memo = memo || '!' WHERE id <= 2")
            lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            sync.wait_applied(lsn)
            t = read_table(out / "public.h").to_pylist()
            current = {r["id"]: r for r in t if r["_is_current"]}
            assert {i: current[i]["memo"] for i in (1, 2, 3)} == {1: "a1+!", 2: "a2+!", 3: None}
            assert [r["id"] for r in closed()] == [1, 1, 2, 2, 3, 4, 5]  # the history kept
            writes.stop()
            assert sync.stop() == 0, sync.log()
            assert len(sync.named("columns_changed")) == 1, sync.log()
            assert not sync.named("table_added"), sync.log()
        finally:
            if writes is not None:
                writes.stop()
            if sync.proc.poll() is None:
                sync.proc.kill()
