"""Initial snapshot and streaming source throughput (``make bench``; needs PostgreSQL and Spark).

Snapshot, on two tables of ``rows`` rows each on PostgreSQL 18 (same machine):

- ``bench_t``: bigint key, numeric(12,2), text, timestamptz, float8 (``make bench``'s table);
- ``wide_t``: the 12 columns of issue 27 (int8, numeric, text, timestamptz, float8, bool,
  date, uuid, jsonb, int4[], int4, varchar).

Every path in the same run, on each table:

- ``take_snapshot`` on a warm Spark local[2] session (a first small snapshot warms it): the
  default (binary COPY typed into Arrow by the ADBC driver, each task writing its Parquet
  file), and the text COPY path (``reader="text"``, a Python value per value) as before;
- one ``COPY (SELECT ...) TO STDOUT`` into nothing (bytes only): the server's and the wire's
  floor, and the yardstick (ratio 1.00);
- psycopg fetching typed rows, one process;
- the ADBC PostgreSQL driver, COPY BINARY -> Arrow -> one Parquet file, one connection;
- ConnectorX, 2 partitions on the key -> Arrow (when ``connectorx`` is installed).

MB/s is the size of the COPY text of the rows over each path's time. Rates include
everything each path does (Spark job planning included). The paths run in turns, ``repeat``
rounds (default 2), each path's best round kept: the machine is shared and its load moves,
so compare rows within one run. Peak RSS per task is the largest ``ru_maxrss`` a snapshot task reported.

The streaming source against its one-process peer is ``bench.source_bench`` (``make bench``
runs it next): there in turns, in rounds, with a session's first streaming query on a line
of its own. This bench timed it once, as a session's first streaming query end to end, and
printed that beside the peer as if it were the source's rate.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

ROWS = 2_000_000

TABLE = (
    "CREATE TABLE bench_t (id int8 PRIMARY KEY, n numeric(12,2), s text, ts timestamptz, f float8)"
)
FILL = (
    "INSERT INTO bench_t SELECT g, g * 0.01, 'row ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 second', g / 7.0 FROM generate_series({lo}, {hi}) g"
)
WIDE = (
    "CREATE TABLE wide_t (id int8 PRIMARY KEY, n numeric(12,2), s text, ts timestamptz,"
    " f float8, b bool, d date, u uuid, j jsonb, a int4[], i int4, v varchar(40))"
)
WIDE_FILL = (
    "INSERT INTO wide_t SELECT g, g * 0.01, 'row ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 second', g / 7.0, g % 2 = 0, '2020-01-01'::date + (g % 3000),"
    " md5(g::text)::uuid, jsonb_build_object('k', g, 'tag', 't' || (g % 10)),"
    " ARRAY[g % 100, g % 7, 3]::int4[], (g % 100000)::int4, 'name ' || (g % 1000)"
    " FROM generate_series({lo}, {hi}) g"
)
TABLES = {"bench_t": (TABLE, FILL), "wide_t": (WIDE, WIDE_FILL)}


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def _fill(conn, create: str, fill: str, rows: int) -> None:
    conn.execute(create)
    step = 500_000
    for lo in range(1, rows + 1, step):
        conn.execute(fill.format(lo=lo, hi=min(lo + step - 1, rows)))


def run(rows: int = ROWS, *, text_path: bool = True, repeat: int = 2) -> dict:
    from pgcdc.runtime.spark import local_spark_session
    from tests.postgres.servers import running_server

    results: dict[str, tuple] = {}
    tmp = Path(tempfile.mkdtemp(prefix="pgcdc-snapbench-"))
    spark = local_spark_session("pgcdc snapshot bench", cores=2)
    try:
        with running_server("pg18") as srv, srv.connect() as conn:
            dsn = srv.conninfo()
            _warm(spark, conn, dsn, tmp)
            for name, (create, fill) in TABLES.items():
                _fill(conn, create, fill, rows)
                conn.execute(f"VACUUM ANALYZE {name}")
                results.update(
                    _snapshot_paths(spark, conn, dsn, name, rows, tmp, text_path, repeat)
                )
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(results)
    return results


def _warm(spark, conn, dsn: str, tmp: Path) -> None:
    """A first small snapshot: the session's Python workers and data sources are up."""
    from pgcdc.snapshot.job import take_snapshot

    conn.execute("CREATE TABLE warm_t (id int8 PRIMARY KEY, s text)")
    conn.execute("INSERT INTO warm_t SELECT g, 'w' || g FROM generate_series(1, 1000) g")
    conn.execute("CREATE PUBLICATION warm_pub FOR TABLE warm_t")
    take_snapshot(spark, dsn, "warm_slot", ["warm_pub"], tmp / "warm", progress=False)
    conn.execute("SELECT pg_drop_replication_slot('warm_slot')")


