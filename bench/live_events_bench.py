"""Change events end to end from a live local PostgreSQL: pgcdc vs the pgoutput-decoder package,
and the memory of a streamed transaction far larger than the spill limit.

Throughput (issue 14: at least 20x pgoutput-decoder, a Rust-backed Python CDC library): a
PostgreSQL 18 of the test harness, decoding settings of production (buffered streaming, the
default 64MB logical_decoding_work_mem), the 10-column table of ``events_bench``. Both slots
are created before the workload (ROWS inserts in 10,000-row transactions), so each reader gets
the same changes; each then reads its slot from the start to the last insert, in a process of
its own, and times itself from connecting to its last event (start-up and imports left out):

- pgcdc: ``pgcdc.events.reader.live_events`` on a ``LogicalStream`` (walsender, text slot):
  decode, relation cache, typed values (psycopg loaders), transaction assembly;
- pgoutput-decoder: ``async for message in LogicalReplicationReader(...)`` (its own
  replication connection, Debezium-shaped messages with typed ``after`` dicts).

pgoutput-decoder ships only a CPython >= 3.12 wheel (abi3) and an sdist that needs crates.io.
The bench runs it with the first interpreter that imports it: $PGOUTPUT_DECODER_PYTHON, this
one, or a venv it makes once under ~/.cache/pgcdc-bench-peer with python3.12/3.13 and pip.
Without one it says so and measures pgcdc alone.

Spill (issue 14: memory stays flat on a 1 GB streamed transaction, because it spills): a
PostgreSQL 18 with streaming=on and logical_decoding_work_mem=64kB gets ONE transaction of
1 KB rows (``--spill-mb``, default 1024 MB of tuple data, and a quarter of that for the second
size); a child process reads it through pgcdc events with a 64 MB spill limit and reports its
peak RSS above its RSS before reading, the bytes spilled and the event count.

    python -m bench.live_events_bench [--rows N] [--spill-mb MB] [--skip-spill] [--skip-peer]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = 200_000
TX_ROWS = 10_000
TARGET_RATIO = 20.0
SPILL_LIMIT = 64 << 20
PEER_VENV = Path.home() / ".cache" / "pgcdc-bench-peer"

TABLE = """CREATE TABLE bench (
    id int4 PRIMARY KEY, a int8, b text, c bool, d float8,
    e timestamptz, f date, g text, h int4, i float8)"""
# the same values as events_bench's rows
WORKLOAD = """INSERT INTO bench SELECT g, g * 1000, 'name ' || g, g %% 2 = 1, g * 0.5,
    timestamptz '2023-12-28 10:13:20.000001+00' + g * interval '1 us',
    date '2024-08-22' + g %% 300, 'some text value', -g, 1.25
    FROM generate_series(%s::int, %s::int) g"""

PEER_CHILD = r"""
import asyncio, sys, time
import pgoutput_decoder

host, port, slot, expected = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

async def main():
    t0 = time.perf_counter()
    reader = pgoutput_decoder.LogicalReplicationReader(
        publication_name="pub", slot_name=slot, host=host, database="postgres", port=port,
        user="postgres", password="")
    n = 0
    it = reader.__aiter__()
    while n < expected:
        message = await asyncio.wait_for(it.__anext__(), 60)
        if message.op in ("c", "u", "d"):
            assert message.after is not None
            n += 1
    seconds = time.perf_counter() - t0
    await reader.stop()
    print(n, seconds)

