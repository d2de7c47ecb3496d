"""``pgcdc sync`` (PostgreSQL 18, real Spark): a table added to the publication of a running
sync is snapshotted while the other tables go on being applied.

The added table's snapshot is held up on purpose: a transaction with a transaction id is left
open before the table is published, and the temporary slot the snapshot is exported from
waits for it (the server builds a slot's snapshot only once the transactions running at its
creation have ended). Rows written to the other table meanwhile reach its Delta table, with no
``table_added_done`` yet; once the transaction ends the added table is loaded, and it equals
the server's, with its changes from before, during and after its snapshot (those committed
while it was read, though the other table's cycles had applied past them).
"""

from __future__ import annotations

import time

import pytest

from tests.support.sync import CONVERGE_TIMEOUT, QUICK_CHECKS, Sync, _table_rows  # noqa: E402
from tests.support.sync_added import _converge, _rows  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

CHECK_WAIT = 90  # seconds: for the added table's snapshot (Spark starts for it)


def _synced(srv, conn, out, *extra: str) -> Sync:
    """Table ``t`` (100 rows) published, a sync started on it (``extra``: its options), the
    Delta table equal."""
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 100) g")
    conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    sync = Sync(srv, out, *extra)
    try:
        sync.wait_for("ready")
        _converge(conn, out, sync, "t")
    except BaseException:
        sync.proc.kill()
        raise
    return sync


def test_other_tables_are_applied_while_an_added_table_is_snapshotted(pg, tmp_path):
    out = tmp_path / "sync"
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE u (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 3000) g")
        conn.execute("CREATE TABLE side (id int)")
        sync = _synced(srv, conn, out)
        try:
            assert sync.stop() == 0, sync.log()
            with srv.connect() as blocker:
                blocker.autocommit = False
                blocker.execute("INSERT INTO side VALUES (1)")  # open, with a transaction id
                conn.execute("ALTER PUBLICATION pub ADD TABLE u")
                conn.execute("UPDATE u SET v = v || '+' WHERE id % 5 = 0")
                # a rerun compares the tables after its first cycle (a running sync within
                # 30 s); its Spark starts for the snapshot, in the thread
                sync = Sync(srv, out)
                sync.wait_for("table_added", CHECK_WAIT)
                time.sleep(2)  # its slot is waiting for the open transaction by now
                conn.execute("INSERT INTO t SELECT g, 'b' || g FROM generate_series(101, 400) g")
                conn.execute("UPDATE t SET v = v || '!' WHERE id % 3 = 0")
                conn.execute("DELETE FROM u WHERE id % 7 = 0")
                _converge(conn, out, sync, "t")  # applied while the snapshot is held up
                assert not sync.named("table_added_done"), sync.log()
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'"
                    " AND query LIKE 'CREATE_REPLICATION_SLOT%%'"
                ).fetchone()[0]
                assert waiting == 1, sync.log()
                blocker.rollback()
            # changes to both while the snapshot is read: cycles apply t's (the applied
            # position passes u's changes), the load still applies u's after its point
            i = 2000
            while not sync.named("table_added_done") and i < 2000 + 60 * 40:
                conn.execute("UPDATE u SET v = %s WHERE id = %s", [f"d{i}", i % 3000 + 1])
                conn.execute("INSERT INTO t VALUES (%s, 'c')", [i])
                i += 1
                time.sleep(0.025)
            done = sync.wait_for("table_added_done", CHECK_WAIT)
            assert "public.u" in done["tables"], sync.log()
            _converge(conn, out, sync, "u")
            conn.execute("UPDATE u SET v = 'after' WHERE id < 50")
            conn.execute("INSERT INTO t VALUES (1000, 'last')")
            _converge(conn, out, sync, "u")
            _converge(conn, out, sync, "t")
            assert sync.stop() == 0, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()


def test_a_table_removed_and_added_back_between_two_checks_is_snapshotted_again(pg, tmp_path):
    """pgoutput sends no change of a table while it is out of the publication, and sync looks
    at the publication every 30 s: a table removed and added back between two looks, or
    while sync is down, had changes that never came. The catalog row that puts it in the
    publication is a new one then (its OID), so sync takes its snapshot again
    (``table_republished``): the Delta table equals the server's."""
    out = tmp_path / "sync"
    with pg.database("pg18") as srv, srv.connect() as conn:
        sync = _synced(srv, conn, out)  # (its first check is right after ready)
        try:
            conn.execute("ALTER PUBLICATION pub DROP TABLE t")
            conn.execute("UPDATE t SET v = 'unseen' WHERE id <= 10")
            conn.execute("DELETE FROM t WHERE id > 90")
            conn.execute("ALTER PUBLICATION pub ADD TABLE t")
            conn.execute("INSERT INTO t VALUES (1000, 'seen')")
            _converge(conn, out, sync, "t")  # (by the snapshot taken again, below)
            (said,) = sync.named("table_republished")
            assert said["tables"] == ["public.t"], sync.log()
            assert not sync.named("table_unpublished"), sync.log()  # (not seen out)
            assert sync.stop() == 0, sync.log()

            # the same while sync is down: its rerun's first check sees it
            conn.execute("ALTER PUBLICATION pub DROP TABLE t")
            conn.execute("UPDATE t SET v = 'down' WHERE id BETWEEN 20 AND 30")
            conn.execute("ALTER PUBLICATION pub ADD TABLE t")
            sync = Sync(srv, out)
            _converge(conn, out, sync, "t")
            assert sync.named("table_republished"), sync.log()
            assert len(sync.named("table_added")) == 1, sync.log()
            assert sync.stop() == 0, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()


