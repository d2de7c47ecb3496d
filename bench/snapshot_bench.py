"""Initial snapshot and streaming source throughput (``make bench``; needs PostgreSQL and Spark).

Snapshot: one table of ``rows`` rows (bigint key, numeric(12,2), text, timestamptz, float8)
on PostgreSQL 18, read by ``take_snapshot`` (Spark local[2], block ranges, typed Parquet).
Peers in the same run: the same SELECT through one ``COPY ... TO STDOUT`` into nothing (the
server's and the wire's floor), and psycopg fetching typed rows in one process.

Streaming: ``events`` inserts in transactions of 1,000 rows, read by the ``pgcdc`` streaming
source (Trigger.AvailableNow, local[2], a Parquet sink with a checkpoint). Peer: the same slot
peeked and turned into events in one process (``EventReader``), without Spark.

Rates include everything each path does (Spark job planning included); the machine is shared,
so compare rows within one run.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

ROWS = 500_000
EVENTS = 200_000
PUB, SLOT, STREAM_SLOT, PEER_SLOT = "bench_pub", "bench_snap", "bench_stream", "bench_peer"

TABLE = (
    "CREATE TABLE bench_t (id int8 PRIMARY KEY, n numeric(12,2), s text, ts timestamptz, f float8)"
)
FILL = (
    "INSERT INTO bench_t SELECT g, g * 0.01, 'row ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 second', g / 7.0 FROM generate_series({lo}, {hi}) g"
)


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def run(rows: int = ROWS, events: int = EVENTS) -> dict:
    from pgcdc.runtime.spark import local_spark_session
    from pgcdc.spark.snapshot import take_snapshot
    from tests.postgres.servers import running_server

    results: dict[str, tuple[int, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="pgcdc-snapbench-"))
    spark = local_spark_session("pgcdc snapshot bench", cores=2)
    try:
        with running_server("pg18") as srv, srv.connect() as conn:
            conn.execute(TABLE)
            conn.execute(f"CREATE PUBLICATION {PUB} FOR TABLE bench_t")
            conn.execute(FILL.format(lo=1, hi=rows))
            conn.execute("VACUUM ANALYZE bench_t")
            dsn = srv.conninfo()

            t0 = time.perf_counter()
            res = take_snapshot(spark, dsn, SLOT, [PUB], tmp / "snap", blocks_per_range=512)
            results["snapshot: take_snapshot (Spark local[2], typed Parquet)"] = (
                res.rows,
                time.perf_counter() - t0,
            )
            assert res.rows == rows, res.tables

            t0 = time.perf_counter()
            n = 0
            with conn.cursor() as cur, cur.copy("COPY (SELECT * FROM bench_t) TO STDOUT") as cp:
                for chunk in cp:
                    n += bytes(chunk).count(b"\n")
            results["snapshot peer: one COPY TO STDOUT, bytes only"] = (
                n,
                time.perf_counter() - t0,
            )

            t0 = time.perf_counter()
            with conn.transaction(), conn.cursor(name="bench") as cur:
                cur.itersize = 10_000
                cur.execute("SELECT * FROM bench_t")
                n = sum(1 for _ in cur)
            results["snapshot peer: psycopg typed rows, one process"] = (
                n,
                time.perf_counter() - t0,
            )

            for slot in (STREAM_SLOT, PEER_SLOT):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            base = rows + 1
            for lo in range(base, base + events, 1000):
                conn.execute(FILL.format(lo=lo, hi=min(lo + 999, base + events - 1)))

            results["stream: format('pgcdc') into Parquet (AvailableNow)"] = _stream(
                spark, dsn, tmp
            )
            results["stream peer: peek + EventReader, one process"] = _peer(conn, srv.major)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(results)
    return results


def _stream(spark, dsn: str, tmp: Path) -> tuple[int, float]:
    from pgcdc.spark.source import PgcdcDataSource

    spark.dataSource.register(PgcdcDataSource)
    t0 = time.perf_counter()
    query = (
        spark.readStream.format("pgcdc")
        .option("dsn", dsn)
        .option("slot", STREAM_SLOT)
        .option("publication", PUB)
        .load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp / "chk"))
        .trigger(availableNow=True)
        .start(str(tmp / "events"))
    )
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    return spark.read.parquet(str(tmp / "events")).count(), seconds


def _peer(conn, major: int) -> tuple[int, float]:
    from pgcdc.events import EventReader
    from pgoutput_codec import capture

    pv = 4 if major >= 16 else 3
    t0 = time.perf_counter()
    with conn.transaction(), conn.cursor(name="peer") as cur:
        cur.itersize = 10_000
        cur.execute(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_binary_changes"
            "(%s, NULL, NULL, 'proto_version', %s, 'publication_names', %s)",
            [PEER_SLOT, str(pv), PUB],
        )
        records = capture.from_payloads(((lsn, bytes(d)) for lsn, d in cur), pv)
        n = sum(1 for _ in EventReader().read(records))
    return n, time.perf_counter() - t0


def print_table(results: dict) -> None:
    print("\n## Initial snapshot and streaming source (PostgreSQL 18, Spark local[2])\n")
    print("| path | rows/events | seconds | per second |")
    print("|---|---:|---:|---:|")
    for name, (n, s) in results.items():
        print(f"| {name} | {n:,} | {s:.1f} | {_rate(n, s)} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.snapshot_bench")
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--events", type=int, default=EVENTS)
    args = p.parse_args(argv)
    run(args.rows, args.events)


if __name__ == "__main__":
    main()
