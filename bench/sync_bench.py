"""``pgcdc sync`` end to end: its throughput against the one-process peer, its latency at a
steady offered load, and the WAL its slot retains with and without heartbeats, in one run.

A PostgreSQL 18 of the test harness (production decoding settings unless
``--test-decoding``; the server's default ``wal_sender_timeout``); ``pgcdc sync`` runs as a subprocess (``python -m pgcdc sync ...
--trigger 1s --master local[2] --log-format json``, fsynced capture), started on an empty
published table and waited for until its ``ready`` line; its JSON log lines are read from
stderr as they come, each stamped with the time it was read (the lines' own ``ts`` has whole
seconds). It is stopped with SIGTERM at the end of each part (exit 0 expected).

1. **Throughput** (``--events``, default 200,000; ``--repeat`` rounds, default 2): the
   workload of ``bench.workload``, ``bench.source_bench``'s too (inserts into ``bench_t`` in
   1,000-row transactions, written as fast as one session can) while sync runs. Done when sync's first ``apply`` line
   says ``applied_lsn`` >= the server's WAL position read right after the last commit (or
   when its lines' ``events`` add up to the workload's, whichever comes first); events/s is
   the events over the time from the workload's start to then, "drain" the part of it after
   the last commit. The Delta table's row count is checked. With ``--warm-up N``, N inserts
   into another published table are applied before the workload, as by a sync that has run a
   while (its JVM past its first batches); by default the workload starts at ``ready``. The peer in the same round: a
   slot created before the workload, peeked and typed by ``EventReader`` in this process
   (``bench.workload.peer_path``) after sync is stopped. Then the same workload again
   as a backlog, written while sync is down (the peer's own situation: the slot holds it
   all), and sync started again on its directory: the seconds to the ``apply`` line covering
   it, whole and after sync's ``ready`` line (its start: Python, the Spark session, the
   capture child), against a peer slot created with the backlog's. Once, after round 1, a
   larger backlog the same way (``--big-backlog``, default 1,000,000; 0 skips): sync's start
   is a fixed cost, and the peer's peek of a whole slot grows with it.
2. **Latency** (``--rate`` changes/s, default 5,000, for ``--seconds``, default 60): a
   transaction of ``--tx-rows`` changes (default 50: 4/5 inserts, 1/5 updates of earlier
   rows, any of them or the last ``--update-window`` ones) every ``tx-rows / rate`` seconds
   on a fixed schedule. Before each COMMIT the same session reads
   ``pg_current_wal_insert_lsn()`` (past its changes, before its commit record); the
   transaction is visible at the first ``apply`` line whose ``applied_lsn`` passes it.
   Prints the commit-to-visible distribution, the cycles, and where the time went (the wait
   for the cycle that applied a transaction to start, and that cycle's ``took_s``). The Delta
   table is checked against the server (rows, sum of the updated column).
3. **Retained WAL** (``--wal-minutes M``, default 2; 0 skips): the published table idle while
   database ``other`` gets an insert every 50 ms; sync for M minutes without ``--heartbeat``,
   then (a new slot and directory) with ``--heartbeat 10``; its slot's
   ``pg_current_wal_lsn() - restart_lsn`` and ``- confirmed_flush_lsn`` every 10 s.

Every number is printed with the 1-minute load average (``/proc/loadavg``): the machine is
shared.

    python -m bench.sync_bench [--events N] [--repeat R] [--rate N] [--seconds S]
                               [--wal-minutes M] [--trigger 1s] [--master local[2]]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .workload import FILL, PUB, TABLE, drop_slot, peer_path

ROOT = Path(__file__).resolve().parent.parent
EVENTS = 200_000
# once, after round 1: a backlog five times the workload (sync's start weighs less in it, the
# peer's peek of a whole slot more)
BIG_BACKLOG = 1_000_000
LAT_TABLE = "CREATE TABLE lat_t (id int8 PRIMARY KEY, v int8 NOT NULL, s text, ts timestamptz)"
LAT_TX = (
    "WITH i AS (INSERT INTO lat_t SELECT g, 0, 'row ' || g, now() FROM generate_series(%s::int8, %s::int8) g),"
    " u AS (UPDATE lat_t SET v = v + 1, ts = now() WHERE id = ANY(%s::int8[])) SELECT 1"
)
# read in a latency transaction after its changes: the commit record ends past it, and a
# position the capture records past it is that commit's end or later (read after the COMMIT,
# another session's WAL could put it past the commit: no apply line would ever reach it)
INSERT_LSN = "SELECT pg_current_wal_insert_lsn()::text"
READY_TIMEOUT = 300.0  # seconds for sync's JVM, snapshot and first cycle
STOP_TIMEOUT = 120.0


class BenchError(RuntimeError):
    pass


def load() -> str:
    """The 1-minute load average."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _lsn(text: str) -> int:
    from pgcdc.lsn import parse_lsn

    return parse_lsn(text)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class SyncProcess:
    """A ``python -m pgcdc sync`` subprocess; its JSON log lines, each with the time read."""

    engine_args: tuple = ()  # --engine: every sync of the run (none: sync's default)

    def __init__(self, dsn: str, pub: str, slot: str, out: Path, trigger: str, master: str,
                 *extra: str):  # fmt: skip
        cmd = [sys.executable, "-m", "pgcdc", "sync", "--dsn", dsn, "--publication", pub,
               "--slot", slot, "--out", str(out), "--trigger", trigger, "--master", master,
               "--log-format", "json", *self.engine_args, *extra]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.lines: list[tuple[float, dict]] = []
        self.other: collections.deque = collections.deque(maxlen=40)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, cwd=out.parent,
                                     env=env)  # fmt: skip
        self.reader = threading.Thread(target=self._read, name="sync-log", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            t = time.monotonic()
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                self.lines.append((t, doc))
            else:
                self.other.append(line.rstrip())

    def applies(self, start: int = 0) -> list[tuple[float, dict]]:
        return [(t, d) for t, d in self.lines[start:] if d.get("event") == "apply"]

    def wait(self, found, timeout: float, what: str, start: int = 0) -> tuple[int, float, dict]:
        """The first line from ``start`` on for which ``found(doc)`` is true: (index, time
        read, doc). Raises BenchError when sync ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        i = start
        while True:
            while i < len(self.lines):
                t, doc = self.lines[i]
                if found(doc):
                    return i, t, doc
                i += 1
            if self.proc.poll() is not None:
                self.reader.join(5)
                if i < len(self.lines):
                    continue
                raise BenchError(f"sync exited ({self.proc.returncode}) before {what}:\n"
                                 + self.tail())  # fmt: skip
            if time.monotonic() > deadline:
                raise BenchError(f"no {what} in {timeout:g}s:\n" + self.tail())
            time.sleep(0.02)

    def tail(self) -> str:
        docs = [json.dumps(d) for _t, d in self.lines[-25:]]
        return "\n".join(docs + list(self.other)[-15:])

    def stop(self) -> int:
        """SIGTERM, then its exit status (killed after STOP_TIMEOUT)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)


