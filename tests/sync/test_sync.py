"""``pgcdc sync`` against a real PostgreSQL 18 and real Spark (a ``python -m pgcdc sync``
subprocess on local[1]): the tables it keeps equal the server's.

One pipeline directory through its life: a table with rows before the slot exists; sync
starts from empty (snapshot, capture, apply); writes while it runs (equal, each change counted
once in the cycles' lines); SIGKILL in the middle of a write workload, more writes while it is
down, a rerun (equal again), SIGTERM (exit 0, equal); a rerun with nothing new (no snapshot,
no apply); a table published later, and one taken out of the publication and published
again (snapshotted each time); the slot dropped under it (exit 2, saying the tables need a new
snapshot), and a rerun then (exit 2 before Spark starts). And the set-up refusal: a slot that exists for a
directory that holds nothing of it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.sync import (
    CONVERGE_TIMEOUT,
    Sync,
    _converge,
    _drop_slot,
    _invalidate,
    _killed_under_writes,
    _server_rows,
    _table_rows,
    _writes,
)  # noqa: E402
from tests.wait import WaitTimeout, until  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def _converge_t2(conn, out, sync: Sync) -> None:
    want = sorted(conn.execute("SELECT id, v FROM t2").fetchall())
    until(f"t2's rows in its Delta table\n{sync.log()}",
          lambda: _table_rows(out, "public.t2") == want, CONVERGE_TIMEOUT, 0.1)  # fmt: skip


def test_sync_snapshot_stream_kill_rerun(server, tmp_path):
    srv, conn = server
    out = tmp_path / "sync"

    # from empty: the snapshot (2000 rows), then writes while it runs
    sync = Sync(srv, out)
    sync.wait_for("ready")
    assert sync.named("snapshot_done")[0]["tables"] == {"public.t": 2000}
    _writes(conn, 10_000, 300)
    _converge(conn, out, sync)
    # the cycles' lines count every change once: 300 inserts, the updates of the ids divisible
    # by 7 and the deletes of those divisible by 11 (all below 10000)
    want = 300 + len(range(7, 2001, 7)) + len(range(11, 2001, 11))
    until(f"{want} events applied", lambda: sum(a["events"] for a in sync.named("apply")) >= want,
          CONVERGE_TIMEOUT)  # fmt: skip
    assert sum(a["events"] for a in sync.named("apply")) == want, sync.log()
    assert all(a["lag_bytes"] is not None for a in sync.named("apply"))

    # SIGKILL while writes go on, more writes while it is down, a rerun: equal again; SIGTERM
    # then stops it with exit 0, the tables equal to the server's
    _killed_under_writes(srv, sync, 4)
    _writes(conn, 90_000, 200)
    sync = Sync(srv, out, "--metrics", "0")
    sync.wait_for("ready")
    assert not sync.named("snapshot"), sync.log()
    _converge(conn, out, sync)
    _scrape_checks(sync, conn)
    # caught up, the rerun prunes: the segments applied, and the loaded snapshot's rows (the
    # Delta table holds them); its _snapshot.json stays, and the runs below go on without them
    pruned = sync.wait_for("snapshot_pruned")
    assert pruned["tables"] == ["public.t"] and pruned["bytes"] > 0, sync.log()
    assert not (out / "_snapshot" / "public.t").exists()
    assert (out / "_snapshot" / "_snapshot.json").exists()
    assert sync.stop() == 0, sync.log()
    assert sync.named("stopped"), sync.log()
    assert _table_rows(out) == _server_rows(conn)

    # nothing new: no snapshot, no apply, ready soon after Spark is up. Then a table published
    # since the initial snapshot, with rows it held before and changes after: snapshotted by
    # itself and loaded, its rows equal the server's
    conn.execute("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO t2 SELECT g, 'a' FROM generate_series(1, 50) g")
    conn.execute("ALTER PUBLICATION pub ADD TABLE t2")
    conn.execute("UPDATE t2 SET v = 'b' WHERE id <= 10")
    sync = Sync(srv, out)
    ready = sync.wait_for("ready")
    took = time.monotonic() - sync.started
    # nothing new for t; t2's update is in the slot (t2 was published before it), and a
    # first cycle that finds it durable applies it before the ready line (added.py: the
    # added table's changes are applied from the start, its snapshot replaces them)
    assert not sync.named("snapshot"), sync.log()
    assert all(set(a["tables"]) == {"public.t2"} for a in sync.named("apply")), sync.log()
    assert took < 45, f"a rerun with nothing new took {took:.1f}s to be ready"
    assert ready["applied_lsn"]
    sync.wait_for("table_added_done")
    conn.execute("UPDATE t2 SET v = 'c' WHERE id > 45")
    _converge_t2(conn, out, sync)

    # t2 out of the publication (a run notices it), changed while out, published again: the
    # next run snapshots it again, and its rows equal the server's
    assert sync.stop() == 0, sync.log()
    conn.execute("ALTER PUBLICATION pub DROP TABLE t2")
    sync = Sync(srv, out)
    sync.wait_for("table_unpublished")
    assert sync.stop() == 0, sync.log()
    conn.execute("UPDATE t2 SET v = 'out' WHERE id <= 20")
    conn.execute("DELETE FROM t2 WHERE id > 40")
    conn.execute("ALTER PUBLICATION pub ADD TABLE t2")
    sync = Sync(srv, out)
    again = sync.wait_for("table_added")
    assert "published again" in again["message"], sync.log()
    sync.wait_for("table_added_done")
    _converge_t2(conn, out, sync)
    assert (
        not (out / "_unpublished.json").exists()
        or json.loads((out / "_unpublished.json").read_text()) == {}
    )

    # the slot dropped under the running sync (its walsender ended first): exit 2, saying the
    # tables need a new snapshot
    _drop_slot(conn, "s", terminate=True)
    assert sync.proc.wait(60) == 2, sync.log()
    sync.reader.join(10)
    lost = sync.named("slot_lost")
    assert lost and "new snapshot" in lost[0]["message"], sync.log()
    assert _table_rows(out) == _server_rows(conn)  # the tables are left as they were

    # and a rerun says so at once, before Spark starts
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", "sync", "--dsn", srv.conninfo(), "--publication", "pub",
         "--slot", "s", "--out", str(out), "--log-format", "text"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "slot s does not exist" in done.stderr and "new snapshot" in done.stderr


def _scrape_checks(sync: Sync, conn) -> None:
    """--metrics: one endpoint with the capture child's metrics and sync's own."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from pgcdc.lsn import parse_lsn

    address = sync.wait_for("metrics")["address"]
    wal = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    seen = {}

    def settled():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
            seen["text"] = r.read().decode()
        seen["got"] = got = {
            (s.name, s.labels.get("component")): s.value
            for f in text_string_to_metric_families(seen["text"])
            for s in f.samples
        }
        # the child updates its metrics once per batch it reads: its durable position may
        # trail its state.json (which sync reads) by one batch
        return min(got.get(("pgcdc_applied_lsn", "sync"), 0),
                   got.get(("pgcdc_durable_lsn", "capture"), 0)) >= wal  # fmt: skip

    with contextlib.suppress(WaitTimeout):  # the asserts below say what is missing
        until(f"metrics settled at {wal}", settled, CONVERGE_TIMEOUT, 0.1)
    got, text = seen["got"], seen["text"]
    assert got[("pgcdc_applied_lsn", "sync")] >= wal, text
    assert got[("pgcdc_apply_cycles_total", "sync")] >= 1, text
    assert got[("pgcdc_applied_events_total", "sync")] >= 200, text
    assert got[("pgcdc_capture_up", "sync")] == 1, text
    assert ("pgcdc_table_bytes_rewritten_total", "sync") in got, text
    assert got[("pgcdc_messages_received_total", "capture")] > 0, text
    assert got[("pgcdc_durable_lsn", "capture")] >= wal, text


