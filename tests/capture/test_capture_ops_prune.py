"""``pgcdc prune`` against a real capture and apply (PostgreSQL 18, Spark in local mode): the
segments below both the capture's durable position and the applied position go, the one being
written and the directory's state, catalog and relations stay, and what is left still reads
(``pgcdc changes``) and applies (the relations the pruned segments described come from
relations.jsonl, as one capture session sends each Relation message once)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import pytest

from pgcdc.capture import segments
from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.events.reader import read_captures
from pgcdc.lsn import parse_lsn
from pgcdc.capture.prune import PruneError, applied_position, plan_prune
from tests.support.delta import read_table
from tests.wait import until


def _pgcdc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _wait_durable(srv, out, timeout: float = 30) -> int:
    """Until the capture directory is durable up to the server's WAL position now."""
    with srv.connect() as conn:
        (wal,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()

    def caught_up():
        state = segments.read_state(out)
        return state is not None and state.lsn >= parse_lsn(wal) and state.lsn

    return until(f"the capture durable up to {wal}", caught_up, timeout)


def _batch(conn, first: int, n: int) -> None:
    for i in range(first, first + n, 10):  # transactions of 10 rows: many commits, segments
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                     [i, i + 9])  # fmt: skip
    conn.execute("UPDATE t SET v = 'u' || id WHERE id %% 7 = 0 AND id >= %s", [first])
    conn.execute("DELETE FROM t WHERE id %% 11 = 0 AND id >= %s", [first])


def _events(out) -> list[tuple]:
    return [(e.commit_lsn, e.tx_ordinal, e.op, e.after) for e in read_captures([out])]


def test_prune_keeps_what_reads_and_applies(pg, tmp_path):
    pytest.importorskip("pyspark")
    cap, tables = tmp_path / "cap", tmp_path / "tables"
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")  # a type catalog.jsonl describes
        conn.execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text, m mood DEFAULT 'ok') "
            "WITH (autovacuum_enabled = false)"
        )  # no relcache invalidation
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        config = CaptureConfig(dsn=srv.conninfo(), slot="s", publications=["pub"], out=str(cap),
                               segment_bytes=8192, flush_interval=0.1, status_interval=1.0,
                               fsync=False)  # fmt: skip
        capture = Capture(config, Log("json", stream=io.StringIO()))
        th = threading.Thread(target=capture.run, daemon=True)
        th.start()
        try:
            _batch(conn, 1, 400)
            _wait_durable(srv, cap)
            run = _pgcdc("apply", str(cap), "--out", str(tables), "--master", "local[1]")
            assert run.returncode == 0, run.stderr
            applied = applied_position(tables, cap)
            assert applied is not None
            _batch(conn, 1000, 200)  # the same session: no Relation message for t again
            _wait_durable(srv, cap)
            before = _events(cap)
            names_before = sorted(p.name for p in segments.list_segments(cap))
            # a dry run lists, deletes nothing; the capture keeps running meanwhile
            dry = _pgcdc("prune", str(cap), "--applied-state", str(tables), "--dry-run", "--json")
            assert dry.returncode == 0, dry.stderr
            doc = json.loads(dry.stdout)
            # (a running capture may rotate to a new, empty segment: at a commit after the
            # listing, or an idle position past a full one)
            assert set(names_before) <= {p.name for p in segments.list_segments(cap)}
            assert doc["delete"] and not doc["deleted"]
            run = _pgcdc("prune", str(cap), "--applied-state", str(tables))
            assert run.returncode == 0, run.stderr
            assert f"deleted {len(doc['delete'])} segment(s)" in run.stdout, run.stdout
            _batch(conn, 2000, 30)  # the capture goes on writing after the prune
            _wait_durable(srv, cap)
        finally:
            capture.stop = True
            th.join(30)
        server_rows = sorted(conn.execute("SELECT id, v, m::text FROM t").fetchall())
    # what went: a prefix of the segments, each entirely applied; never the last durable one
    left = sorted(p.name for p in segments.list_segments(cap))
    gone = sorted(set(names_before) - set(left))
    assert gone == doc["delete"] == names_before[: len(gone)]
    state = segments.read_state(cap)
    assert state.segment in left
    for name in ("state.json", "catalog.jsonl", "relations.jsonl"):
        assert (cap / name).is_file(), name
    # what is left reads: the events of the deleted segments were all applied, every other
    # event is still there, in order, and the capture's later ones after it
    after = _events(cap)
    kept = [e for e in before if e in after]
    removed = [e for e in before if e not in after]
    assert removed and all(e[0] <= applied for e in removed)
    # t's Relation message went with the first segment: relations.jsonl stands in (the server
    # may send it again later in the session, after a relcache invalidation)
    relations = (cap / "relations.jsonl").read_text().splitlines()
    assert names_before[0] in gone
    assert any(json.loads(line)["relation"]["name"] == "t" for line in relations)
    assert after[: len(kept)] == kept == before[len(removed) :]
    assert len(after) > len(kept) and max(e[0] for e in after) > applied
    run = _pgcdc("changes", str(cap))
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == len(after)
    # and applies: the table equals the server's
    run = _pgcdc("apply", str(cap), "--out", str(tables), "--master", "local[1]")
    assert run.returncode == 0, run.stderr
    rows = read_table(tables / "public.t").to_pylist()
    assert sorted((r["id"], r["v"], r["m"]) for r in rows) == server_rows
    # nothing more to prune than the segments applied since; the last one stays
    plan = plan_prune(cap, applied_position(tables, cap))
    assert state.segment not in [s.path.name for s in plan.delete]


