"""``pgcdc capture`` vs a plain psycopg2 ``LogicalReplicationConnection`` loop, same server, same
workload, same run: messages/s (wall clock) and CPU seconds per message of the client process.

A local PostgreSQL 18 (the test harness) gets a workload of WORKLOAD_ROWS inserts in 1,000-row
transactions; then each client reads its own slot (both created before the workload) from the
start to the end marker. The psycopg2 loop only writes payloads to a file; pgcdc capture writes
fsynced segments with durable acknowledgements. Run: ``python -c "import bench.capture_bench as
b; b.run()"``.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD_ROWS = 300_000
ROOT = Path(__file__).resolve().parent.parent

PSYCOPG2_LOOP = r"""
import sys, time, psycopg2, psycopg2.extras
dsn, slot, out, end_lsn = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
cur = conn.cursor()
cur.start_replication(slot_name=slot, decode=False, start_lsn=0,
                      options={"proto_version": "4", "publication_names": "pub"})
f = open(out, "wb")
class Done(Exception): pass
def consume(msg):
    f.write(msg.payload)
    if msg.data_start >= end_lsn:
        raise Done
try:
    cur.consume_stream(consume)
except Done:
    pass
f.close()
"""


def _client_cpu(argv: list[str], env=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) for one client run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run() -> dict:
    sys.path.insert(0, str(ROOT))
    from pgcdc.capture import segments
    from tests.postgres import servers

    results = {}
    with servers.running_server("pg18") as srv, srv.connect() as conn:
        # production-like decoding: stream only what exceeds logical_decoding_work_mem
        conn.execute("ALTER SYSTEM SET debug_logical_replication_streaming = buffered")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE TABLE bulk (id int, pad text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE bulk")
        for slot in ("pgcdc", "psycopg2"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        for i in range(0, WORKLOAD_ROWS, 1000):
            conn.execute(
                "INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g",
                [i, i + 999],
            )
        (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        conn.execute("SELECT pg_logical_emit_message(false, 'bench', 'end')")
        conn.execute("CREATE TABLE flush_marker ()")  # flushes the WAL of the marker
        hi, lo = end.split("/")
        end_lsn = (int(hi, 16) << 32) | int(lo, 16)
        tmp = Path(tempfile.mkdtemp(prefix="capture-bench-"))
        try:
            out = tmp / "segments"
            wall, cpu = _client_cpu(
                [sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(),
                 "--slot", "pgcdc", "--publication", "pub", "--out", str(out),
                 "--messages", "--until-lsn", end],
            )  # fmt: skip
            n = sum(1 for _ in segments.iter_records(out))
            results["pgcdc capture"] = (n, wall, cpu)
            wall, cpu = _client_cpu(
                [sys.executable, "-c", PSYCOPG2_LOOP, srv.conninfo(), "psycopg2",
                 str(tmp / "payloads.bin"), str(end_lsn)],
            )  # fmt: skip
            results["psycopg2 loop"] = (n, wall, cpu)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nlive capture, {WORKLOAD_ROWS:,} inserts in 1,000-row transactions (PG 18, local)")
    print(f"{'client':<16}{'messages':>10}{'msgs/s':>12}{'CPU us/msg':>12}")
    for name, (n, wall, cpu) in results.items():
        print(f"{name:<16}{n:>10,}{n / wall:>12,.0f}{cpu / n * 1e6:>12.2f}")
    a, b = results["pgcdc capture"], results["psycopg2 loop"]
    print(
        f"pgcdc / psycopg2: {b[1] / a[1]:.2f}x msgs/s, {b[2] / a[2]:.2f}x less CPU per message "
        "(target >= 1.0x msgs/s, moonshot 1.5x)"
    )
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run()
