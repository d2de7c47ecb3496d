"""The kill/restart matrix of ``pgcdc sync`` against real PostgreSQL servers.

Per server (a throwaway one of the test harness): tables ``t`` and ``t2`` with rows before the
slot exists, publication ``pub`` with both, and a writer thread doing small transactions of
inserts, updates and deletes on both all along. Steps, in order:

1. start: sync from empty (snapshot, capture, apply) while the writes run;
2. kill: SIGKILL the sync driver, 3 s of writes while it is down, rerun;
3. pg-restart: PostgreSQL stopped and started again under the running sync;
4. kill+pg-restart: SIGKILL the driver, restart PostgreSQL while it is down, rerun;
5. sigterm: SIGTERM (exit 0 expected), rerun;
6. resync: SIGTERM, the slot invalidated while sync is down, rerun with
   ``--on-invalid-slot resync`` (a new slot and snapshot);
then steps 2-5 again ``--rounds`` times (default 1: on the resync's new slot), and a last
SIGTERM (exit 0 expected).

After each step the writer pauses (a quiet point) and every published table's Delta rows
must equal the server's rows within 90 s (with ``--scd 2``: its current versions; and at the
end, the history holds each change once, versions of a key never overlapping). Printed per step: "ready s" from a (re)start of sync
to its ``ready`` line, "conv s" from the quiet point to equal tables, the rows compared (all
tables). A failed step ends that server's matrix; the exit status is 1 if any step failed.

    python -m bench.sync_matrix [--servers pg15,pg18] [--rounds N] [--scd 2]

Run it from the repository root with the project's virtualenv (it uses the test helpers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from tests.postgres import servers

from .cpu import stat_fields
from tests.postgres.slots import invalidate_slot
from tests.support.sync import Sync  # noqa: E402
from tests.support.sync_restart import _restart  # noqa: E402

CONVERGE_TIMEOUT = 90.0
READY_TIMEOUT = 180.0
WRITES_S = 3.0  # seconds of writes between the events of a step
FIRST_ID = 1_000_000  # the writer's ids start here
ENGINE: list[str] = []  # --engine: every sync of the run (none: sync's default)

SETUP = [
    "CREATE TABLE t (id int PRIMARY KEY, v text)",
    "INSERT INTO t SELECT g, 'a' || g FROM generate_series(1, 2000) g",
    "CREATE TABLE t2 (id bigint PRIMARY KEY, n numeric, ts timestamptz, s text)",
    "INSERT INTO t2 SELECT g, CASE WHEN g % 5 = 0 THEN g / 7.0 WHEN g % 13 = 0 THEN NULL "
    "ELSE g * 1.25 END, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1.5 minute', "
    "CASE WHEN g % 10 = 0 THEN NULL ELSE 's' || g END FROM generate_series(1, 1000) g",
    "UPDATE t2 SET n = n + 0.001, s = s || '!' WHERE id % 3 = 0",
    "DELETE FROM t2 WHERE id % 17 = 0",
    "CREATE PUBLICATION pub FOR TABLE t, t2",
]


class StepFailed(Exception):
    pass


class Writer(threading.Thread):
    """Small transactions on t and t2 on its own connection, reconnecting after errors (a
    server restart); :meth:`pause` returns once no transaction is in flight."""

    def __init__(self, srv):
        super().__init__(daemon=True)
        self.srv = srv
        self.go = threading.Event()
        self.go.set()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.next_id = FIRST_ID
        self.commits = self.errors = 0
        self.rng = random.Random(7)

    def run(self) -> None:
        conn = None
        while not self.done.is_set():
            try:
                conn = conn or self.srv.connect()
                with self.lock:
                    if self.go.is_set():
                        self._transaction(conn)
                        self.commits += 1
                time.sleep(0.03)
            except psycopg.Error:
                self.errors += 1
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
                time.sleep(0.3)
        if conn is not None:
            conn.close()

    def _victim(self) -> int:
        r = self.rng
        return r.randrange(1, 2001) if r.random() < 0.5 else r.randrange(FIRST_ID, self.next_id)

    def _transaction(self, conn) -> None:
        i = self.next_id
        self.next_id += 4  # never reused, even if this transaction's fate is unknown
        with conn.transaction():
            conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(%s::int, "
                         "%s::int) g", [i, i + 3])  # fmt: skip
            conn.execute("UPDATE t SET v = v || '+' WHERE id = %s", [self._victim()])
            conn.execute("DELETE FROM t WHERE id = %s", [self._victim()])
            conn.execute("INSERT INTO t2 VALUES (%s, %s / 3.0, now(), 'w'), (%s, NULL, NULL, "
                         "NULL)", [i, i, i + 1])  # fmt: skip
            conn.execute("UPDATE t2 SET n = n + 0.5, ts = now(), s = coalesce(s, '') || 'u' "
                         "WHERE id = %s", [self._victim()])  # fmt: skip
            conn.execute("DELETE FROM t2 WHERE id = %s", [self._victim()])

    def pause(self) -> None:
        self.go.clear()
        with self.lock:
            pass

    def resume(self) -> None:
        self.go.set()


def _norm(v):
    # unconstrained numeric is PostgreSQL's text in the Delta table
    return format(v, "f") if isinstance(v, Decimal) else v


def server_tables(conn) -> dict[str, tuple[list[str], list[tuple]]]:
    """Every published table's rows as the server has them, sorted by the first column."""
    pubs = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                        "WHERE pubname = 'pub' ORDER BY 1, 2").fetchall()  # fmt: skip
    out = {}
    for schema, table in pubs:
        cur = conn.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema),
                                                                 sql.Identifier(table)))  # fmt: skip
        names = [d.name for d in cur.description]
        rows = sorted((tuple(map(_norm, r)) for r in cur.fetchall()), key=lambda r: r[0])
        out[f"{schema}.{table}"] = (names, rows)
    return out


