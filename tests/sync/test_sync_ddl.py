"""``pgcdc sync`` keeps a table equal to the server's while its columns change under it.

A real PostgreSQL 18 and real Spark (a ``python -m pgcdc sync`` subprocess, as
tests/sync/test_sync.py runs it). While sync runs, with writes between each step, table ``d``
gets:

- ``ADD COLUMN c int DEFAULT 5``: the rows written before hold 5 on the server
  (``attmissingval``) and no change says so;
- ``ADD COLUMN note text`` (no default: null in the rows before);
- ``DROP COLUMN v``;
- ``ALTER COLUMN ... TYPE`` widening three columns, the key among them: ``id`` and ``c`` to
  bigint, ``n`` from numeric(8,2) to numeric(12,4) (a table rewrite, no change in the
  stream: the rows not changed since keep the values they had, which the server's equal).

After each step the Delta table must equal the server's table, every column, read by
delta-rs (independent of pgcdc's own reading). The expected rows are the server's,
``SELECT *`` at the quiet point. After the widening, and still after the cycles and the
rerun that follow, the Delta columns have the wider types (int64, decimal(12,4)): the
column follows the server's type, rather than turning to text for the runs that read both
versions. Then a ``RENAME COLUMN``, which the stream cannot tell from a column dropped and
another added (the capture says so once, ``column_renamed``), and a retype that rewrites the
values (``numeric`` to ``text USING``): sync takes the table's snapshot again after each, and
the table equals the server's again.
"""

from __future__ import annotations

import contextlib
import threading

import pytest

from tests.support.delta import read_table
from tests.support.sync import QUICK_CHECKS, Sync  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

from deltalake import DeltaTable  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402

CONVERGE_TIMEOUT = 90


def _server(conn) -> tuple[list[str], list[tuple]]:
    cur = conn.execute("SELECT * FROM d ORDER BY id")
    names = [c.name for c in cur.description]
    return names, [tuple(r) for r in cur.fetchall()]


def _count(conn) -> int:
    return conn.execute("SELECT count(*) FROM d").fetchone()[0]


def _delta_types(out) -> dict:
    t = read_table(out / "public.d")
    return {f.name: str(f.type) for f in t.schema}


def _delta(out, names: list[str]) -> list[tuple] | None:
    path = out / "public.d"
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path)
    if sorted(n for n in t.column_names if not n.startswith("_")) != sorted(names):
        return None
    cols = [t.column(n).to_pylist() for n in names]
    return sorted(zip(*cols))


def _equal(conn, out, sync: Sync, step: str) -> None:
    names, want = _server(conn)
    seen = [None]

    def equal():
        seen[0] = _delta(out, names)
        assert seen[0] == want or sync.proc.poll() is None, sync.log()
        return seen[0] == want

    with contextlib.suppress(WaitTimeout):
        return until(f"{step}: the server's rows in the Delta table", equal, CONVERGE_TIMEOUT, 0.1)
    got = seen[0]
    t = read_table(out / "public.d")
    pytest.fail(
        f"{step}: the Delta table is not the server's; columns {t.column_names} against "
        f"{names}; first rows {(got or [])[:3]} against {want[:3]}\n{sync.log()}"
    )


def _table(path, version: int | None = None) -> list[tuple] | None:
    """The Delta table at ``path``'s rows (at ``version``), sorted, its columns in its order."""
    if not (path / "_delta_log").is_dir():
        return None
    t = read_table(path, version)
    names = [n for n in t.column_names if not n.startswith("_")]
    return sorted(zip(*(t.column(n).to_pylist() for n in names)))


def _read_until(path, done: threading.Event, failures: list) -> None:
    """Read the Delta table at ``path`` every 20 ms until ``done``: each failure kept."""
    while not done.wait(0.02):
        try:
            DeltaTable(str(path)).to_pyarrow_table()
        except Exception as e:  # noqa: BLE001 - what a reader would meet
            failures.append(repr(e))


def _writes(conn, lo: int, hi: int, cols: str, values: str) -> None:
    conn.execute(f"INSERT INTO d (id, {cols}) SELECT g, {values} FROM generate_series("
                 f"{lo}, {hi}) g")  # fmt: skip
    conn.execute(f"DELETE FROM d WHERE id % 13 = 0 AND id < {lo}")


def _synced(srv, conn, out, published: str, n: str, hi: int) -> Sync:
    """Table ``d`` (200 rows, ``n`` the values of its numeric column) in a publication
    ``published``, a sync started on it, ``hi - 999`` rows written and the table equal."""
    conn.execute("CREATE TABLE d (id int PRIMARY KEY, v text, n numeric(8,2))")
    conn.execute(f"INSERT INTO d SELECT g, 'a' || g, {n} FROM generate_series(1, 200) g")
    conn.execute(f"CREATE PUBLICATION pub {published}")
    sync = Sync(srv, out, *QUICK_CHECKS)
    try:
        sync.wait_for("ready")
        _writes(conn, 1000, hi, "v", "'w' || g")
        _equal(conn, out, sync, "before any change")
    except BaseException:
        sync.proc.kill()
        raise
    return sync


