"""The ``pgcdc`` Structured Streaming source against real PostgreSQL, killed and restarted.

Two slots are created at the same moment: the stream's and a twin nobody consumes. A
workload of small transactions (inserts, updates, key changes, deletes, a REPLICA IDENTITY
FULL table, a truncate) commits in three parts. A streaming query (a separate driver process
in its own session, ``Trigger.AvailableNow``, a few transactions per micro-batch, a Parquet
sink with a checkpoint) is SIGKILLed with its whole process group mid-stream twice (once
while part two is being written), then restarted from the same checkpoint and left to
finish. Checked:

- the sink (read through Spark, which honours the file sink's log) holds each event exactly
  once: no (commit_lsn, tx_ordinal) twice, and the same set, ops and tables as the events
  of the twin slot;
- the sink's events, replayed key by key, give the server's tables (``to_jsonb``);
- the slot was advanced (only for committed batches: it never passed the checkpoint), and
  the last run left it at the end of its last batch, past the last commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest


from pgcdc.lsn import parse_lsn  # noqa: E402
from tests.postgres import servers  # noqa: E402
from tests.postgres.slots import peeked_events  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PUB = "stream_pub"
SLOT, TWIN = "stream_slot", "twin_slot"
KEYS = {"acct": ("id",), "hist": None}  # hist: REPLICA IDENTITY FULL, rows are a bag

SCHEMA = [
    "CREATE TABLE acct (id int PRIMARY KEY, bal numeric(12,2), note text, ts timestamptz)",
    "CREATE TABLE hist (id int, msg text)",
    "ALTER TABLE hist REPLICA IDENTITY FULL",
    f"CREATE PUBLICATION {PUB} FOR TABLE acct, hist",
]


def part(n: int, first: int, count: int) -> list[list[str]]:
    """``count`` transactions of a few statements each, ids from ``first``."""
    txns = []
    for i in range(first, first + count):
        txns.append(
            [
                f"INSERT INTO acct VALUES ({i}, {i}.25, 'n{i}', '2024-01-01'::timestamptz"
                f" + {i} * interval '1 second')",
                f"INSERT INTO hist VALUES ({i % 7}, 'p{n}-{i}')",
                f"UPDATE acct SET bal = bal + 1, note = 'u{i}' WHERE id = {i - 3}",
                f"DELETE FROM hist WHERE id = {i % 7} AND msg LIKE '%-{i - 5}'",
            ]
        )
        if i % 10 == 0:
            txns.append([f"UPDATE acct SET id = id + 100000 WHERE id = {i - 8}"])
        if i % 13 == 0:
            txns.append([f"DELETE FROM acct WHERE id = {i - 6}", "UPDATE hist SET msg = 'h'"])
    if n == 2:
        txns.append(["TRUNCATE hist", "INSERT INTO hist VALUES (0, 'after truncate')"])
    return txns


def run_txns(conn, txns) -> None:
    for stmts in txns:
        with conn.transaction():
            for s in stmts:
                conn.execute(s)


def start_driver(srv, chk: Path, out: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "generated")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.streaming.test_streaming_source_postgres", srv.conninfo(),
         str(chk), str(out)],
        cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM and Python workers too
    )  # fmt: skip


def committed_batches(chk: Path) -> int:
    d = chk / "commits"
    return len([p for p in d.iterdir() if p.name.isdigit()]) if d.exists() else 0


def kill_when(proc, chk: Path, batches: int, log: Path, timeout: float = 240) -> int:
    def committed():
        assert proc.poll() is None, f"the driver ended early:\n{log.read_text()[-3000:]}"
        return committed_batches(chk) >= batches

    try:
        until(f"{batches} committed batches", committed, timeout)
    except WaitTimeout as e:
        raise AssertionError(f"{e}: no progress:\n{log.read_text()[-3000:]}") from None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    return committed_batches(chk)


def canonical(v) -> str:
    return json.dumps(v, sort_keys=True, default=str, ensure_ascii=False)


def server_state(conn) -> dict:
    out = {}
    for t in KEYS:
        rows = conn.execute(f"SELECT to_jsonb(t)::text FROM {t} t").fetchall()
        out[t] = sorted(canonical(json.loads(r[0], parse_float=Decimal)) for r in rows)
    return out


def replay(rows) -> dict:
    """The sink's events in (commit_lsn, tx_ordinal) order, applied by key."""
    state = {t: {} for t in KEYS}

    def key(t, row):
        return canonical({c: row[c] for c in KEYS[t]}) if KEYS[t] else canonical(row)

    for r in sorted(rows, key=lambda r: (r["commit_lsn"], r["tx_ordinal"])):
        st = state[r["table"]]
        before = json.loads(r["before_json"], parse_float=Decimal) if r["before_json"] else None
        after = json.loads(r["after_json"], parse_float=Decimal) if r["after_json"] else None
        if r["op"] == "t":
            st.clear()
            continue
        if r["op"] in ("u", "d"):
            k = key(r["table"], before or after)
            assert st.get(k), f"{r['op']} of a row the replay does not have: {r}"
            st[k].pop()
            if not st[k]:
                del st[k]
        if r["op"] in ("c", "u"):
            st.setdefault(key(r["table"], after), []).append(after)
    return {
        t: sorted(canonical(x) for rows in st.values() for x in rows) for t, st in state.items()
    }