def delta_rows(path: Path):
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_table()


def _wal(conn) -> int:
    return _lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


# -- 1. throughput ----------------------------------------------------------------------------


def throughput_round(srv, conn, r: int, events: int, trigger: str, master: str, tmp: Path,
                     big_backlog: int = 0, warm_up: int = 0):  # fmt: skip
    slot, peer_slot = f"sync_t{r}", f"peer_t{r}"
    conn.execute("TRUNCATE bench_t")
    out = tmp / f"throughput{r}"
    sync = SyncProcess(srv.conninfo(), PUB, slot, out, trigger, master)
    try:
        sync.wait(lambda d: d.get("event") == "ready", READY_TIMEOUT, "ready")
        if warm_up:  # a sync that has run a while: its JVM and Python past their first batches
            _warm_up(conn, sync, r, warm_up)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [peer_slot])
        start = len(sync.lines)
        durable = DurableWatch(out / "_capture")
        t0 = time.monotonic()
        for lo in range(1, events + 1, 1000):
            conn.execute(FILL.format(lo=lo, hi=min(lo + 999, events)))
        written = time.monotonic()
        target = _wal(conn)
        total = [0]

        def done(d):
            if d.get("event") != "apply":
                return False
            total[0] += d.get("events") or 0
            return _lsn(d["applied_lsn"]) >= target or total[0] >= events

        timeout = 600 + events / 500
        _i, t_done, last = sync.wait(done, timeout, "apply line covering the workload", start)
        how = "applied_lsn" if _lsn(last["applied_lsn"]) >= target else "events"
        t_durable = durable.stop(target)
        cycles = [d for t, d in sync.applies(start) if t <= t_done]
        rows = delta_rows(out / "public.bench_t").num_rows
        code = sync.stop()
    finally:
        sync.kill()
    n, peer_s, _ = peer_path(conn, peer_slot, srv.major)
    drop_slot(conn, peer_slot)
    if rows != events or n != events:
        raise BenchError(f"round {r + 1}: Delta table {rows:,} rows, peer {n:,}, want {events:,}")
    backlog = backlog_part(srv, conn, r, events, trigger, master, out, slot)
    if big_backlog and r == 0:  # once: a backlog where sync's start weighs less
        big = backlog_part(srv, conn, r + 100, 2 * events, trigger, master, out, slot,
                           big_backlog)  # fmt: skip
        backlog["big"] = big
    drop_slot(conn, slot)
    took = [d["took_s"] for d in cycles]
    return {
        **backlog,
        "events": events,
        "seconds": t_done - t0,
        "write_s": written - t0,
        "durable_s": (t_durable - t0) if t_durable is not None else float("nan"),
        "drain_s": t_done - written,
        "peer_s": peer_s,
        "cycles": len(cycles),
        "took_median": statistics.median(took) if took else 0.0,
        "took_max": max(took, default=0.0),
        "max_cycle_events": max((d.get("events") or 0 for d in cycles), default=0),
        "done_by": how,
        "exit": code,
        "load": load(),
    }