def test_columns_added_dropped_and_widened_while_sync_runs(pg, tmp_path):
    with pg.database("pg18") as srv, srv.connect() as conn:
        out = tmp_path / "sync"
        sync = _synced(srv, conn, out, "FOR TABLE d", "g / 8.0", 1099)
        try:
            conn.execute("ALTER TABLE d ADD COLUMN c int DEFAULT 5")
            conn.execute("UPDATE d SET v = v || '+' WHERE id % 7 = 0")  # some rows carry c
            _writes(conn, 2000, 2099, "v, c", "'x' || g, g")
            _equal(conn, out, sync, "ADD COLUMN c int DEFAULT 5")

            conn.execute("ALTER TABLE d ADD COLUMN note text")
            _writes(conn, 3000, 3049, "v, c, note", "'y' || g, -g, 'n' || g")
            conn.execute("UPDATE d SET note = 'late' WHERE id % 10 = 1")
            _equal(conn, out, sync, "ADD COLUMN note text")

            conn.execute("ALTER TABLE d DROP COLUMN v")
            _writes(conn, 4000, 4049, "c, note", "g * 2, 'z'")
            _equal(conn, out, sync, "DROP COLUMN v")

            conn.execute("ALTER TABLE d ALTER COLUMN c TYPE bigint, ALTER COLUMN id TYPE bigint,"
                         " ALTER COLUMN n TYPE numeric(12,4)")  # fmt: skip
            _writes(conn, 5000, 5049, "c, note, n", "g::bigint * 10000000000, 'big', g / 3.0")
            conn.execute("UPDATE d SET id = id + 10000000000 WHERE id % 17 = 0")
            _equal(conn, out, sync, "ALTER COLUMN ... TYPE (wider)")
            wider = {"id": "int64", "c": "int64", "n": "decimal128(12, 4)"}
            assert {k: _delta_types(out)[k] for k in wider} == wider

            _writes(conn, 6000, 6049, "c, note", "1, 'later'")
            conn.execute("UPDATE d SET note = note || '!' WHERE id % 9 = 0")
            _equal(conn, out, sync, "changes after the widening")
            assert {k: _delta_types(out)[k] for k in wider} == wider
            assert sync.stop() == 0, sync.log()

            # a rerun reads the captures again from the tables' position: the same types
            sync = Sync(srv, out, *QUICK_CHECKS)
            sync.wait_for("ready")
            _writes(conn, 7000, 7049, "c, note, n", "2, 'again', 0.0001")
            _equal(conn, out, sync, "a rerun")
            assert {k: _delta_types(out)[k] for k in wider} == wider

            # a rename, which the stream cannot tell from a drop and an add: the capture says
            # so once, and sync takes the table's snapshot again (the rows not changed since
            # would hold null in memo)
            conn.execute("ALTER TABLE d RENAME COLUMN note TO memo")
            _writes(conn, 8000, 8009, "c, memo", "3, 'renamed'")
            said = sync.wait_for("column_renamed")
            assert said["table"] == "public.d" and said["columns"] == [["note", "memo"]]
            _equal(conn, out, sync, "RENAME COLUMN note TO memo")
            (again,) = sync.named("table_added")
            assert "column note renamed to memo" in again["message"], sync.log()

            # a retype that rewrites the values (a float to text): snapshotted again too
            conn.execute("ALTER TABLE d ALTER COLUMN n TYPE text USING (n * 2)::text")
            _writes(conn, 9000, 9009, "c, memo, n", "4, 'text', 'n' || g")
            _equal(conn, out, sync, "ALTER COLUMN n TYPE text USING ...")
            assert len(sync.named("table_added")) == 2, sync.log()
            assert sync.stop() == 0, sync.log()
            assert len(sync.named("column_renamed")) == 1, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()