asyncio.run(main())
"""


# -- children (each reads one slot, times itself and prints "events seconds ...") -----------


def _pgcdc_child(dsn: str, slot: str, publication: str, expected: int, memory_limit: int) -> None:
    import resource

    from pgcdc.capture.logical import LogicalStream
    from pgcdc.events.reader import EventReader, live_events

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    reader = EventReader(memory_limit=memory_limit)
    n = 0
    with LogicalStream(dsn, slot, [publication], streaming="on") as stream:
        timed = _TimedReads(stream)
        for events, ack in live_events(timed, reader=reader):
            n += sum(1 for _ in events)
            if ack is not None:
                stream.ack(ack)
            if n >= expected:  # the workload's events, as the peer counts them
                break
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    in_events = seconds - timed.seconds  # the rest: connecting and the slot's stream
    print(n, seconds, rss0 << 10, rss << 10, reader.budget.spilled_bytes, in_events)


class _TimedReads:
    """The stream, with the time its read_records takes summed up."""

    def __init__(self, stream):
        self.stream = stream
        self.seconds = 0.0

    def read_records(self, *args):
        t0 = time.perf_counter()
        try:
            return self.stream.read_records(*args)
        finally:
            self.seconds += time.perf_counter() - t0


# -- the parent ------------------------------------------------------------------------------


def _run_child(argv: list[str], timeout: float = 1800) -> list[str]:
    done = subprocess.run(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed:\n{done.stderr[-3000:]}")
    return done.stdout.split()


def _this_child(*args) -> list[str]:
    return _run_child([sys.executable, "-m", "bench.live_events_bench", "--child", *map(str, args)])


def peer_python() -> str | None:
    """An interpreter that imports pgoutput_decoder (see the module docstring), or None."""
    candidates = [os.environ.get("PGOUTPUT_DECODER_PYTHON"), sys.executable]
    venv_python = PEER_VENV / "bin" / "python"
    candidates.append(str(venv_python))
    for python in candidates:
        if python and Path(python).exists() and _imports_peer(python):
            return python
    base = shutil.which("python3.13") or shutil.which("python3.12")
    if base is None:
        return None
    try:  # a venv of its own: the wheel is for CPython >= 3.12 only
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True, capture_output=True)
        subprocess.run(
            [str(venv_python), "-m", "pip", "install", "-q", "pgoutput-decoder==0.1.0"],
            check=True,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, OSError):
        return None
    return str(venv_python) if _imports_peer(str(venv_python)) else None


def _imports_peer(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import pgoutput_decoder"], capture_output=True)
    return probe.returncode == 0


def run_throughput(rows: int = ROWS, peer: bool = True) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.postgres import servers

    python = peer_python() if peer else None
    results: dict[str, tuple[int, float]] = {}
    with servers.running_server("pg18", servers.PRODUCTION_DECODING) as srv, srv.connect() as conn:
        conn.execute(TABLE)
        conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
        for slot in ("pgcdc_slot", "peer_slot"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        for i in range(1, rows + 1, TX_ROWS):
            conn.execute(WORKLOAD, [i, min(i + TX_ROWS - 1, rows)])
        n, seconds, *_, in_events = _this_child(
            srv.conninfo(), "pgcdc_slot", "pub", rows, SPILL_LIMIT
        )
        results["pgcdc (walsender -> typed events)"] = (int(n), float(seconds))
        if python is not None:
            peer = [python, "-c", PEER_CHILD, "127.0.0.1", str(srv.port), "peer_slot", str(rows)]
            try:
                out = _run_child(peer)
            except RuntimeError as e:  # it has failed at start now and then: once more
                print(f"pgoutput-decoder failed ({str(e).splitlines()[-1][:200]}); again")
                out = _run_child(peer)
            results["pgoutput-decoder 0.1.0"] = (int(out[0]), float(out[1]))
    print(
        f"\nlive change events, {rows:,} inserts of 10-column rows in {TX_ROWS:,}-row "
        "transactions (PG 18, local, text slot); each reader timed from connecting to its "
        "last event"
    )
    print(f"{'reader':<36}{'events':>10}{'seconds':>9}{'events/s':>11}")
    for name, (n, seconds) in results.items():
        print(f"{name:<36}{n:>10,}{seconds:>9.2f}{n / seconds:>11,.0f}")
    n, seconds = results["pgcdc (walsender -> typed events)"]
    print(
        f"pgcdc's time: {float(in_events):.2f} s turning records into events "
        f"({float(in_events) / n * 1e6:.1f} us/event), {seconds - float(in_events):.2f} s "
        "connecting and reading the slot (LogicalStream.read_records, the server decoding)"
    )
    if len(results) == 2:
        (n_a, s_a), (n_b, s_b) = results.values()
        ratio = (n_a / s_a) / (n_b / s_b)
        verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
        print(f"pgcdc is {ratio:.1f}x pgoutput-decoder: {verdict} the {TARGET_RATIO:g}x target")
    elif peer:
        print(
            "pgoutput-decoder: no interpreter imports it (it needs CPython >= 3.12: set "
            "PGOUTPUT_DECODER_PYTHON); pgcdc measured alone"
        )
    return results


def run_spill(megabytes: int = 1024, limit: int = SPILL_LIMIT) -> list[dict]:
    """One streamed transaction of `megabytes` MB of 1 KB rows, and one of a quarter of it."""
    sys.path.insert(0, str(ROOT))
    from tests.postgres import servers

    sizes = sorted({max(1, megabytes // 4), megabytes})
    results = []
    # streamed in 64kB pieces, as production streams a transaction past its memory limit
    settings = {**servers.PRODUCTION_DECODING, "logical_decoding_work_mem": "64kB"}
    with servers.running_server("pg18", settings) as srv, srv.connect() as conn:
        conn.execute("ALTER SYSTEM SET max_wal_size = '4GB'")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE TABLE big (id int4, pad text)")
        conn.execute("ALTER TABLE big ALTER pad SET STORAGE plain")  # 1 KB inline, uncompressed
        conn.execute("CREATE PUBLICATION pub_big FOR TABLE big")
        for mb in sizes:
            rows = mb << 10  # 1 KB of text each
            slot = f"spill_{mb}"
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            t0 = time.perf_counter()
            conn.execute(
                "INSERT INTO big SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, %s) g",
                [rows],
            )
            insert_s = time.perf_counter() - t0
            n, seconds, rss0, rss, spilled, _ = _this_child(
                srv.conninfo(), slot, "pub_big", rows, limit
            )
            results.append(
                {
                    "mb": mb,
                    "rows": rows,
                    "events": int(n),
                    "seconds": float(seconds),
                    "insert_seconds": insert_s,
                    "rss_growth": int(rss) - int(rss0),
                    "peak_rss": int(rss),
                    "spilled": int(spilled),
                }
            )
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            conn.execute("TRUNCATE big")
    print(
        f"\none streamed transaction (PG 18, streaming=on, logical_decoding_work_mem=64kB), "
        f"1 KB rows, read through pgcdc events with a {limit >> 20} MB spill limit"
    )
    print(
        f"{'tuple data':>10}{'events':>10}{'right':>7}{'insert s':>9}{'read s':>8}{'spilled MB':>11}"
        f"{'peak RSS MB':>12}{'growth MB':>10}{'growth/limit':>13}"
    )
    for r in results:
        print(
            f"{r['mb']:>8}MB{r['events']:>10,}{'yes' if r['events'] == r['rows'] else 'NO':>7}"
            f"{r['insert_seconds']:>9.1f}{r['seconds']:>8.1f}{r['spilled'] / 1e6:>11,.0f}{r['peak_rss'] / 1e6:>12,.0f}"
            f"{r['rss_growth'] / 1e6:>10,.0f}{r['rss_growth'] / limit:>13.2f}"
        )
    if len(results) == 2:
        small, large = results
        print(
            f"peak RSS growth: {small['rss_growth'] / 1e6:.0f} MB for {small['mb']} MB, "
            f"{large['rss_growth'] / 1e6:.0f} MB for {large['mb']} MB of changes "
            f"({'flat' if large['rss_growth'] < small['rss_growth'] * 1.25 + (8 << 20) else 'GROWS'})"
        )
    return results


def run(rows: int = ROWS, spill_mb: int = 1024, spill: bool = True, peer: bool = True) -> None:
    run_throughput(rows, peer=peer)
    if spill:
        run_spill(spill_mb)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.live_events_bench")
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--spill-mb", type=int, default=1024)
    parser.add_argument("--skip-spill", action="store_true")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    if not args.skip_throughput:
        run_throughput(args.rows, peer=not args.skip_peer)
    if not args.skip_spill:
        run_spill(args.spill_mb)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if sys.argv[1:2] == ["--child"]:
        _, _, dsn, slot, publication, expected, limit = sys.argv
        _pgcdc_child(dsn, slot, publication, int(expected), int(limit))
    else:
        main()