def _warm_up(conn, sync, r: int, rows: int) -> None:
    """``rows`` inserts into ``bench_warm`` (published too, not the workload's table) in
    1,000-row transactions, waited for until sync has applied them."""
    base = r * rows
    for lo in range(base + 1, base + rows + 1, 1000):
        fill = FILL.format(lo=lo, hi=min(lo + 999, base + rows))
        conn.execute(fill.replace("INTO bench_t", "INTO bench_warm"))
    target = _wal(conn)
    sync.wait(lambda d: d.get("event") == "apply" and _lsn(d["applied_lsn"]) >= target,
              READY_TIMEOUT, "the warm-up applied")  # fmt: skip


def backlog_part(srv, conn, r: int, events: int, trigger: str, master: str, out: Path,
                 slot: str, backlog: int | None = None) -> dict:  # fmt: skip
    """The same workload again while sync is down (its slot holds it, as the peer's does),
    then sync started again on its directory: the seconds from the start to the apply line
    covering the backlog, and from its ``ready`` line; the peer of a slot created with the
    backlog's. ``backlog``: that many inserts rather than ``events`` (the table holds
    ``events`` rows before)."""
    backlog = events if backlog is None else backlog
    peer_slot = f"peer_b{r}"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [peer_slot])
    for lo in range(events + 1, events + backlog + 1, 1000):
        conn.execute(FILL.format(lo=lo, hi=min(lo + 999, events + backlog)))
    target = _wal(conn)
    conn.execute("CHECKPOINT")
    t0 = time.monotonic()
    durable = DurableWatch(out / "_capture")
    sync = SyncProcess(srv.conninfo(), PUB, slot, out, trigger, master)
    try:
        _i, t_ready, _ = sync.wait(lambda d: d.get("event") == "ready", READY_TIMEOUT, "ready")
        _i, t_done, _ = sync.wait(
            lambda d: d.get("event") == "apply" and _lsn(d["applied_lsn"]) >= target,
            600 + backlog / 500,
            "apply line covering the backlog",
        )
        t_durable = durable.stop(target)
        rows = delta_rows(out / "public.bench_t").num_rows
        cycles = [(round(t - t0, 2), d["events"], d["took_s"]) for t, d in sync.applies()
                  if t <= t_done]  # fmt: skip
        code = sync.stop()
    finally:
        sync.kill()
    n, peer_s, _ = peer_path(conn, peer_slot, srv.major)
    drop_slot(conn, peer_slot)
    if rows != events + backlog or n != backlog or code != 0:
        raise BenchError(f"round {r + 1}, backlog: {rows:,} rows, peer {n:,}, exit {code}")
    return {
        "backlog_events": backlog,
        "backlog_s": t_done - t0,
        "backlog_ready_s": t_ready - t0,
        "backlog_durable_s": (t_durable - t0) if t_durable is not None else float("nan"),
        "backlog_peer_s": peer_s,
        "backlog_cycles": cycles,
    }