def test_existing_slot_new_directory(server, tmp_path):
    srv, conn = server
    conn.execute("SELECT pg_create_logical_replication_slot('other', 'pgoutput')")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pgcdc", "sync", "--dsn", srv.conninfo(), "--publication",
             "pub", "--slot", "other", "--out", str(tmp_path / "new"), "--log-format", "text"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        conn.execute("SELECT pg_drop_replication_slot('other')")
    assert done.returncode == 2, done.stderr
    assert "slot 'other' exists" in done.stderr
    assert "pg_drop_replication_slot('other')" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_slot_is_confirmed_only_as_far_as_the_tables_hold(server, tmp_path):
    """A transaction durable in the capture but not yet in the tables (a 15 s trigger; the
    capture tells the server every 3.75 s) is not confirmed: the slot's confirmed_flush_lsn
    passes it only once the cycle that applies it committed."""
    from pgcdc.capture.segments import read_state
    from pgcdc.lsn import parse_lsn

    srv, conn = server
    out = tmp_path / "confirm"
    sync = Sync(srv, out, "--trigger", "15s", slot="c")
    try:
        sync.wait_for("ready")
        cycles = len(sync.named("apply"))
        conn.execute("INSERT INTO t SELECT g, 'c' FROM generate_series(500000, 500099) g")
        after = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        held = [False]  # seen durable in the capture, not in the tables, and not confirmed

        def confirmed_past():
            row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                               "WHERE slot_name = 'c'").fetchone()  # fmt: skip
            confirmed = parse_lsn(row[0])
            durable = (read_state(out / "_capture") or SimpleNamespace(lsn=0)).lsn
            ids = {i for i, _v in _table_rows(out) or [] if i >= 500000}
            if confirmed >= after:
                assert len(ids) == 100, f"confirmed past rows the tables miss\n{sync.log()}"
                return True
            held[0] |= durable >= after and not ids
            return False

        until(f"slot c confirmed past {after}", confirmed_past, 45, 0.1)
        assert held[0], "the capture never held the rows durable before the tables had them"
        assert len(sync.named("apply")) > cycles
        assert (out / "_applied.lsn").read_text().strip()
        assert sync.stop() == 0, sync.log()
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        _drop_slot(conn, "c", terminate=True)