def test_prune_refuses_what_it_cannot_know(tmp_path):
    cap = tmp_path / "cap"
    cap.mkdir()
    run = _pgcdc("prune", str(cap), "--applied-state", str(tmp_path / "nothing"))
    assert run.returncode == 2 and "not found" in run.stderr, run.stderr
    run = _pgcdc("prune", str(cap), "--applied-lsn", "0/ZZ")
    assert run.returncode == 2, run.stderr
    run = _pgcdc("prune", str(cap), "--applied-lsn", "0/100")  # nothing durable: nothing goes
    assert run.returncode == 0 and "deleted 0 segment(s)" in run.stdout, run.stdout
    # another source's applied state
    segments._write_state(cap, segments.State(16, segments.segment_name(1, 0), 4, "s", {},
                                              {"system_id": "1", "database": "d", "slot": "s"}))  # fmt: skip
    (cap / segments.segment_name(1, 0)).write_bytes(segments.FILE_HEADER)
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "_pgcdc_state.json").write_text(
        json.dumps(
            {"applied_lsn": "0/100", "source": {"system_id": "2", "database": "d", "slot": "s"}}
        )  # fmt: skip
    )
    with pytest.raises(PruneError, match="another source"):
        applied_position(tables, cap)


def test_prune_keeps_a_prepared_transaction_until_it_is_committed(pg, tmp_path):
    """Two-phase: the segment of a PREPARE stays while its COMMIT PREPARED is past the applied
    position, even when later transactions are applied; it goes once the commit is applied."""
    from pgcdc.capture.prune import prune, scan_segment

    cap = tmp_path / "cap"
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s2', 'pgoutput', false, true)")
        config = CaptureConfig(dsn=srv.conninfo(), slot="s2", publications=["pub"], out=str(cap),
                               two_phase=True, segment_bytes=1, flush_interval=0.05,
                               fsync=False)  # fmt: skip
        capture = Capture(config, Log("json", stream=io.StringIO()))
        th = threading.Thread(target=capture.run, daemon=True)
        th.start()
        try:  # one session: each step's commit ends a segment (--segment-bytes 1)
            for step in (
                ["INSERT INTO t VALUES (1)"],
                ["BEGIN", "INSERT INTO t VALUES (2)", "PREPARE TRANSACTION 'g1'"],
                ["INSERT INTO t VALUES (3)"],
                ["COMMIT PREPARED 'g1'"],
                ["INSERT INTO t VALUES (4)"],
                ["INSERT INTO t VALUES (5)"],
            ):
                for sql in step:
                    conn.execute(sql)
                _wait_durable(srv, cap)
        finally:
            capture.stop = True
            th.join(30)
    commit_of = {e.after[0]: e.commit_lsn for e in read_captures([cap]) if e.op == "c"}
    durable = segments.read_state(cap).segment  # (a rotation may have opened one after it)
    scanned = [scan_segment(p) for p in segments.list_segments(cap) if p.name <= durable]
    holds_prepare = [s.path.name for s in scanned if "g1" in s.prepared]
    assert len(holds_prepare) == 1 and len(scanned) >= 6  # a segment per step
    # applied up to id 3 (after the PREPARE, before its COMMIT PREPARED): the prepare stays
    plan = prune(cap, commit_of[3])
    gone = [s.path.name for s in plan.delete]
    assert gone and holds_prepare[0] not in gone and "prepared transaction" in plan.stopped_at
    assert all(s.last_commit_lsn is None or s.last_commit_lsn <= commit_of[3] for s in plan.delete)
    assert sorted(e.after[0] for e in read_captures([cap]) if e.op == "c") == [2, 3, 4, 5]
    # applied up to the COMMIT PREPARED: it goes, and the transactions after it stay
    plan = prune(cap, commit_of[2])
    assert holds_prepare[0] in [s.path.name for s in plan.delete]
    assert sorted(e.after[0] for e in read_captures([cap]) if e.op == "c") == [4, 5]
    # everything applied: all but the last durable segment
    prune(cap, commit_of[5])
    last = segments.read_state(cap).segment  # (and the empty one a rotation opened after it)
    assert [p.name for p in segments.list_segments(cap) if p.name <= last] == [last]
    assert sorted(e.after[0] for e in read_captures([cap]) if e.op == "c") == [5]