def twin_events(conn, major: int):
    return [e for e in peeked_events(conn, TWIN, PUB, major) if e.op in ("c", "u", "d", "t")]


# every supported major; PGCDC_SPARK_SERVERS=pg18 (say) narrows it, for quicker local runs
@pytest.mark.parametrize("key", servers.keys_from_env("PGCDC_SPARK_SERVERS"))
def test_stream_killed_twice_delivers_every_change_once(pg, key, tmp_path, spark):  # noqa: F811
    chk, out, log = tmp_path / "chk", tmp_path / "out", tmp_path / "driver.log"
    with pg.database(key) as srv, srv.connect() as conn:
        for stmt in SCHEMA:
            conn.execute(stmt)
        for slot in (SLOT, TWIN):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        created = slot_position(conn)
        run_txns(conn, part(1, 10, 120))

        proc = start_driver(srv, chk, out, log)
        first = kill_when(proc, chk, 2, log)

        proc = start_driver(srv, chk, out, log)
        while committed_batches(chk) <= first:  # the restart is under way
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        run_txns(conn, part(2, 1000, 60))  # written while the second run streams
        kill_when(proc, chk, first + 2, log)

        run_txns(conn, part(3, 2000, 40))
        proc = start_driver(srv, chk, out, log)
        assert proc.wait(300) == 0, log.read_text()[-3000:]

        truth = server_state(conn)
        twin = twin_events(conn, srv.major)
        confirmed = slot_position(conn)
        (flushed,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()

    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    order = [(r["commit_lsn"], r["tx_ordinal"]) for r in rows]
    assert len(order) == len(set(order)), "duplicates in the sink"
    want = {(e.commit_lsn, e.tx_ordinal): (e.op, e.relation.table) for e in twin}
    got = {(r["commit_lsn"], r["tx_ordinal"]): (r["op"], r["table"]) for r in rows}
    assert got == want
    assert {"c", "u", "d", "t"} <= {r["op"] for r in rows}
    assert replay(rows) == truth
    # the last run left the slot at its last batch's end, not one batch behind for the next
    # run to commit. A batch may end past the last commit (the flush position when the query
    # asked; autovacuum or a checkpoint writes WAL too), and nothing was skipped on the way:
    # the sink holds every event the untouched twin slot decodes up to now.
    assert confirmed == last_committed_end(chk)
    assert created < max(e.commit_lsn for e in twin) < confirmed <= parse_lsn(flushed)


def last_committed_end(chk: Path) -> int:
    """The end offset of the last batch in the checkpoint's commit log."""
    batch = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
    source_offset = (chk / "offsets" / str(batch)).read_text().splitlines()[-1]
    return parse_lsn(json.loads(source_offset)["lsn"])


def slot_position(conn) -> int:
    (lsn,) = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [SLOT]
    ).fetchone()
    return parse_lsn(lsn)


def _driver(dsn: str, chk: str, out: str) -> None:
    """The streaming query of the test, run in its own process (killed by the test)."""
    from pgcdc.runtime.spark import local_spark_session
    from pgcdc.streaming.slot import PgcdcDataSource

    session = local_spark_session("pgcdc-stream-test")
    session.dataSource.register(PgcdcDataSource)
    events = (
        session.readStream.format("pgcdc")
        .option("dsn", dsn)
        .option("slot", SLOT)
        .option("publication", PUB)
        .option("maxEventsPerTrigger", "150")
        .load()
    )
    query = (
        events.writeStream.format("parquet")
        .option("checkpointLocation", chk)
        .trigger(availableNow=True)
        .start(out)
    )
    query.awaitTermination()
    session.stop()


if __name__ == "__main__":
    _driver(*sys.argv[1:4])