def test_with_scd2_a_rename_is_said_and_the_history_kept(pg, tmp_path):
    """Under ``--scd 2`` a table's Delta directory is its history: a rename is not followed
    by a new snapshot (it would replace that history); sync says so once
    (``columns_changed``), and the history goes on under the new name."""
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE d (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO d SELECT g, 'a' || g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE d")
        out = tmp_path / "sync"
        sync = Sync(srv, out, "--scd", "2", *QUICK_CHECKS)
        try:
            sync.wait_for("ready")
            conn.execute("UPDATE d SET note = note || '+' WHERE id <= 5")
            conn.execute("ALTER TABLE d RENAME COLUMN note TO memo")
            conn.execute("UPDATE d SET memo = memo || '!' WHERE id <= 2")
            lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            said = sync.wait_for("columns_changed", 90)
            assert said["table"] == "public.d" and "note renamed to memo" in said["message"]
            # the check that said it may come before the cycle that applies the last update
            sync.wait_applied(lsn)
            assert sync.stop() == 0, sync.log()
            assert len(sync.named("columns_changed")) == 1, sync.log()
            assert not sync.named("table_added"), sync.log()
            t = read_table(out / "public.d").to_pylist()
            current = {r["id"]: r for r in t if r["_is_current"]}
            assert sorted(current) == list(range(1, 21))
            server = dict(conn.execute("SELECT id, memo FROM d").fetchall())
            # changed after the rename: as the server has it; the rows not changed since hold
            # null in memo (what the stream gives: said by columns_changed)
            assert {i: current[i]["memo"] for i in (1, 2)} == {1: "a1+!", 2: "a2+!"}
            assert server[1] == "a1+!" and current[3]["memo"] is None
            closed = sorted(r["id"] for r in t if not r["_is_current"])
            assert closed == [1, 1, 2, 2, 3, 4, 5]  # the history, kept through the rename
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()


def test_a_table_dropped_and_created_again_is_snapshotted_again(pg, tmp_path):
    """A publication ``FOR ALL TABLES`` goes on publishing a table dropped and created again
    under its name, and the stream says nothing of the old rows going: the DROP is no change.
    Neither is the swap of online schema change tools (a new table filled from the old, the
    old dropped, the new renamed to its name), whose rows came under the new table's first
    name. sync compares each table's OID with its last snapshot's and takes the snapshot
    again; a table renamed (the same OID under another name) is said as such."""
    with pg.database("pg18") as srv, srv.connect() as conn:
        out = tmp_path / "sync"
        sync = _synced(srv, conn, out, "FOR ALL TABLES", "g", 1049)
        try:
            before = DeltaTable(str(out / "public.d"))
            old_version, old_rows = before.version(), _table(out / "public.d")

            # a reader meanwhile: the snapshot taken again is swapped in by one commit
            failures, done = [], threading.Event()
            threading.Thread(target=_read_until, args=(out / "public.d", done, failures),
                             daemon=True).start()  # fmt: skip
            conn.execute("DROP TABLE d")
            conn.execute("CREATE TABLE d (id int PRIMARY KEY, v text, n numeric(8,2))")
            _writes(conn, 1, 5, "v", "'new' || g")
            _equal(conn, out, sync, "dropped and created again")
            done.set()
            (again,) = sync.named("table_added")
            assert "dropped and another created under its name" in again["message"], sync.log()
            assert failures == [], failures[:3]  # never missing nor half loaded
            # the old table's rows stay readable by time travel
            assert _table(out / "public.d", old_version) == old_rows

            conn.execute("CREATE TABLE d_new (id int PRIMARY KEY, v text, n numeric(8,2), x int)")
            conn.execute("INSERT INTO d_new SELECT id, v || '+', n, 1 FROM d")
            conn.execute("INSERT INTO d_new SELECT g, 's' || g, 0, 2 FROM generate_series(6, 30) g")
            with conn.transaction():
                conn.execute("DROP TABLE d")
                conn.execute("ALTER TABLE d_new RENAME TO d")
            conn.execute("UPDATE d SET v = 'after' WHERE id % 4 = 0")
            _equal(conn, out, sync, "swapped for a new table")
            assert len(sync.named("table_added")) >= 2, sync.log()
            assert sync.stop() == 0, sync.log()

            # a rerun: the new snapshot's mark holds (no snapshot taken again for it); then a
            # rename of the table, said as one, its new name snapshotted as a table added
            sync = Sync(srv, out, *QUICK_CHECKS)
            sync.wait_for("ready")
            _writes(conn, 2000, 2009, "v, x", "'r', 3")
            _equal(conn, out, sync, "a rerun")
            conn.execute("ALTER TABLE d RENAME TO e")
            conn.execute("UPDATE e SET v = 'renamed' WHERE id % 5 = 0")
            said = sync.wait_for("table_renamed", 90)
            assert (said["table"], said["to"]) == ("public.d", "public.e"), sync.log()
            added = sync.wait_for("table_added")  # (said by the snapshot's thread)
            assert added["tables"] == ["public.e"], sync.log()  # the new name only
            want = conn.execute("SELECT id, v, n, x FROM e ORDER BY id").fetchall()
            with contextlib.suppress(WaitTimeout):
                until(
                    "public.e applied",
                    lambda: _table(out / "public.e") == want,
                    CONVERGE_TIMEOUT,
                    0.1,
                )
            assert _table(out / "public.e") == want, sync.log()
            assert sync.stop() == 0, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()