def test_a_caught_up_sync_moves_the_slot_restart_past_a_burst(server, tmp_path):
    """After a burst, the slot's restart_lsn passes it while sync runs (a running-transactions
    record logged once caught up): without one after the burst's end (the server logs its own
    only every 15 s of activity, here one at the burst's start, as a slot created there
    does), a sync stopped then had its next walsender decode the whole burst again."""
    from pgcdc.lsn import parse_lsn

    srv, conn = server
    out = tmp_path / "restart"
    sync = Sync(srv, out, slot="rp")
    try:
        sync.wait_for("ready")
        # the server's own record first (the bgwriter logs one on the first WAL 15 s after
        # its last, then none for 15 s), then the one a slot's creation logs
        conn.execute("INSERT INTO t VALUES (799999, 'r')")
        time.sleep(1)
        conn.execute("SELECT pg_create_logical_replication_slot('rp_other', 'pgoutput')")
        for i in range(800_000, 830_000, 1000):
            conn.execute("INSERT INTO t SELECT g, 'r' FROM generate_series(%s::int, %s::int) g",
                         [i, i + 999])  # fmt: skip
        end = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])

        def past_end():
            (restart,) = conn.execute("SELECT restart_lsn::text FROM pg_replication_slots "
                                      "WHERE slot_name = 'rp'").fetchone()  # fmt: skip
            return parse_lsn(restart) >= end

        # a second or two; the server's own: 13 s at least
        until(f"restart_lsn past {end}\n{sync.log()}", past_end, 8)
        assert sync.stop() == 0, sync.log()
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        _drop_slot(conn, "rp", terminate=True)
        _drop_slot(conn, "rp_other")


