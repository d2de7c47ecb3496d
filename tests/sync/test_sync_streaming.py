"""``pgcdc sync --engine streaming``: the live path as a Structured Streaming query over the
capture (``format("pgcdc_capture")``), each micro-batch a cycle bounded by its end offset.

Checked against a real PostgreSQL 18: from empty (snapshot, then writes), a SIGKILL while
writes go on, writes while it is down, a rerun: the Delta table equals the server's table
after each step, the query's checkpoint has committed batches, and SIGTERM exits 0. The
source alone is checked against the server too: the ids of the inserts a capture holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from pgcdc.lsn import parse_lsn
from tests.support.sync import (
    Sync,
    _converge,
    _killed_under_writes,
    _server_rows,
    _table_rows,
    _writes,
)  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def _committed(checkpoint) -> list[int]:
    d = checkpoint / "commits"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def test_the_streaming_engine_applies_each_batch_once_across_a_kill(server, tmp_path):  # noqa: F811
    srv, conn = server
    out = tmp_path / "sync"
    sync = Sync(srv, out, "--engine", "streaming")
    ready = sync.wait_for("ready")
    assert "Structured Streaming" in ready["message"], sync.log()
    checkpoint = out / "_checkpoint"
    # ready once the query's first batch is done (0.6-0.8 s of Spark's): a burst right after
    # it is applied by the batches it paces, not all at once after that first batch
    assert _committed(checkpoint) == [0], sync.log()
    assert sync.named("snapshot_done")[0]["tables"] == {"public.t": 2000}
    _writes(conn, 10_000, 300)
    _converge(conn, out, sync)
    # a batch's apply line and its checkpoint commit follow its Delta commit, which the
    # table converged on: wait for both (not applied twice: the sum stops at want)
    want = 300 + len(range(7, 2001, 7)) + len(range(11, 2001, 11))
    until(f"a checkpoint commit and {want} events applied\n{sync.log()}",
          lambda: _committed(checkpoint)[-1] != 0
          and sum(a["events"] for a in sync.named("apply")) >= want, 30)  # fmt: skip
    time.sleep(1)  # a batch applying any of them again would say so within its trigger
    assert sum(a["events"] for a in sync.named("apply")) == want, sync.log()

    _killed_under_writes(srv, sync, 5)
    before = _committed(checkpoint)
    _writes(conn, 90_000, 200)
    sync = Sync(srv, out, "--engine", "streaming")
    sync.wait_for("ready")
    assert not sync.named("snapshot"), sync.log()
    _converge(conn, out, sync)
    conn.execute("INSERT INTO t VALUES (99999, 'last')")
    _converge(conn, out, sync)
    assert _committed(checkpoint)[-1] > before[-1], sync.log()  # the query went on from there
    assert sync.stop() == 0, sync.log()
    assert sync.named("stopped"), sync.log()
    assert _table_rows(out) == _server_rows(conn)

    # pgcdc status shows the query's last committed batch and where it applied to
    done = subprocess.run([sys.executable, "-m", "pgcdc", "status", str(out), "--json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    query = json.loads(done.stdout)["query"]
    assert query["batch"] == _committed(checkpoint)[-1]
    durable = json.loads(done.stdout)["capture"]["durable_lsn"]
    assert 0 < parse_lsn(query["end_lsn"]) <= parse_lsn(durable)


def test_ctrl_c_on_a_terminal_stops_the_query_quietly(server, tmp_path):  # noqa: F811
    """A terminal's Ctrl-C is SIGINT to every process of its foreground group: sync's, the
    JVM's, and the fork server's that runs the query's Python processes. sync stops after the
    running batch and exits 0; nothing else says a word (the fork server died of it with a
    KeyboardInterrupt traceback, and took the query's processes with it)."""
    import signal

    srv, conn = server
    out = tmp_path / "ctrl_c"
    sync = Sync(srv, out, slot="ctrl_c", group=True)  # the default engine: the query
    sync.wait_for("ready")
    conn.execute("INSERT INTO t VALUES (123456, 'ctrl-c')")
    _converge(conn, out, sync)
    assert sync.stop(signal.SIGINT) == 0, sync.log()
    assert sync.named("stopped"), sync.log()
    said = "".join(sync.other)
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    conn.execute("SELECT pg_drop_replication_slot('ctrl_c')")


def test_the_capture_source_reads_what_the_capture_made_durable(server, tmp_path, spark):  # noqa: F811 (fixtures)
    """format("pgcdc_capture") in a query of its own, over the directory a sync captured
    into: the inserted ids it streams are the server's, once each."""
    from pgcdc.capture.segments import read_state
    from pgcdc.streaming.directory import INITIAL, CaptureDataSource, offset_of, read_range

    srv, conn = server
    out = tmp_path / "sync"
    conn.execute("CREATE TABLE c (id int PRIMARY KEY)")
    conn.execute("CREATE PUBLICATION pub_c FOR TABLE c")
    sync = Sync(srv, out, "--keep-segments", slot="sc", publication="pub_c")
    sync.wait_for("ready")

    def applied(n: int) -> None:
        until(f"{n} events applied", lambda: sum(a["events"] for a in sync.named("apply")) >= n, 60)

    conn.execute("INSERT INTO c SELECT generate_series(0, 499)")
    applied(500)
    early = offset_of(read_state(out / "_capture"))  # what was durable then
    for i in range(500, 3000, 500):
        conn.execute("INSERT INTO c SELECT generate_series(%s::int, %s::int)", [i, i + 499])
    conn.execute("DELETE FROM c WHERE id < 100")
    applied(3100)
    assert sync.stop() == 0, sync.log()

    # a range pinned to the earlier position reads what was durable then, not what came since
    batches = list(read_range(out / "_capture", INITIAL, early))
    ids = [
        int(j.split(":")[1].rstrip("}"))
        for b in batches
        for j in b.column("after_json").to_pylist()
    ]
    assert sorted(ids) == list(range(500))
    # the whole capture: its runs rendered from their text equal the rows of their events
    from pgcdc.streaming import json_runs

    end = offset_of(read_state(out / "_capture"))
    real, made = json_runs.run_batch, []

    def rows(run_batch):
        json_runs.run_batch = run_batch
        try:
            return [r for b in read_range(out / "_capture", INITIAL, end) for r in b.to_pylist()]
        finally:
            json_runs.run_batch = real

    def counted(run, schema):
        batch = real(run, schema)
        made.append(0 if batch is None else batch.num_rows)
        return batch

    fast = rows(counted)
    exact = rows(lambda run, schema: None)
    assert sum(made) == 3100 and len(fast) == 3100 and fast == exact, made  # all rendered here

    spark.dataSource.register(CaptureDataSource)
    q = (
        spark.readStream.format("pgcdc_capture").option("path", str(out / "_capture")).load()
        .writeStream.format("memory").queryName("capture_events").trigger(availableNow=True)
        .start()
    )  # fmt: skip
    q.awaitTermination(120)
    rows = spark.sql("SELECT op, after_json, before_json FROM capture_events").collect()
    inserted = sorted(int(r.after_json.split(":")[1].rstrip("}")) for r in rows if r.op == "c")
    deleted = sum(1 for r in rows if r.op == "d")
    assert inserted == list(range(3000))
    assert deleted == 100
    have = {r[0] for r in conn.execute("SELECT id FROM c").fetchall()}
    assert have == set(range(100, 3000))