def print_throughput(rounds: list[dict]) -> None:
    print("\npgcdc sync throughput against the one-process peer (EventReader over a peek)")
    print(
        f"{'round':>5}{'events':>11}{'sync s':>8}{'write s':>8}{'durable':>8}{'drain s':>8}"
        f"{'sync ev/s':>11}"
        f"{'peer s':>8}{'peer ev/s':>11}{'sync/peer':>10}{'cycles':>7}{'took p50':>9}"
        f"{'took max':>9}{'exit':>5}{'load':>6}"
    )
    for i, g in enumerate(rounds):
        rate, peer = g["events"] / g["seconds"], g["events"] / g["peer_s"]
        print(
            f"{i + 1:>5}{g['events']:>11,}{g['seconds']:>8.1f}{g['write_s']:>8.1f}"
            f"{g['durable_s']:>8.1f}{g['drain_s']:>8.1f}{rate:>11,.0f}{g['peer_s']:>8.1f}{peer:>11,.0f}"
            f"{rate / peer:>9.2f}x{g['cycles']:>7}{g['took_median']:>9.2f}{g['took_max']:>9.2f}"
            f"{g['exit']:>5}{g['load']:>6}"
        )
    print(
        "(done by: " + ", ".join(g["done_by"] for g in rounds) + "; durable: when the "
        "capture's state.json first reached the WAL after the last commit)"
    )
    print("\nthe same workload as a backlog (written while sync is down), sync started again")
    print(f"{'round':>5}{'events':>11}{'sync s':>8}{'ready s':>8}{'durable':>8}"
          f"{'after ready':>12}{'peer s':>8}{'sync/peer':>10}{'after ready':>12}")  # fmt: skip
    rows = [(str(i + 1), g) for i, g in enumerate(rounds)]
    rows += [("big", g["big"]) for g in rounds if "big" in g]
    for i, g in rows:
        whole, ready, peer = g["backlog_s"], g["backlog_ready_s"], g["backlog_peer_s"]
        print(
            f"{i:>5}{g['backlog_events']:>11,}{whole:>8.1f}{ready:>8.1f}"
            f"{g['backlog_durable_s']:>8.1f}{whole - ready:>12.1f}"
            f"{peer:>8.1f}{peer / whole:>9.2f}x{peer / (whole - ready):>11.2f}x"
        )
        print("      cycles (line read at s, events, took s): "
              + ", ".join(f"({t:g}, {e:,}, {k:g})" for t, e, k in g["backlog_cycles"]))  # fmt: skip
    print("(durable: when the capture's state.json first reached the WAL after the backlog; "
          "big: once, a larger backlog on round 1's directory)")  # fmt: skip


