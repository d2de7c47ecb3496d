"""``pgcdc capture`` vs a plain psycopg2 ``LogicalReplicationConnection`` loop: same server, same
workload, same run: messages/s (wall clock) and CPU time per message of the client process.
``pgcdc capture`` reads this backlog with one peek before it streams (``--catch-up-bytes``,
:mod:`pgcdc.capture.catchup`); "capture, no peek" is the same with the walsender alone.

A local PostgreSQL 18 (the test harness, with production settings for decoding: buffered
streaming and the default 64MB logical_decoding_work_mem) gets WORKLOAD_ROWS inserts in
1,000-row transactions. Each client then reads its own slot (all created before the workload,
with the same pgoutput options) from the start to the last commit, as a separate process; CPU
is that process's user + system time, start-up included. The rounds alternate which client
goes first. The psycopg2 loop writes payloads to a file and counts its own messages; pgcdc
capture writes fsynced segments with durable acknowledgements.

Run: ``python -m bench.capture_bench [rows] [rounds]`` (``make bench`` runs it too).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD_ROWS = 300_000
ROUNDS = 3
ROOT = Path(__file__).resolve().parent.parent

PSYCOPG2_LOOP = r"""
import sys, psycopg2, psycopg2.extras
dsn, slot, out, end_lsn = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
cur = conn.cursor()
cur.start_replication(slot_name=slot, decode=False, start_lsn=0,
                      options={"proto_version": "4", "publication_names": "pub"})
f = open(out, "wb")
count = 0
class Done(Exception): pass
def consume(msg):
    global count
    f.write(msg.payload)
    count += 1
    if msg.data_start >= end_lsn:
        raise Done
try:
    cur.consume_stream(consume)
except Done:
    pass
f.close()
print(count)
"""


def _client(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child, its stdout) for one client run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, check=True, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def run(rows: int = WORKLOAD_ROWS, rounds: int = ROUNDS) -> dict:
    sys.path.insert(0, str(ROOT))
    from pgcdc.capture.files import iter_records
    from tests.postgres import servers

    runs: dict[str, list[tuple[int, float, float]]] = {
        "pgcdc capture": [], "capture, no peek": [], "psycopg2 loop": []
    }  # fmt: skip
    with servers.running_server("pg18", servers.PRODUCTION_DECODING) as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE bulk (id int, pad text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE bulk")
        for r in range(rounds):
            for slot in (f"pgcdc{r}", f"walsender{r}", f"psycopg2_{r}"):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        for i in range(0, rows, 1000):
            conn.execute(
                "INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g",
                [i, i + 999],
            )
        (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()  # the last commit
        hi, lo = end.split("/")
        end_lsn = (int(hi, 16) << 32) | int(lo, 16)
        tmp = Path(tempfile.mkdtemp(prefix="capture-bench-"))
        try:
            for r in range(rounds):

                def pgcdc(r=r, name="pgcdc capture", slot=f"pgcdc{r}", extra=()):
                    out = tmp / f"segments{r}"
                    wall, cpu, _ = _client(
                        [sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(),
                         "--slot", slot, "--publication", "pub", "--out", str(out),
                         "--until-lsn", end, *extra],
                    )  # fmt: skip
                    n = sum(1 for _ in iter_records(out))
                    runs[name].append((n, wall, cpu))
                    shutil.rmtree(out)

                def walsender(r=r):  # the backlog sent by the walsender alone
                    pgcdc(r, "capture, no peek", f"walsender{r}", ("--catch-up-bytes", "0"))

                def psycopg2(r=r):
                    wall, cpu, stdout = _client(
                        [sys.executable, "-c", PSYCOPG2_LOOP, srv.conninfo(), f"psycopg2_{r}",
                         str(tmp / "payloads.bin"), str(end_lsn)],
                    )  # fmt: skip
                    runs["psycopg2 loop"].append((int(stdout), wall, cpu))

                clients = (pgcdc, walsender, psycopg2)
                for client in clients if r % 2 == 0 else clients[::-1]:
                    client()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nlive capture, {rows:,} inserts in 1,000-row transactions (PG 18, local), "
        f"{rounds} rounds, order alternating; median of the rounds"
    )
    print(
        f"{'client':<16}{'messages':>10}{'wall s':>9}{'msgs/s':>10}{'CPU s':>8}{'CPU us/msg':>12}"
    )
    med = {}
    for name, rs in runs.items():
        n = statistics.median(x[0] for x in rs)
        wall = statistics.median(x[1] for x in rs)
        cpu = statistics.median(x[2] for x in rs)
        med[name] = (n, wall, cpu)
        print(
            f"{name:<16}{n:>10,.0f}{wall:>9.2f}{n / wall:>10,.0f}{cpu:>8.2f}{cpu / n * 1e6:>12.2f}"
        )
    (n_a, wall_a, cpu_a), (n_b, wall_b, cpu_b) = med["pgcdc capture"], med["psycopg2 loop"]
    print(
        f"speed: pgcdc capture reads {n_a / wall_a / (n_b / wall_b):.2f}x the psycopg2 loop's "
        "messages/s (target >= 1.0x, moonshot 1.5x)"
    )
    print(
        f"CPU: pgcdc capture spends {cpu_a / n_a / (cpu_b / n_b):.2f}x the psycopg2 loop's CPU "
        "time per message (start-up included; lower is better)"
    )
    return med


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run(*map(int, sys.argv[1:3]))