def delta_rows(out: Path, name: str, columns: list[str], scd: int = 1) -> list[tuple] | None:
    """The table's rows (with ``scd`` 2: its current versions) in ``columns``, by key."""
    path = out / name
    if not (path / "_delta_log").is_dir():
        return None
    t = DeltaTable(str(path)).to_pyarrow_table()
    if scd == 2:
        t = t.filter(t.column("_is_current"))
    cols = [t.column(c).to_pylist() for c in columns]
    return sorted((tuple(map(_norm, r)) for r in zip(*cols)), key=lambda r: r[0])


def history_faults(out: Path, name: str) -> list[str]:
    """What is wrong with an SCD2 table's history: a key with two versions from one change
    (a change applied twice), with more than one current version, or whose versions
    overlap (one valid past the next one's start)."""
    import collections

    t = DeltaTable(str(out / name)).to_pyarrow_table()
    versions = collections.defaultdict(list)
    for r in t.select(["id", "_valid_from_lsn", "_tx_ordinal", "_valid_to_lsn",
                       "_is_current"]).to_pylist():  # fmt: skip
        versions[r["id"]].append(r)
    faults = []
    for key, vs in versions.items():
        vs.sort(key=lambda r: (r["_valid_from_lsn"], r["_tx_ordinal"]))
        starts = [(r["_valid_from_lsn"], r["_tx_ordinal"]) for r in vs]
        if len(set(starts)) != len(starts):
            faults.append(f"{name} id {key}: two versions from one change")
        if sum(r["_is_current"] for r in vs) > 1:
            faults.append(f"{name} id {key}: more than one current version")
        for a, b in zip(vs, vs[1:]):
            if a["_valid_to_lsn"] is None or a["_valid_to_lsn"] > b["_valid_from_lsn"]:
                faults.append(f"{name} id {key}: versions overlap")
    return faults


def _diff(want: list[tuple], got: list[tuple] | None) -> str:
    if got is None:
        return "no Delta table"
    w, g = {r[0]: r for r in want}, {r[0]: r for r in got}
    missing = sorted(w.keys() - g.keys())
    extra = sorted(g.keys() - w.keys())
    changed = sorted(k for k in w.keys() & g.keys() if w[k] != g[k])
    parts = [f"{len(got)} rows, want {len(want)}"]
    for what, keys in (("missing", missing), ("extra", extra), ("different", changed)):
        if keys:
            parts.append(f"{what} {len(keys)} (e.g. {keys[:5]})")
    if changed:
        k = changed[0]
        parts.append(f"id {k}: server {w[k]} vs delta {g[k]}")
    return "; ".join(parts)


def _indent(text: str, lines: int) -> str:
    return "\n".join("      " + line for line in text.strip().splitlines()[-lines:])