class DurableWatch:
    """The capture directory's durable position (state.json), sampled every 20 ms."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="durable", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from pgcdc.capture.segments import read_state

        while not self.done.wait(0.02):
            try:
                state = read_state(self.directory)
            except Exception:  # noqa: BLE001 - mid-write: the next sample
                continue
            if state is not None:
                self.samples.append((time.monotonic(), state.lsn))

    def stop(self, target: int) -> float | None:
        """When the durable position first reached ``target`` (None: not seen)."""
        self.done.set()
        self.thread.join(5)
        return next((t for t, lsn in self.samples if lsn >= target), None)


# -- 2. latency -------------------------------------------------------------------------------


def offer_transaction(w, rng, next_id: int, tx_rows: int, window: int, commits: list) -> int:
    """One transaction of ``tx_rows`` changes into ``lat_t`` from key ``next_id``: 4/5
    inserts, 1/5 updates of earlier rows (any, or among the last ``window``) once there are
    ten transactions' worth; appends (commit time, the LSN read before its COMMIT) to
    ``commits`` and returns the next key."""
    n_upd = tx_rows // 5 if next_id > 10 * tx_rows else 0
    low = max(1, next_id - window) if window else 1
    ids = rng.sample(range(low, next_id), n_upd) if n_upd else []
    hi = next_id + tx_rows - n_upd - 1
    with w.transaction():  # its changes are in the WAL before that LSN, its
        w.execute(LAT_TX, [next_id, hi, ids])  # commit record past it
        lsn = _lsn(w.execute(INSERT_LSN).fetchone()[0])
    commits.append((time.monotonic(), lsn))
    return hi + 1


def visible_at(commits, applies):
    """(commit time, index of the first apply line whose ``applied_lsn`` passes the
    transaction's LSN) for each transaction in order, up to the first no line has passed."""
    j = 0
    for t_commit, lsn in commits:
        while j < len(applies) and _lsn(applies[j][1]["applied_lsn"]) <= lsn:
            j += 1
        if j == len(applies):
            return
        yield t_commit, j


def latency(srv, conn, rate: int, seconds: float, tx_rows: int, window: int, trigger: str,
            master: str, tmp: Path) -> dict:  # fmt: skip
    conn.execute(LAT_TABLE)
    conn.execute("CREATE PUBLICATION lat_pub FOR TABLE lat_t")
    out = tmp / "latency"
    sync = SyncProcess(srv.conninfo(), "lat_pub", "sync_lat", out, trigger, master)
    rng = random.Random(1)
    period = tx_rows / rate
    commits: list[tuple[float, int]] = []
    try:
        sync.wait(lambda d: d.get("event") == "ready", READY_TIMEOUT, "ready")
        start = len(sync.lines)
        late = 0
        with srv.connect() as w:
            next_id = 1
            t0 = time.monotonic()
            for k in range(int(seconds / period)):
                delay = t0 + k * period - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -period:
                    late += 1
                if time.monotonic() > t0 + seconds * 1.5 + 5:
                    break  # a machine too busy to offer the load: stop at a bound
                next_id = offer_transaction(w, rng, next_id, tx_rows, window, commits)
            t_end = time.monotonic()
        last = commits[-1][1]
        sync.wait(lambda d: d.get("event") == "apply" and _lsn(d["applied_lsn"]) > last, 120,
                  "apply line covering the last transaction", start)  # fmt: skip
        applies = sync.applies(start)
        server = conn.execute("SELECT count(*), coalesce(sum(v), 0) FROM lat_t").fetchone()
        table = delta_rows(out / "public.lat_t")
        got = (table.num_rows, sum(v for v in table.column("v").to_pylist()))
        code = sync.stop()
    finally:
        sync.kill()
    drop_slot(conn, "sync_lat")
    if tuple(server) != got:
        raise BenchError(f"latency: Delta table (rows, sum v) {got}, server {tuple(server)}")
    # each transaction: the first apply line past its LSN (applied_lsn only grows)
    lat, waits, tooks = [], [], []
    for t_commit, j in visible_at(commits, applies):
        t_line, doc = applies[j]
        lat.append(t_line - t_commit)
        tooks.append(doc["took_s"])
        waits.append(max(0.0, t_line - doc["took_s"] - t_commit))
    if len(lat) != len(commits):
        raise BenchError(f"latency: {len(commits) - len(lat)} transactions no apply line passed")
    in_load = [d for t, d in applies if t <= applies[j][0]]
    starts = [t - d["took_s"] for t, d in applies if t <= applies[j][0]]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    return {
        "transactions": len(commits),
        "changes": len(commits) * tx_rows,
        "offered_s": t_end - t0,
        "late": late,
        "lat": lat,
        "wait_mean": statistics.fmean(waits),
        "took_mean": statistics.fmean(tooks),
        "cycles": len(in_load),
        "took_median": statistics.median(d["took_s"] for d in in_load),
        "took_max": max(d["took_s"] for d in in_load),
        "gap_median": statistics.median(gaps) if gaps else 0.0,
        "events_median": statistics.median(d.get("events") or 0 for d in in_load),
        "rows": got[0],
        "exit": code,
        "load": load(),
    }


def print_latency(g: dict, rate: int, trigger: str, window: int) -> None:
    lat = g["lat"]
    where = f"the last {window:,} rows" if window else "any earlier row"
    print(f"\npgcdc sync latency, commit to visible in Delta, offered {rate:,} changes/s "
          f"(updates of {where}), --trigger {trigger}")  # fmt: skip
    print(f"  offered: {g['transactions']:,} transactions, {g['changes']:,} changes in "
          f"{g['offered_s']:.1f}s ({g['changes'] / g['offered_s']:,.0f}/s; {g['late']} "
          f"transactions more than one period late)")  # fmt: skip
    print(f"{'count':>8}{'p50 s':>8}{'p90 s':>8}{'p99 s':>8}{'max s':>8}{'cycles':>8}"
          f"{'took p50':>9}{'took max':>9}{'cycle gap':>10}{'ev/cycle':>9}{'exit':>5}"
          f"{'load':>6}")  # fmt: skip
    print(f"{len(lat):>8,}{_pct(lat, 0.5):>8.2f}{_pct(lat, 0.9):>8.2f}{_pct(lat, 0.99):>8.2f}"
          f"{max(lat):>8.2f}{g['cycles']:>8}{g['took_median']:>9.2f}{g['took_max']:>9.2f}"
          f"{g['gap_median']:>10.2f}{g['events_median']:>9,.0f}{g['exit']:>5}"
          f"{g['load']:>6}")  # fmt: skip
    print(f"  a transaction's mean: {g['wait_mean']:.2f}s from its commit to the start of the "
          f"cycle that applied it, then {g['took_mean']:.2f}s that cycle took")  # fmt: skip
    verdict = "met" if _pct(lat, 0.5) < 2 and _pct(lat, 0.99) < 5 else "MISSED"
    print(f"  target (p50 < 2s, p99 < 5s): {verdict}; Delta table equals the server: "
          f"{g['rows']:,} rows")  # fmt: skip


# -- 3. retained WAL --------------------------------------------------------------------------


def retained_wal(srv, conn, minutes: float, trigger: str, master: str, tmp: Path) -> dict:
    import psycopg

    conn.execute("CREATE DATABASE other")
    conn.execute("CREATE TABLE idle_t (id int8 PRIMARY KEY, s text)")
    conn.execute("INSERT INTO idle_t SELECT g, 'idle ' || g FROM generate_series(1, 100) g")
    conn.execute("CREATE PUBLICATION idle_pub FOR TABLE idle_t")
    stop = threading.Event()
    writes = [0]

    def writer():
        with psycopg.connect(srv.conninfo(dbname="other"), autocommit=True) as oc:
            oc.execute("CREATE TABLE o (id bigserial PRIMARY KEY, s text, at timestamptz)")
            while not stop.wait(0.05):
                oc.execute("INSERT INTO o (s, at) VALUES ('x', now())")
                writes[0] += 1

    thread = threading.Thread(target=writer, name="other-db-writer", daemon=True)
    thread.start()
    results = {}
    try:
        for label, extra in (("no heartbeat", ()), ("--heartbeat 10", ("--heartbeat", "10"))):
            slot = "sync_wal_hb" if extra else "sync_wal"
            out = tmp / slot
            sync = SyncProcess(srv.conninfo(), "idle_pub", slot, out, trigger, master, *extra)
            samples = []
            try:
                sync.wait(lambda d: d.get("event") == "ready", READY_TIMEOUT, "ready")
                t0, wal0 = time.monotonic(), _wal(conn)
                for k in range(int(minutes * 6) + 1):
                    delay = t0 + 10 * k - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    if sync.proc.poll() is not None:
                        raise BenchError(f"sync exited ({sync.proc.returncode}):\n{sync.tail()}")
                    row = conn.execute(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8,"
                        " pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8"
                        " FROM pg_replication_slots WHERE slot_name = %s",
                        [slot],
                    ).fetchone()
                    samples.append((time.monotonic() - t0, row[0], row[1], load()))
                wal_rate = (_wal(conn) - wal0) / (time.monotonic() - t0)
                code = sync.stop()
            finally:
                sync.kill()
            drop_slot(conn, slot)
            results[label] = {"samples": samples, "exit": code, "wal_rate": wal_rate}
    finally:
        stop.set()
        thread.join(10)
    results["writes"] = writes[0]
    return results


def print_wal(results: dict, minutes: float) -> None:
    print(f"\nretained WAL of sync's slot, published table idle, database 'other' written every "
          f"50 ms ({results['writes']:,} inserts), {minutes:g} min each")  # fmt: skip
    labels = [k for k in results if k != "writes"]
    print(f"{'s':>6}" + "".join(f"{k + ' retained':>28}{'flush lag':>12}" for k in labels)
          + f"{'load':>6}")  # fmt: skip
    rows = zip(*(results[k]["samples"] for k in labels))
    for row in rows:
        cells = "".join(f"{r:>28,}{c:>12,}" for _s, r, c, _l in row)
        print(f"{row[0][0]:>6.0f}{cells}{row[-1][3]:>6}")
    print(f"{'':>6}{'at the end':>16}{'max':>16}{'WAL written/s':>15}{'exit':>6}")
    for k in labels:
        g = results[k]
        s = g["samples"]
        print(f"{k:<16}{s[-1][1]:>12,} B{max(x[1] for x in s):>14,} B"
              f"{g['wal_rate']:>13,.0f} B{g['exit']:>6}   (load {s[-1][3]})")  # fmt: skip


# -- the run ----------------------------------------------------------------------------------


def run(
    events: int = EVENTS,
    repeat: int = 2,
    *,
    rate: int = 5000,
    seconds: float = 60.0,
    tx_rows: int = 50,
    update_window: int = 0,
    wal_minutes: float = 2.0,
    trigger: str = "1s",
    master: str = "local[2]",
    production: bool = True,
    big_backlog: int = BIG_BACKLOG,
    warm_up: int = 0,
) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.postgres import servers

    settings = {**servers.WALSENDER_DEFAULTS, **(servers.PRODUCTION_DECODING if production else {})}
    tmp = Path(tempfile.mkdtemp(prefix="pgcdc-syncbench-"))
    found: dict = {"throughput": []}
    engine = " ".join(SyncProcess.engine_args) or "(sync's default engine)"
    print(f"pgcdc sync bench: {engine}, --trigger {trigger}, --master {master}, "
          f"{'production' if production else 'test'} decoding settings (load {load()})")  # fmt: skip
    if warm_up:
        print(f"each burst after a warm-up: {warm_up:,} inserts into bench_warm, applied")
    try:
        with servers.running_server("pg18", settings) as srv, srv.connect() as conn:
            conn.execute(TABLE)
            tables = "bench_t"
            if warm_up:  # published from the start: its snapshot is part of the first run's
                conn.execute("CREATE TABLE bench_warm (LIKE bench_t INCLUDING ALL)")
                tables += ", bench_warm"
            conn.execute(f"CREATE PUBLICATION {PUB} FOR TABLE {tables}")
            for r in range(repeat):
                found["throughput"].append(
                    throughput_round(
                        srv, conn, r, events, trigger, master, tmp, big_backlog, warm_up
                    )
                )
                print_throughput(found["throughput"])  # every round so far
            if seconds > 0:
                found["latency"] = latency(
                    srv, conn, rate, seconds, tx_rows, update_window, trigger, master, tmp
                )
                print_latency(found["latency"], rate, trigger, update_window)
            if wal_minutes > 0:
                found["wal"] = retained_wal(srv, conn, wal_minutes, trigger, master, tmp)
                print_wal(found["wal"], wal_minutes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sync_bench")
    p.add_argument("--events", type=int, default=EVENTS, help="throughput workload's inserts")
    p.add_argument("--repeat", type=int, default=2, help="throughput rounds (0: skip)")
    p.add_argument("--rate", type=int, default=5000, help="latency: changes offered per second")
    p.add_argument("--seconds", type=float, default=60.0, help="latency: how long (0: skip)")
    p.add_argument("--tx-rows", type=int, default=50, help="latency: changes per transaction")
    p.add_argument("--update-window", type=int, default=0,
                   help="latency: updates go to the last N rows inserted (0: any earlier row)")  # fmt: skip
    p.add_argument("--wal-minutes", type=float, default=2.0,
                   help="retained WAL: minutes without and with heartbeats (0: skip)")  # fmt: skip
    p.add_argument(
        "--big-backlog",
        type=int,
        default=BIG_BACKLOG,
        help="once: a backlog of this many inserts, after round 1's (0: skip)",
    )
    p.add_argument("--trigger", default="1s", help="pgcdc sync --trigger")
    p.add_argument("--master", default="local[2]", help="pgcdc sync --master")
    p.add_argument("--test-decoding", action="store_true",
                   help="the test harness's decoding settings (every change spilled) rather "
                   "than production ones")  # fmt: skip
    p.add_argument("--engine", default="streaming", choices=("streaming", "loop"),
                   help="pgcdc sync --engine")  # fmt: skip
    p.add_argument("--warm-up", type=int, default=0, metavar="ROWS",
                   help="throughput: before each burst, this many inserts into another published "
                   "table, applied (a sync that has run a while; 0: the burst right after ready)")  # fmt: skip
    args = p.parse_args(argv)
    SyncProcess.engine_args = ("--engine", args.engine)
    run(args.events, args.repeat, rate=args.rate, seconds=args.seconds, tx_rows=args.tx_rows,
        update_window=args.update_window, wal_minutes=args.wal_minutes, trigger=args.trigger, master=args.master,
        production=not args.test_decoding, big_backlog=args.big_backlog, warm_up=args.warm_up)  # fmt: skip


if __name__ == "__main__":
    main()