def test_a_caught_up_cycle_logs_a_restart_point_when_the_slot_trails(server, tmp_path):
    """Upkeep.restart_point logs a running-transactions record (the server's WAL, read with
    pg_walinspect) when the slot's restart_lsn trails the WAL by RESTART_LAG or more, none
    when it does not, looks again once after one, and gives up for good, with one line, when
    the role may not."""
    import io

    from pgcdc.capture.runner import Log
    from pgcdc.sync import SyncConfig, pipeline

    srv, conn = server
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    conn.execute("SELECT pg_create_logical_replication_slot('rp2', 'pgoutput')")

    def running_xacts_logged_by(call) -> int:
        (start,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        call()
        conn.execute("SELECT pg_logical_emit_message(true, 'rp', 'after')")  # a record to end on
        (n,) = conn.execute("SELECT count(*) FROM pg_get_wal_records_info(%s, pg_current_wal_flush_lsn())"
                            " WHERE record_type = 'RUNNING_XACTS'", [start]).fetchone()  # fmt: skip
        return n

    def sync_as(dsn: str):
        config = SyncConfig(out=str(tmp_path / "rp2"), publication="pub", stop_timeout=30.0,
                            retain=0, keep_segments=False, dsn=dsn, slot="rp2")  # fmt: skip
        return pipeline.Sync(config, log=Log("json", stream=io.StringIO()))

    try:
        sync = sync_as(srv.conninfo())
        assert running_xacts_logged_by(sync.upkeep.restart_point) == 0  # restart_lsn is current
        conn.execute(
            "INSERT INTO t SELECT g, repeat('p', 100) FROM generate_series(900000, 915000) g"
        )
        assert running_xacts_logged_by(sync.upkeep.restart_point) == 1  # 2 MB behind
        assert sync.upkeep.next_restart_check < float("inf")  # an idle cycle looks again, once:
        again = lambda: sync.upkeep.restart_point(again=True)  # noqa: E731 (nothing confirms rp2)
        assert running_xacts_logged_by(again) == 1
        assert sync.upkeep.next_restart_check == float("inf")
        conn.execute("CREATE ROLE rp_plain LOGIN")  # may read the slots, may not log one
        plain = sync_as(srv.conninfo(user="rp_plain"))
        assert running_xacts_logged_by(plain.upkeep.restart_point) == 0
        assert not plain.upkeep.restart_points
        assert '"event": "restart_points"' in plain.log.stream.getvalue()
    finally:
        _drop_slot(conn, "rp2")


def test_applied_segments_are_pruned_every_minute_of_cycles(tmp_path, monkeypatch):
    """Cycles a second apart still prune when PRUNE_EVERY has passed since the last prune (no
    server: the loop's upkeep alone, its interval shortened)."""
    from pgcdc.sync import SyncConfig, pipeline, upkeep

    monkeypatch.setattr(upkeep, "PRUNE_EVERY", 0.3)
    config = SyncConfig(out=str(tmp_path), publication="pub", slot="s", stop_timeout=30.0,
                        retain=0, keep_segments=False)  # fmt: skip
    sync = pipeline.Sync(config, log=None)
    pruned = []
    monkeypatch.setattr(sync.upkeep, "prune", lambda: pruned.append(time.monotonic()))
    sync.upkeep.next_prune = time.monotonic() + 0.3
    start = time.monotonic()
    while time.monotonic() - start < 1.2:  # cycles every 0.05 s
        sync.upkeep.maintain({})
        time.sleep(0.05)
    assert 2 <= len(pruned) <= 5, pruned  # at 0.3, 0.6, 0.9 and 1.2 s


def test_a_rerun_prunes_once_it_has_caught_up(tmp_path, monkeypatch):
    """A rerun prunes when it has applied its backlog (as it starts Spark), not a minute
    later: a sync restarted more often than that would never delete a segment."""
    from pgcdc.spark.later import SessionLater
    from pgcdc.sync import SyncConfig, pipeline, upkeep

    config = SyncConfig(out=str(tmp_path), publication="pub", slot="s", stop_timeout=30.0,
                        retain=0, keep_segments=False)  # fmt: skip
    sync = pipeline.Sync(config, log=None)
    pruned = []
    monkeypatch.setattr(sync.upkeep, "prune", lambda: pruned.append(time.monotonic()))
    monkeypatch.setattr(sync.upkeep, "check_disk", lambda: None)
    sync.spark = SessionLater(lambda: "a session", deferred=True)
    start = time.monotonic()
    sync.cycle.samples.append((time.time(), 2000))  # the server's WAL when sync started
    sync.cycle.last_covered = 1000  # the backlog not applied yet: nothing starts, nothing pruned
    sync.start_spark_when_caught_up(start)
    sync.upkeep.maintain({})
    assert not sync.spark.begun and not pruned
    sync.cycle.last_covered = 2000  # caught up
    sync.start_spark_when_caught_up(start)
    sync.upkeep.maintain({})
    assert sync.spark.begun and len(pruned) == 1
    sync.upkeep.maintain({})  # then every PRUNE_EVERY
    assert len(pruned) == 1 and sync.upkeep.next_prune > time.monotonic() + upkeep.PRUNE_EVERY - 5


def test_a_rerun_starts_its_first_cycle_on_the_captures_first_commit(tmp_path):
    """Before a rerun's first cycle, anything durable past where the tables are starts it;
    after it, and in a sync that started fresh, a steady flow's small transactions wait for
    EAGER_WAL or the trigger (a burst's cycles go on as before)."""
    from pgcdc.capture.segments import SegmentWriter
    from pgcdc.sync import SyncConfig, pipeline
    from pgcdc.sync.pace import EAGER_WAL

    config = SyncConfig(out=str(tmp_path), publication="pub", slot="s", stop_timeout=30.0,
                        retain=0, keep_segments=False)  # fmt: skip
    sync = pipeline.Sync(config, log=None)
    sync.capture_dir.mkdir()
    w = SegmentWriter(sync.capture_dir, fsync=False)
    w.start(0x1000)
    cycle = sync.cycle
    cycle.last_covered = 0x1000
    w.commit_position(0x2000)  # the capture's first commit: a little
    assert not cycle.durable_ahead()  # a fresh sync: the trigger's
    sync.rerun = True
    assert cycle.durable_ahead()  # a rerun's first cycle: at once
    cycle.count = 1  # it ran
    cycle.last_covered = 0x2000
    w.commit_position(0x3000)
    assert not cycle.durable_ahead()  # a little more: the trigger's
    cycle.burst = True
    assert cycle.durable_ahead()
    cycle.burst = False
    w.commit_position(0x2000 + EAGER_WAL)
    assert cycle.durable_ahead()


def test_invalidated_slot(server, tmp_path):
    """A directory whose slot the server invalidated while sync was down: exit 2 before Spark
    starts, one line with the reason, the setting to raise and what to do."""
    from pgcdc.cli import capture

    srv, conn = server
    out = tmp_path / "inv"
    conn.execute("SELECT pg_create_logical_replication_slot('inv', 'pgoutput')")
    try:
        code = capture.main(["--dsn", srv.conninfo(), "--slot", "inv", "--publication", "pub",
                             "--out", str(out / "_capture"), "--idle-exit", "1", "--no-fsync",
                             "--log-format", "json"])  # fmt: skip
        assert code == 0
        _invalidate(conn, "inv")
        done = subprocess.run(
            [sys.executable, "-m", "pgcdc", "sync", "--dsn", srv.conninfo(), "--publication",
             "pub", "--slot", "inv", "--out", str(out), "--log-format", "text"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        conn.execute("SELECT pg_drop_replication_slot('inv')")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "invalidated" in line and "wal_removed" in line and "max_slot_wal_keep_size" in line
    assert "new snapshot" in line, line


def test_a_burst_is_applied_without_waiting_for_the_trigger(server, tmp_path):
    """A burst of changes (10 MB of WAL) is applied as soon as the capture has made 4 MiB of
    it durable, then cycle after cycle until its tail, not a whole --trigger later: with
    --trigger 600s the table converges within a minute. (Small transactions still wait for
    the trigger: test_the_slot_is_confirmed_only_as_far_as_the_tables_hold.)"""
    srv, conn = server
    out = tmp_path / "burst"
    sync = Sync(srv, out, "--trigger", "600s", slot="burst")
    try:
        sync.wait_for("ready")
        for lo in range(700_000, 740_000, 1000):
            conn.execute("INSERT INTO t SELECT g, repeat('x', 200) || g "
                         "FROM generate_series(%s::int, %s::int) g", [lo, lo + 999])  # fmt: skip
        _converge(conn, out, sync)
        assert sync.stop() == 0, sync.log()
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        _drop_slot(conn, "burst", terminate=True)


def test_only_loaded_snapshots_lose_their_rows(tmp_path):
    """drop_loaded_snapshots (no server: the directory's files alone): the initial snapshot's
    table directories go once every table of it is loaded, an added table's once ``_loaded``
    says so; a snapshot not loaded yet, and every ``_snapshot.json``, stay."""
    from pgcdc.sync import SyncConfig, pipeline

    config = SyncConfig(out=str(tmp_path), publication="pub", slot="s", stop_timeout=30.0,
                        retain=0, keep_segments=False)  # fmt: skip
    sync = pipeline.Sync(config, log=None)
    events = []
    sync.log = SimpleNamespace(event=lambda *a, **k: events.append((a, k)))

    def snapshot(d: Path, tables: dict, loaded: bool) -> None:
        for name in tables:
            (d / name).mkdir(parents=True)
            (d / name / "part-0.parquet").write_bytes(b"x" * 10)
        (d / "_snapshot.json").write_text(json.dumps({"tables": tables}))
        if loaded:
            (d / "_loaded").write_text("")

    snapshot(tmp_path / "_snapshot", {"public.a": 1, "public.b": 1}, False)
    snapshot(tmp_path / "_snapshot_added" / "0000000001000000", {"public.c": 1}, True)
    snapshot(tmp_path / "_snapshot_added" / "0000000002000000", {"public.d": 1}, False)
    state = {"format": "pgcdc-apply-state", "tables": {"public.a": {}}}
    (tmp_path / "_pgcdc_state.json").write_text(json.dumps(state))
    sync.upkeep.drop_loaded_snapshots()  # public.b not loaded: the initial snapshot stays
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet"))
    assert left == ["_snapshot/public.a/part-0.parquet", "_snapshot/public.b/part-0.parquet",
                    "_snapshot_added/0000000002000000/public.d/part-0.parquet"]  # fmt: skip
    assert events[-1][1]["tables"] == ["public.c"] and events[-1][1]["bytes"] == 10

    state["tables"]["public.b"] = {}
    (tmp_path / "_pgcdc_state.json").write_text(json.dumps(state))
    sync.upkeep.drop_loaded_snapshots()
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.parquet"))
    assert left == ["_snapshot_added/0000000002000000/public.d/part-0.parquet"]
    assert len(list(tmp_path.rglob("_snapshot.json"))) == 3