def alive(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(pid: int) -> list[int]:
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (fields := stat_fields(int(d.name))) is not None:
            parent[int(d.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        kids = [c for c, p in parent.items() if p == pid]
        found += kids
        todo += kids
    return found


@dataclass
class Row:
    step: str
    action: str
    ready: float | None = None
    converge: float | None = None
    rows: int | None = None
    ok: bool = False
    note: str = ""


class Matrix:
    def __init__(self, srv, conn, out: Path, scd: int = 1):
        self.srv, self.conn, self.out, self.scd = srv, conn, out, scd
        self.writer = Writer(srv)
        self.sync: Sync | None = None
        self.ready: float | None = None
        self.notes: list[str] = []
        self.leftovers: list[int] = []

    def start_sync(self, *extra: str) -> None:
        self.sync = Sync(self.srv, self.out, "--scd", str(self.scd), *ENGINE, *extra)
        self.sync.wait_for("ready", READY_TIMEOUT)
        self.ready = time.monotonic() - self.sync.started
        for snap in self.sync.named("snapshot"):
            self.notes.append(f"snapshot: {snap.get('message')}")

    def restart_server(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = _restart(self.srv)

    def check_alive(self) -> None:
        if self.sync.proc.poll() is not None:
            raise StepFailed(f"sync exited with {self.sync.proc.returncode}")

    def kill(self) -> None:
        kids = descendants(self.sync.proc.pid)
        code = self.sync.stop(signal.SIGKILL)
        if code != -signal.SIGKILL:
            raise StepFailed(f"SIGKILL: exit {code}")
        deadline = time.monotonic() + 30
        while any(map(alive, kids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in kids if alive(p)]
        if left:
            self.leftovers += left
            raise StepFailed(f"{len(left)} of the killed driver's processes outlived it by 30 s")
        self.notes.append(f"{len(kids)} child process(es) gone")

    def sigterm(self) -> None:
        code = self.sync.stop(signal.SIGTERM, timeout=120)
        if code != 0 or not self.sync.named("stopped"):
            raise StepFailed(
                f"SIGTERM: exit {code}, stopped line: {bool(self.sync.named('stopped'))}"
            )

    def converge(self) -> tuple[float, int]:
        """Pause the writer, wait for every published table to equal the server's."""
        self.writer.pause()
        try:
            want = server_tables(self.conn)
            t0 = time.monotonic()
            err = ""
            while True:
                got = {}
                try:
                    got = {n: delta_rows(self.out, n, c, self.scd) for n, (c, _r) in want.items()}
                except Exception as e:  # a file vacuumed under the reader: read again
                    err = f"{type(e).__name__}: {e}"
                if got and all(got[n] == r for n, (_c, r) in want.items()):
                    return time.monotonic() - t0, sum(len(r) for _c, r in want.values())
                if self.sync is not None and self.sync.proc.poll() is not None:
                    raise StepFailed(f"sync exited with {self.sync.proc.returncode}")
                if time.monotonic() - t0 > CONVERGE_TIMEOUT:
                    diffs = [f"{n}: {_diff(r, got.get(n))}" for n, (_c, r) in want.items()
                             if got.get(n) != r]  # fmt: skip
                    raise StepFailed(f"not equal in {CONVERGE_TIMEOUT:g}s: " + " | ".join(diffs)
                                     + (f" (last read error {err})" if err else ""))  # fmt: skip
                time.sleep(0.3)
        finally:
            self.writer.resume()

    # the steps: each does its events and returns; a quiet point follows

    def step_start(self) -> None:
        self.start_sync()
        time.sleep(WRITES_S)

    def step_kill(self) -> None:
        time.sleep(WRITES_S)
        self.kill()
        time.sleep(WRITES_S)
        self.start_sync()
        time.sleep(WRITES_S)

    def step_pg_restart(self) -> None:
        time.sleep(WRITES_S)
        self.restart_server()
        time.sleep(WRITES_S)
        self.check_alive()

    def step_kill_pg_restart(self) -> None:
        time.sleep(WRITES_S)
        self.kill()
        self.restart_server()
        time.sleep(WRITES_S)
        self.start_sync()
        time.sleep(WRITES_S)

    def step_sigterm(self) -> None:
        time.sleep(WRITES_S)
        self.sigterm()
        time.sleep(1)
        self.start_sync()
        time.sleep(WRITES_S)

    def step_resync(self) -> None:
        self.sigterm()
        time.sleep(WRITES_S)
        if not invalidate_slot(self.conn, "s"):
            raise StepFailed("the slot was not invalidated")
        time.sleep(WRITES_S)
        self.sync = Sync(self.srv, self.out, "--scd", str(self.scd), *ENGINE,
                         "--on-invalid-slot", "resync")  # fmt: skip
        resync = self.sync.wait_for("resync", READY_TIMEOUT)
        self.sync.wait_for("resync_done", READY_TIMEOUT)
        self.sync.wait_for("ready", READY_TIMEOUT)
        self.ready = time.monotonic() - self.sync.started
        self.notes.append(f"reason: {resync.get('reason')}")
        time.sleep(WRITES_S)

    def step_stop(self) -> None:
        self.writer.pause()
        self.writer.done.set()

    def run(self, rounds: int) -> list[Row]:
        again = [
            ("kill", "SIGKILL driver, 3 s of writes while down, rerun", self.step_kill),
            ("pg-restart", "PostgreSQL restarted under running sync", self.step_pg_restart),
            ("kill+pg-restart", "SIGKILL driver, PostgreSQL restarted while down, rerun",
             self.step_kill_pg_restart),
            ("sigterm", "SIGTERM (exit 0), rerun", self.step_sigterm),
        ]  # fmt: skip
        steps = [
            ("start", "from empty: snapshot + capture + apply", self.step_start),
            *again,
        ]  # fmt: skip
        # sync refuses to resync SCD2 tables: their history would miss the versions lost
        # with the slot
        if self.scd == 1:
            steps.append(("resync", "SIGTERM, slot invalidated while down, rerun with resync",
                          self.step_resync))  # fmt: skip
        for r in range(2, rounds + 2):
            steps += [(f"{name}#{r}", what, fn) for name, what, fn in again]
        steps.append(("stop", "writes stopped, quiet point, SIGTERM (exit 0)", self.step_stop))
        rows = []
        self.writer.start()
        for name, what, fn in steps:
            row = Row(name, what)
            rows.append(row)
            self.ready, self.notes = None, []
            try:
                fn()
                row.ready = self.ready
                row.converge, row.rows = self.converge()
                if name == "stop":
                    self.sigterm()
                    want = server_tables(self.conn)
                    if any(delta_rows(self.out, n, c, self.scd) != r for n, (c, r) in want.items()):
                        raise StepFailed("tables differ from the server's after SIGTERM")
                    if self.scd == 2:  # each change once in the history, across every step
                        faults = [f for n in want for f in history_faults(self.out, n)]
                        if faults:
                            raise StepFailed(f"{len(faults)} history fault(s): {faults[:5]}")
                        self.notes.append("SCD2 history: each change once, no overlap")
                row.ok = True
            except (Exception, pytest.fail.Exception) as e:
                self.notes.append(f"{type(e).__name__}: {e}")
                if self.sync is not None:
                    self.notes.append("sync log tail:\n" + _indent(self.sync.log(), 25))
                self.notes.append("server log tail:\n" + _indent(self.srv.log_tail(10), 10))
                break
            finally:
                row.note = "; ".join(self.notes)
        return rows

    def close(self) -> None:
        self.writer.done.set()
        self.writer.resume()
        self.writer.join(30)
        if self.sync is not None and self.sync.proc.poll() is None:
            self.sync.stop(signal.SIGKILL)
        for pid in self.leftovers:  # the killed driver's, by pid
            with contextlib.suppress(OSError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def run_server(key: str, rounds: int, scd: int = 1) -> tuple[list[Row], str]:
    t0 = time.monotonic()
    with servers.running_server(key) as srv, tempfile.TemporaryDirectory() as tmp:
        conn = srv.connect()
        for stmt in SETUP:
            conn.execute(stmt)
        m = Matrix(srv, conn, Path(tmp) / "sync", scd)
        try:
            rows = m.run(rounds)
        finally:
            m.close()
            m.conn.close()
        took = time.monotonic() - t0
        ok = sum(r.ok for r in rows)
        summary = (f"{key} (PostgreSQL {srv.version}): {ok}/{len(rows)} steps OK in {took:.0f} s; "
                   f"writer: {m.writer.commits} transactions committed, {m.writer.errors} "
                   "failed (server restarts)")  # fmt: skip
    return rows, summary


def print_table(key: str, rows: list[Row], summary: str) -> None:
    def num(v, f="{:.1f}"):
        return "-" if v is None else f.format(v)

    print(f"\n{key}")
    print(f"{'step':<18}{'what was done':<58}{'ready s':>8}{'conv s':>8}{'rows':>8}  result")
    for r in rows:
        print(f"{r.step:<18}{r.action:<58}{num(r.ready):>8}{num(r.converge):>8}"
              f"{num(r.rows, '{:,}'):>8}  {'OK' if r.ok else 'FAIL'}")  # fmt: skip
    for r in rows:
        if r.note:
            print(f"  {r.step}: {r.note}")
    print(summary)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sync_matrix")
    p.add_argument("--servers", default="pg15,pg18", help="comma-separated server keys")
    p.add_argument("--rounds", type=int, default=1, help="steps 2-5 again N times at the end")
    p.add_argument(
        "--scd",
        type=int,
        choices=(1, 2),
        default=1,
        help="pgcdc sync --scd (2: the tables' current versions are compared)",
    )
    p.add_argument("--engine", choices=("streaming", "loop"), default="streaming",
                   help="pgcdc sync --engine")  # fmt: skip
    args = p.parse_args(argv)
    ENGINE[:] = ["--engine", args.engine]
    failed = False
    t0 = time.monotonic()
    for key in args.servers.split(","):
        rows, summary = run_server(key, max(0, args.rounds), args.scd)
        print_table(key, rows, summary)
        failed |= not all(r.ok for r in rows)
    print(f"\nmatrix: {'FAIL' if failed else 'OK'} ({time.monotonic() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