def _snapshot_paths(spark, conn, dsn, table, rows, tmp: Path, text_path: bool, repeat: int):
    """Every path on ``table``: ``repeat`` rounds taken in turns (the machine's load moves
    between rounds), each path's best round kept; the text path once (it is slow)."""
    from pgcdc.snapshot.job import take_snapshot

    pub = f"{table}_pub"
    conn.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    size = 0

    def copy_bytes():  # the yardstick: the same rows through one COPY, bytes only
        nonlocal size
        n = size = 0
        with conn.cursor() as cur, cur.copy(f"COPY (SELECT * FROM {table}) TO STDOUT") as cp:
            for chunk in cp:
                b = bytes(chunk)
                n += b.count(b"\n")
                size += len(b)
        return n, ()

    def snapshot(reader):
        def run():
            slot = f"{table}_{reader}"
            res = take_snapshot(spark, dsn, slot, [pub], tmp / slot, reader=reader, progress=False)
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            shutil.rmtree(tmp / slot, ignore_errors=True)
            return res.rows, (res.peak_task_rss, res.ranges)

        return run

    def psycopg_rows():
        with conn.transaction(), conn.cursor(name="bench") as cur:
            cur.itersize = 10_000
            cur.execute(f"SELECT * FROM {table}")
            return sum(1 for _ in cur), ()

    def adbc_parquet():
        import adbc_driver_postgresql.dbapi as adbc
        import pyarrow.parquet as pq

        with adbc.connect(dsn) as ac, ac.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")
            reader = cur.fetch_record_batch()
            n = 0
            with pq.ParquetWriter(str(tmp / "adbc.parquet"), _plain(reader.schema)) as w:
                for batch in reader:
                    w.write_batch(_plain_batch(batch))
                    n += batch.num_rows
        return n, ()

    def connectorx_arrow():
        import connectorx as cx

        got = cx.read_sql(
            _url(dsn), f"SELECT * FROM {table}", return_type="arrow", partition_on="id",
            partition_num=2,
        )  # fmt: skip
        return got.num_rows, ()

    paths = {
        "one COPY TO STDOUT, bytes only": copy_bytes,
        "take_snapshot (ADBC binary COPY -> Arrow, tasks write Parquet)": snapshot("arrow"),
        "psycopg typed rows, one process": psycopg_rows,
        "ADBC COPY BINARY -> Arrow -> one Parquet file, one connection": adbc_parquet,
        "ConnectorX, 2 partitions -> Arrow": connectorx_arrow,
    }
    best: dict[str, tuple] = {}
    rounds: dict[str, list[float]] = {}
    for _ in range(max(1, repeat)):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            try:
                n, extra = fn()
            except ImportError:
                continue
            except Exception as e:  # a peer that cannot read a type: say so, go on
                print(f"{name} on {table}: {str(e).splitlines()[0]}")
                continue
            secs = time.perf_counter() - t0
            assert n == rows, (name, n)
            rounds.setdefault(name, []).append(secs)
            if name not in best or secs < best[name][0]:
                best[name] = (secs, extra)
    if text_path:
        t0 = time.perf_counter()
        _, extra = snapshot("text")()
        name = "take_snapshot, text COPY path (reader='text')"
        best[name] = (time.perf_counter() - t0, extra)
        rounds[name] = [best[name][0]]
    copy_s = best["one COPY TO STDOUT, bytes only"][0]
    for name, secs in rounds.items():  # every round, not only the best
        print(f"{table}: {name}: rounds {', '.join(f'{s:.2f}' for s in secs)} s", flush=True)
    return {
        f"{table}: {name}": (rows, secs, size, copy_s, *extra)
        for name, (secs, extra) in best.items()
    }


def _plain(schema):
    """Extension types (opaque numeric, uuid, json) as their storage: Parquet takes those."""
    import pyarrow as pa

    return pa.schema(
        [
            f.with_type(f.type.storage_type if isinstance(f.type, pa.BaseExtensionType) else f.type)
            for f in schema
        ]
    )


def _plain_batch(batch):
    import pyarrow as pa

    cols = [c.storage if isinstance(c.type, pa.BaseExtensionType) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(cols, schema=_plain(batch.schema))


def _url(dsn: str) -> str:
    parts = dict(p.split("=", 1) for p in dsn.split())
    user = parts.get("user", "postgres")
    pw = f":{parts['password']}" if "password" in parts else ""
    return (
        f"postgresql://{user}{pw}@{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}"
        f"/{parts.get('dbname', 'postgres')}"
    )


def print_table(results: dict) -> None:
    print("\n## Initial snapshot (PostgreSQL 18, Spark local[2], same machine)\n")
    print("| path | rows | seconds | rows/s | MB/s | vs COPY | peak RSS/task |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        n, s, size, copy_s = r[:4]
        rss = f"{r[4] / 2**20:,.0f} MiB" if len(r) > 4 and r[4] else ""
        print(
            f"| {name} | {n:,} | {s:.1f} | {_rate(n, s)} | {size / s / 1e6:,.1f} "
            f"| {copy_s / s:.2f}x | {rss} |"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.snapshot_bench")
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--no-text-path", action="store_true", help="skip take_snapshot(reader='text')")
    p.add_argument("--repeat", type=int, default=2, help="rounds per path, best kept")
    args = p.parse_args(argv)
    run(args.rows, text_path=not args.no_text_path, repeat=args.repeat)


if __name__ == "__main__":
    main()