def test_a_dropped_partition_is_said_and_dropping_and_adding_the_table_back_mends_it(pg, tmp_path):
    """Published through its root (``publish_via_partition_root``), a partitioned table loses
    a dropped partition's rows with no change in the stream: sync says so
    (``partition_removed``) with the way out, and that way (the table dropped from the
    publication and added back at once) has it snapshotted again: equal to the server's."""
    out = tmp_path / "sync"
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        for lo in (0, 100, 200):
            conn.execute(f"CREATE TABLE t_{lo} PARTITION OF t FOR VALUES FROM ({lo}) "
                         f"TO ({lo + 100})")  # fmt: skip
        conn.execute("INSERT INTO t SELECT g, 'a' || g FROM generate_series(0, 299) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t WITH (publish_via_partition_root)")
        sync = Sync(srv, out, *QUICK_CHECKS)
        try:
            # dropped once the snapshot is taken, before sync's first check (which runs
            # after ready, seconds later): that check compares with the snapshot's record
            sync.wait_for("snapshot_done")
            conn.execute("DROP TABLE t_0")
            conn.execute("UPDATE t SET v = 'b' WHERE id % 10 = 0")
            said = sync.wait_for("partition_removed", CHECK_WAIT)
            assert said["table"] == "public.t" and len(said["partitions"]) == 1, sync.log()
            assert len(_table_rows(out, "public.t")) == 300  # kept, as said
            # in one transaction: no look of sync's can fall between the two
            conn.execute("ALTER PUBLICATION pub DROP TABLE t; ALTER PUBLICATION pub ADD TABLE t")
            _converge(conn, out, sync, "t")
            assert sync.named("table_republished"), sync.log()
            assert len(sync.named("partition_removed")) == 1, sync.log()
            assert sync.stop() == 0, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()


@pytest.mark.parametrize("engine", ["streaming", "loop"])
def test_a_primary_key_dropped_under_full_identity_is_said_and_a_snapshot_mends_it(
    pg, engine, tmp_path
):
    """REPLICA IDENTITY FULL, then the primary key dropped: the Relation messages name every
    column, so apply goes on merging by ``id`` and a second row equal to one it has is one
    row. sync's check says so (``key_changed``, with the way out), once a run; taking the
    snapshot again as it says gives the server's rows, the twin row too. Either engine looks
    at the tables every ``--tables-check``."""
    out = tmp_path / "sync"
    with pg.database("pg18") as srv, srv.connect() as conn:
        sync = _synced(srv, conn, out, *QUICK_CHECKS, "--engine", engine)
        try:
            conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
            conn.execute("ALTER TABLE t DROP CONSTRAINT t_pkey")
            conn.execute("INSERT INTO t VALUES (1, 'a1'), (2, 'two')")  # 1: a twin of a row
            changed = time.monotonic()
            said = sync.wait_for("key_changed", CHECK_WAIT)
            # --tables-check 2s: seen at a look seconds later (the next at 30 s by default,
            # the first came right after ready)
            assert time.monotonic() - changed < 20, sync.log()
            assert said["table"] == "public.t" and said["keys"] == ["id"], sync.log()
            assert said["primary_key"] is None, sync.log()
            assert len(sync.named("key_changed")) == 1, sync.log()  # once
            until(f"(2, 'two') applied\n{sync.log()}",
                  lambda: (2, "two") in (_table_rows(out, "public.t") or []),
                  CONVERGE_TIMEOUT, 0.1)  # fmt: skip
            assert len(_rows(conn, "t")) == 102  # the server's; the Delta table holds 100
            assert len(_table_rows(out, "public.t")) == 100, sync.log()

            conn.execute("ALTER PUBLICATION pub DROP TABLE t; ALTER PUBLICATION pub ADD TABLE t")
            sync.wait_for("table_added_done", CHECK_WAIT)
            conn.execute("INSERT INTO t VALUES (2, 'two')")
            _converge(conn, out, sync, "t")
            assert sync.stop() == 0, sync.log()
        finally:
            if sync.proc.poll() is None:
                sync.proc.kill()
