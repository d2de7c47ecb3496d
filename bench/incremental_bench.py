"""Incremental apply over new capture segments only, against the same run given every
segment, and what the capture's catalog costs (issue 26).

On a PostgreSQL 18 of the test harness, a table of user-defined types (an enum, an enum
array, a composite holding the enum, a domain over it) gets ``batches`` transactions of
``rows`` inserts, updates of earlier rows between them; ``pgcdc capture --binary`` reads the
slot into segments of ``--segment-mb`` while the workload runs (one walsender session, so
each Relation message is in one segment only). A first ``apply_changes`` run reads the first
half of the segments; then the second run is timed twice, from copies of that state:

- new segments only: the older segments and ``relations.jsonl`` deleted (pruned), the run
  given the rest (apply's state carries the relation cache and the catalog);
- every segment: the whole directory (apply skips the units it has applied, by their
  transactions' positions).

Both end states must equal a single run over everything. Then the capture's cost: the
same workload read from fresh slots (created before it) by ``pgcdc capture``, binary and text,
with the catalog lines and type entries it wrote; with ``--before-tree DIR`` (a checkout of
an older commit, its C accelerator built in place) the same captures by that tree's
``pgcdc``, in turns, for msgs/s before and after.

    python -m bench.incremental_bench [--batches N] [--rows N] [--segment-mb M] [--before-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TYPE pair AS (a int, b text, m mood)",
    "CREATE DOMAIN nice AS mood",
    "CREATE TABLE t (id int PRIMARY KEY, m mood, ms mood[], p pair, n nice, v text)",
    "CREATE PUBLICATION pub FOR TABLE t",
]
INSERT = (
    "INSERT INTO t SELECT g, (ARRAY['sad','ok','happy']::mood[])[g %% 3 + 1],"
    " ARRAY['ok', 'sad']::mood[], ROW(g, 'p' || g, 'happy')::pair, 'ok', 'row ' || g"
    " FROM generate_series(%s::int, %s::int) g"
)


def _capture(srv, slot: str, out: Path, *extra: str, tree: str | None = None):
    """``pgcdc capture`` of ``slot`` to its end in a process of its own: seconds, messages."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "generated")])
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(), "--slot", slot,
         "--publication", "pub", "--out", str(out), "--idle-exit", "1", "--no-fsync",
         "--log-format", "json", *extra],
        capture_output=True, text=True, timeout=1800, env=env, cwd=tree,
    )  # fmt: skip
    seconds = time.perf_counter() - t0 - 1.0  # less the idle wait before it stops
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    from pgcdc.capture.files import Captures

    n = sum(1 for _ in Captures.open([out]).records())
    return seconds, n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.incremental_bench")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--segment-mb", type=float, default=4)
    p.add_argument("--before-tree", help="an older checkout whose capture is timed too")
    p.add_argument("--rounds", type=int, default=3, help="runs of each kind, in turns")
    args = p.parse_args(argv)

    from pgcdc.capture import segments
    from pgcdc.capture.catalog import read_catalog_lines
    from pgcdc.runtime.spark import local_spark_session
    from pgcdc.apply.run import apply_changes
    from tests.support.delta import read_table
    from tests.postgres import servers

    tmp = Path(tempfile.mkdtemp(prefix="incremental-bench-"))
    try:
        with servers.running_server("pg18") as srv, srv.connect() as conn:
            for sql in SCHEMA:
                conn.execute(sql)
            runs = [("binary", "--binary"), ("text", None)]
            if args.before_tree:
                runs = [r for kind in runs for r in (kind, (f"{kind[0]} before", kind[1]))]
            slots = ["seg"] + [f"cap_{r}_{i}" for r in range(args.rounds) for i in range(len(runs))]
            for slot in slots:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            cap = tmp / "cap"
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(), "--slot",
                 "seg", "--publication", "pub", "--out", str(cap), "--idle-exit", "2",
                 "--binary", "--no-fsync", "--segment-bytes",
                 str(int(args.segment_mb * 2**20)), "--log-format", "json"],
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            n = args.rows
            for b in range(args.batches):
                with conn.transaction():
                    conn.execute(INSERT, [b * n, b * n + n - 1])
                    if b:
                        conn.execute("UPDATE t SET m = 'happy', v = v || '+' WHERE id %% 10 = 0 "
                                     "AND id < %s", [b * n])  # fmt: skip
            _, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(err)
            rows = conn.execute("SELECT count(*) FROM t").fetchone()[0]
            results: dict[str, tuple] = {}
            for r in range(args.rounds):  # in turns: the machine's load moves
                for i, (name, flag) in enumerate(runs):
                    tree = args.before_tree if name.endswith("before") else None
                    extra = [flag] if flag else []
                    out = tmp / f"cap_{r}_{i}"
                    seconds, msgs = _capture(srv, out.name, out, *extra, tree=tree)
                    lines = read_catalog_lines(out)
                    entries = sum(len(line.get("types", ())) for line in lines)
                    best = results.get(name, (float("inf"),))[0]
                    results[name] = (min(best, seconds), msgs, len(lines), entries)
                    shutil.rmtree(out)
        segs = segments.list_segments(cap)
        half = len(segs) // 2
        spark = local_spark_session("incremental-bench", cores=2)
        spark.sparkContext.setLogLevel("ERROR")
        whole = tmp / "whole"
        t0 = time.perf_counter()
        apply_changes(spark, [str(cap)], whole)
        t_whole = time.perf_counter() - t0
        first = tmp / "first"
        apply_changes(spark, [str(s) for s in segs[:half]], first)
        pruned = tmp / "pruned"
        shutil.copytree(cap, pruned)
        for s in segs[:half]:
            (pruned / s.name).unlink()
        (pruned / "relations.jsonl").unlink()
        times: dict[str, list[float]] = {}
        for r in range(args.rounds):  # in turns, the same JVM: its first runs pay for the JIT
            for name, inputs in (
                ("new segments only", [str(pruned / s.name) for s in segs[half:]]),
                ("every segment", [str(cap)]),
            ):
                state = tmp / f"{name.replace(' ', '_')}{r}"
                shutil.copytree(first, state)
                t0 = time.perf_counter()
                apply_changes(spark, inputs, state)
                times.setdefault(name, []).append(time.perf_counter() - t0)
                got = read_table(state / "public.t").sort_by("id").drop_columns(["_tx_ordinal"])
                want = read_table(whole / "public.t").sort_by("id").drop_columns(["_tx_ordinal"])
                assert got.num_rows == want.num_rows == rows and got.equals(want), name
        spark.stop()
        print(f"\nincremental apply: {args.batches} transactions of {n:,} inserts (and updates) "
              f"of user-defined types, {len(segs)} segments of {args.segment_mb:g} MB; the "
              f"first run applied {half}, the second run the rest ({rows:,} rows at the end)")  # fmt: skip
        print(f"{'second run given':22} {'best s':>8}  every round")
        for name, s in times.items():
            print(f"{name:22} {min(s):8.2f}  {' '.join(f'{x:.2f}' for x in s)}")
        print(f"{'(one run over all)':22} {t_whole:8.2f}")
        print(f"\ncapture of the same workload from a fresh slot (one process, --no-fsync; best "
              f"of {args.rounds} rounds in turns):")  # fmt: skip
        print(f"{'slot':15} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'catalog lines':>14} "
              f"{'type entries':>13}")  # fmt: skip
        for name, (seconds, msgs, lines, entries) in results.items():
            print(f"{name:15} {msgs:9,} {seconds:8.2f} {msgs / seconds:9,.0f} {lines:14} "
                  f"{entries:13}")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
