"""The pipeline of :mod:`pgcdc.sync`: set-up, the initial snapshot, the cycles of apply, the
tables' upkeep (checkpoints, vacuum, pruning) and the stop."""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from pgcdc.exits import BAD_DATA, INTERRUPTED, OK, USAGE
from pgcdc.spark.later import SessionLater, resolve, started
from pgcdc.sync import added, aside
from pgcdc.sync.added import ADDED, LOADED
from pgcdc.sync.child import CaptureProcess
from pgcdc.sync.pace import (
    CAPTURE_UP,
    CHILD_RESTARTS,
    EAGER_WAL,
    POLL,
    POLL_BURST,
    TABLES_CHECK_SECONDS,
)
from pgcdc.sync.records import NewRecords

CAPTURE = "_capture"
SNAPSHOT = "_snapshot"
LOCK = "_sync.lock"
APPLIED = "_applied.lsn"  # what the tables hold: the capture confirms the slot no further
# a cycle that leaves this many changes durable past what it applied starts the next at
# once, and so on while a cycle applies this many and leaves any (a burst, a rerun's backlog)
CATCH_UP_EVENTS = 10_000
# a caught-up cycle logs a running-transactions record when the slot's restart_lsn trails the
# WAL by this much (what a restart's walsender would decode again)
RESTART_LAG = 1 << 20
RESTART_RECHECK = 1.0  # seconds: an idle cycle after that sees whether the record took
# the capture commits (fsyncs) every this many records while data flows, besides every
# quarter trigger: a backlog's cycles start on its first 32,768 (2 MiB of narrow rows) rather
# than on what a quarter second brought (90,000 at a rerun's pace), and its last one is
# smaller. Records, not bytes: a cycle of fewer than CATCH_UP_EVENTS changes ends a burst's
# eager cycles, and 2 MiB of wide rows were 9,000 (its tail then waited for the trigger);
# 32,768 records hold 10,922 changes at least (a BEGIN and a COMMIT around each one)
COMMIT_RECORDS = 32_768
CHECKPOINT_EVERY = 100  # a Delta checkpoint every this many versions of a table
VACUUM_EVERY = 3600.0  # seconds between two vacuums of the tables at most (see vacuum_every)
LOG_RETENTION = 30 * 86400.0  # the log kept under --retain 0: Delta's logRetentionDuration
RETAIN_LEAST = 0.1  # hours: --retain's least but 0 (a reader of a version may take minutes)
# the tables' files rewritten over this many seconds make the rate the disk check projects
REWRITE_WINDOW = 3600.0
DISK_WARN_EVERY = 3600.0  # seconds between two warnings that the retention outgrows the disk
# seconds between two prunes of the applied capture segments: every cycle plans over the
# segments left (their transactions), so few are kept
PRUNE_EVERY = 60.0
# records per unit of a cycle's plan: a unit is read whole when it holds anything new, so
# small units keep a cycle's reading to what is new (and its run in the driver), however
# large the segment it is in
CYCLE_UNIT_RECORDS = 50_000
LOCK_PATIENCE = 60.0  # seconds to wait for a killed sync's capture to let go of DIR
SPARK_START_AFTER = 30.0  # seconds: a rerun's Spark session starts by then at the latest


class Stopper:
    """SIGINT/SIGTERM: the first asks to stop (``requested``; the capture is stopped at once,
    Spark's jobs are cancelled after ``grace`` seconds), the second cancels at once, the
    third raises KeyboardInterrupt. Nothing is raised in the handler before that: the main
    thread is usually inside a py4j socket read."""

    def __init__(self, grace: float):
        self.grace = grace
        self.count = 0
        self.event = threading.Event()
        self.spark = None
        self.on_stop = None  # called once, from the handler, on the first signal
        self._cancelling = False
        self._done = threading.Event()

    def handler(self, signum, frame) -> None:
        self.count += 1
        if self.count >= 3:
            raise KeyboardInterrupt
        self.event.set()
        if self.count == 1:
            if self.on_stop is not None:
                self.on_stop()
            self._cancel_after(self.grace)
        else:
            self._cancel_after(0)

    @property
    def requested(self) -> bool:
        return self.count > 0

    def _cancel_after(self, delay: float) -> None:
        def run():
            if self._done.wait(delay) or self.spark is None or not started(self.spark):
                return  # no session yet: no job to cancel
            self._cancelling = True
            try:
                self.spark.sparkContext.setLogLevel("OFF")
            except Exception:
                pass
            while not self._done.is_set():
                try:
                    self.spark.sparkContext.cancelAllJobs()
                except Exception:
                    pass
                self._done.wait(0.5)

        threading.Thread(target=run, name="pgcdc-sync-cancel", daemon=True).start()

    def finished(self) -> None:
        """Spark is no longer needed: no job is cancelled after this."""
        self._done.set()

    def install(self) -> dict:
        return {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}


class Sync:
    """One ``pgcdc sync`` run (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, log):
        self.args, self.log = args, log
        self.out = Path(args.out)
        self.capture_dir = self.out / CAPTURE
        self.snapshot_dir = self.out / SNAPSHOT
        self.added_dir = self.out / ADDED
        self.on_invalid = getattr(args, "on_invalid_slot", "fail")
        # how often the publication's tables are compared with the snapshot (--tables-check)
        self.tables_check = getattr(args, "tables_check", TABLES_CHECK_SECONDS)
        self.resync_reason: str | None = None  # the slot is lost: resync before the capture
        self.pubs = [x.strip() for x in args.publication.split(",") if x.strip()]
        self.spark = None
        self.conn = None  # a plain connection: the server's WAL position, the published tables
        self.stopper = Stopper(args.stop_timeout)
        self.capture: CaptureProcess | None = None
        self.warned_tables: set[str] = set()
        self.keys_warned: set[str] = set()  # key_changed said once a run
        self.columns_warned: set[str] = set()  # --scd 2: changed columns said (added.check)
        self.drift: dict = {}  # sync.columns: tables whose columns changed with no change since
        self.samples: collections.deque = collections.deque(maxlen=4096)  # (time, server WAL)
        self.cycles = 0
        self.rerun = False  # started on a directory in use: no snapshot, no resync first
        self.restart_points = True  # until the server refuses pg_log_standby_snapshot()
        self.next_restart_check = float("inf")  # an idle cycle's look at the restart point
        self.catch_up = False  # the next cycle at once: a backlog (CATCH_UP_EVENTS)
        self.burst = False  # the last cycle applied CATCH_UP_EVENTS or more
        self.next_vacuum = time.monotonic() + vacuum_every(args.retain)
        self.rewrites: collections.deque = collections.deque()  # (time, table, bytes removed)
        self.next_disk_warning = 0.0
        self.next_prune = time.monotonic() + PRUNE_EVERY
        self.metrics = None  # sync.metrics.SyncMetrics with --metrics
        self.metrics_server = None
        self.said_applied = 0  # the LSN last written to DIR/_applied.lsn
        self.adding = None  # sync.added.Adding: tables added later, snapshotted in a thread
        self.capture_failures = 0  # deaths in a row of the capture child (watch_capture)
        self.capture_restarted = 0.0  # when it was last started again
        self.aside = aside.SetAside(self.out)  # tables not applied until a snapshot

    # -- the server -------------------------------------------------------------------------

    def _connection(self):
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.args.dsn, autocommit=True, connect_timeout=10,
                                        application_name="pgcdc sync")  # fmt: skip
        return self.conn

    def _query(self, sql: str, params=()):
        """Rows of a query on the side connection, or None when the server cannot be asked
        (sync goes on: the capture has its own connection and retries)."""
        import psycopg

        try:
            return self._connection().execute(sql, params).fetchall()
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None

    def _slot(self) -> tuple | None:
        rows = self._query(
            "SELECT active, wal_status FROM pg_replication_slots WHERE slot_name = %s",
            [self.args.slot],
        )
        return rows[0] if rows else None

    # -- set-up -----------------------------------------------------------------------------

    def lock(self) -> int:
        """Lock DIR (flock on DIR/_sync.lock); waits for a killed sync's capture to stop."""
        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_PATIENCE
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise SetupError(
                        f"{self.out} is in use by another pgcdc sync (or the capture of one "
                        f"that was killed) for more than {LOCK_PATIENCE:g}s: stop it first"
                    ) from None
                if not said:
                    self.log.event("info", "waiting", f"{self.out} is in use (a sync, or the "
                                   "capture of one that was killed and is stopping): waiting")  # fmt: skip
                    said = True
                time.sleep(0.2)

    def plan(self) -> tuple[bool, int | None]:
        """(whether to take the snapshot, the capture's start LSN when it has no state yet).
        Raises SetupError for a directory and slot that do not go together."""
        from pgcdc.capture.segments import read_state
        from pgcdc.lsn import parse_lsn
        from pgcdc.sync import resync

        manifest = self.snapshot_dir / "_snapshot.json"
        applied = self._applied_doc()
        if applied is not None and applied.get("scd", self.args.scd) != self.args.scd:
            raise SetupError(f"{self.out} holds SCD{applied['scd']} tables; this run asks for "
                             f"--scd {self.args.scd} (use --scd {applied['scd']}, or another "
                             "--out)")  # fmt: skip
        marker = resync.under_way(self.out)
        if marker is not None:  # a resync killed before it finished: finished first
            if marker.get("slot") not in (None, self.args.slot):
                raise SetupError(f"{self.out} is being resynced from slot {marker['slot']!r}, "
                                 f"not {self.args.slot!r} (use --slot {marker['slot']})")  # fmt: skip
            self.resync_reason = marker.get("reason") or "a resync is under way"
            return False, None
        resync.tidy(self.out)
        state = read_state(self.capture_dir)
        if state is not None:
            if state.slot not in (None, self.args.slot):
                raise SetupError(f"{self.out} syncs slot {state.slot!r}, not "
                                 f"{self.args.slot!r} (use --slot {state.slot}, or another "
                                 "--out)")  # fmt: skip
            self._check_slot_alive()
            return False, None  # a resume: the capture knows where it is
        if manifest.exists():
            doc = json.loads(manifest.read_text())
            if doc.get("slot") != self.args.slot:
                raise SetupError(f"{self.snapshot_dir} is a snapshot of slot {doc.get('slot')!r}, "
                                 f"not {self.args.slot!r} (use --slot {doc.get('slot')}, or "
                                 "another --out)")  # fmt: skip
            self._check_slot_alive()
            return False, parse_lsn(doc["consistent_point"])
        if applied is not None and applied.get("tables"):
            raise SetupError(f"{self.out} holds tables but no capture of slot "
                             f"{self.args.slot!r} and no snapshot: not a directory pgcdc sync "
                             "made; use another --out")  # fmt: skip
        rows = self._query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                           [self.args.slot])  # fmt: skip
        if rows is None:
            self._connection()  # raises with the server's reason
        if rows and not self._own_unfinished_snapshot():
            drop = f"SELECT pg_drop_replication_slot('{self.args.slot}')"
            raise SetupError(
                f"slot {self.args.slot!r} exists, and {self.out} has neither its capture nor "
                f"its snapshot: the rows the slot's consistent point needs are not here. Either "
                f"sync into the directory that already syncs this slot (--out), or give a new "
                f"--slot to start {self.out} from a new snapshot, or drop the slot if nothing "
                f"else uses it ({drop}) and run again"
            )
        return True, None

    def _health(self):
        """The slot's :class:`pgcdc.capture.checks.SlotHealth`, None when the server cannot be
        asked."""
        import psycopg

        from pgcdc.capture.checks import slot_health

        try:
            conn = self._connection()
            return slot_health(lambda q: conn.execute(q).fetchall(), self.args.slot)
        except psycopg.Error:
            self.conn = None
            return None

    def _check_slot_alive(self) -> None:
        """Raises SetupError when the slot is gone or invalidated; with ``--on-invalid-slot
        resync``, says instead that a resync is to come first (``resync_reason``)."""
        health = self._health()
        if health is None:
            self._connection()  # cannot ask: raises with the server's reason
        if not health.exists or health.invalidated:
            if self.on_invalid != "resync":
                raise SetupError(self._slot_lost(health))
            self.resync_reason = self._lost_reason(health)

    def _lost_reason(self, health) -> str:
        if health.exists:
            return f"slot {self.args.slot} was invalidated ({health.reason})"
        return f"slot {self.args.slot} does not exist"

    def resync(self, reason: str) -> int:
        """A new slot and snapshot swapped into the tables (:mod:`pgcdc.sync.resync`); the
        capture's start LSN."""
        from pgcdc.sync.resync import resync

        return resync(self, reason)

    def _slot_lost(self, health) -> str:
        """One line: the slot is gone or invalidated, what is lost, what to do."""
        from pgcdc.lsn import parse_lsn
        from pgcdc.apply.state import applied_lsn

        where = applied_lsn(self.out)
        redo = (f"sync from a new snapshot: move {self.out} aside (or remove it), drop the slot "
                f"if it still exists, and run again (or use a new --slot and --out), or run "
                f"again with --on-invalid-slot resync, which does that in place")  # fmt: skip
        if health.exists:  # invalidated: the capture layer's line (reason, setting to raise)
            text = health.invalidation_message(str(self.out), parse_lsn(where) if where else None,
                                               position="applied position")  # fmt: skip
            return f"{text}; with pgcdc sync: {redo}"
        return (f"slot {self.args.slot} does not exist: the changes after "
                f"{where or 'its snapshot'} (what {self.out} is applied up to) are gone from "
                f"the server, so these tables cannot be brought up to date; {redo}")  # fmt: skip

    def _own_unfinished_snapshot(self) -> bool:
        """A sync killed while taking its snapshot left the slot it created and a progress
        file naming it: take_snapshot starts over (and drops that slot)."""
        try:
            doc = json.loads((self.snapshot_dir / "_snapshot.progress.json").read_text())
        except (OSError, ValueError):
            return False
        return doc.get("slot") == self.args.slot

    def _applied_doc(self) -> dict | None:
        try:
            return json.loads((self.out / "_pgcdc_state.json").read_text())
        except (OSError, ValueError):
            return None

    def take_snapshot(self, why: str | None = None) -> int:
        from pgcdc.snapshot.job import take_snapshot

        # a killed run's slot may still be active for a moment (its walsender going away)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            slot = self._slot()
            if slot is None or not slot[0]:
                break
            time.sleep(0.5)
        why = why or (f"slot {self.args.slot} is new: taking the initial snapshot of "
                      f"{','.join(self.pubs)} into {self.snapshot_dir}")  # fmt: skip
        self.log.event("info", "snapshot", why)
        t0 = time.monotonic()
        note = _LogHandler(self.log)
        logging.getLogger("pgcdc.snapshot.server").addHandler(note)
        try:
            result = take_snapshot(resolve(self.spark), self.args.dsn, self.args.slot, self.pubs,
                                   self.snapshot_dir, progress=self._snapshot_progress())  # fmt: skip
        finally:
            logging.getLogger("pgcdc.snapshot.server").removeHandler(note)
        took = time.monotonic() - t0
        from pgcdc.lsn import format_lsn

        self.log.event("info", "snapshot_done", f"snapshot of {len(result.tables)} table(s), "
                       f"{result.rows:,} rows at {format_lsn(result.consistent_point)} in "
                       f"{took:.1f}s", tables=result.tables,
                       consistent_point=format_lsn(result.consistent_point),
                       took_s=round(took, 2))  # fmt: skip
        return result.consistent_point

    def _snapshot_progress(self):
        """take_snapshot's progress: its own line on a terminal, else a log event per table
        done and every 10 s."""
        if self.log.tty and not self.log.json:
            return None
        last = [0.0]

        def report(d: dict) -> None:
            now = time.monotonic()
            if d.get("done") or now - last[0] >= 10:
                last[0] = now
                fields = {k: v for k, v in d.items() if k != "event"}
                text = (f"{d['table']}: {d['ranges_done']}/{d['ranges']} ranges, "
                        f"{d['rows']:,} rows")  # fmt: skip
                self.log.event("info", "snapshot_progress", text, **fields)

        return report

    def capture_config(self, start_lsn: int | None) -> dict:
        a = self.args
        # with --metrics the child serves on a port of its own that sync's endpoint reads
        child_metrics = None if self.metrics is None else self.metrics.child_address
        return dict(dsn=a.dsn, slot=a.slot, publications=self.pubs, out=str(self.capture_dir),
                    start_lsn=start_lsn, heartbeat=a.heartbeat, metrics=child_metrics,
                    failover=a.failover, fsync=not a.no_fsync,
                    flush_interval=max(0.1, min(1.0, a.trigger / 4)),
                    commit_records=COMMIT_RECORDS,
                    # the slot follows the tables, told four times a trigger (10 s at most):
                    # restart_lsn moves to a running-transactions record only once a confirm
                    # passes the one pending before it, and a record logged at a burst's
                    # start (a slot created, the bgwriter's) confirmed a trigger later left
                    # the checkpoint's after the burst unused: a rerun decoded the burst again
                    status_interval=max(0.25, min(10.0, a.trigger / 4)),
                    confirm_limit=str(self.out / APPLIED))  # fmt: skip

    def say_applied(self, lsn: int) -> None:
        """Write DIR/_applied.lsn: every change up to ``lsn`` is in the tables (committed),
        so the slot may be confirmed that far; the capture reads it at each status update.
        Not fsynced: after a crash an older position only keeps more WAL."""
        from pgcdc.lsn import format_lsn

        if lsn <= self.said_applied:
            return
        tmp = self.out / f".{APPLIED}.tmp"
        tmp.write_text(format_lsn(lsn) + "\n")
        os.replace(tmp, self.out / APPLIED)
        self.said_applied = lsn

    # -- the loop ---------------------------------------------------------------------------

    def consistent_point(self) -> int:
        from pgcdc.lsn import parse_lsn

        try:
            snap = json.loads((self.snapshot_dir / "_snapshot.json").read_text())
            return parse_lsn(snap["consistent_point"])
        except (OSError, ValueError, KeyError):
            return 0

    def snapshot_pending(self) -> bool:
        """The snapshot has tables apply has not loaded yet (but those set aside)."""
        try:
            snap = json.loads((self.snapshot_dir / "_snapshot.json").read_text())
        except (OSError, ValueError):
            return False
        doc = self._applied_doc() or {}
        loaded = set(doc.get("tables") or {}) | self.aside.names
        return bool(set(snap.get("tables") or {}) - loaded)

    def cycle(self, records: NewRecords, first: bool, until=None) -> None:
        """Apply what is durable in the capture, when there is something to apply; one line.
        ``until``: what was durable at an earlier point, applied no further (a Structured
        Streaming batch's end, :mod:`pgcdc.sync.query`; ``records`` looks no further)."""
        import functools

        from pgcdc.lsn import format_lsn, parse_lsn
        from pgcdc.apply.run import apply_changes
        from pgcdc.apply.state import applied_lsn
        from pgcdc.apply.driver import DRIVER_BYTES

        t0, wall0 = time.monotonic(), time.time()
        self.catch_up = self.burst = False
        wal = self._query("SELECT pg_current_wal_lsn()::text")
        if wal:
            self.samples.append((wall0, parse_lsn(wal[0][0])))
        floor_text = applied_lsn(self.out)
        floor = parse_lsn(floor_text) if floor_text else None
        events, worth, durable = records.look(floor, until=until)
        pending = self.snapshot_pending()
        self.last_covered = max(floor or 0, self.consistent_point())  # durable: once applied
        if durable is None and not pending:
            return  # nothing durable yet, nothing to load
        report = None
        if worth or pending or (first and self._applied_doc() is None):
            snapshot = str(self.snapshot_dir) if pending else None
            captures = [str(self.capture_dir)] if durable is not None else []
            # (maintain() cleans the log); a table at fault is set aside, the rest applied
            run = functools.partial(apply_changes, self.spark, captures, str(self.out),
                                    scd=self.args.scd, snapshot=snapshot,
                                    driver_bytes=DRIVER_BYTES, split_records=CYCLE_UNIT_RECORDS,
                                    until=until, log_cleanup=False)  # fmt: skip
            report = aside.apply(self, run, snapshot)
        covered = max(durable or 0, self.consistent_point())
        applied = applied_lsn(self.out)
        if applied:
            applied_at = parse_lsn(applied)
            covered = max(covered, applied_at)
            if report is not None:  # apply read on past what the look saw: count it too
                more, held = records.after_apply(floor, applied_at, until)
                events += more
                if held is not None:  # (the line says so: it stayed short of the end until
                    covered = max(covered, held)  # the next change, after a burst's end)
                    self._restart_point()
                self.burst = events >= CATCH_UP_EVENTS
                if applied_at > (floor or 0):  # (a transaction not yet whole waits too)
                    left = records.later[0]  # what it left: a backlog, or not
                    # on at once while there is more, until a cycle applies fewer than that
                    self.catch_up = left >= CATCH_UP_EVENTS or (
                        left > 0 and events >= CATCH_UP_EVENTS
                    )
        took = time.monotonic() - t0
        self.last_covered = covered
        self.say_applied(covered)
        lag_bytes = max(0, self.samples[-1][1] - covered) if wal else None
        seen = [t for t, lsn in self.samples if lsn <= covered]
        lag_s = round(time.time() - max(seen), 3) if seen else None
        m = self.metrics
        if m is not None:
            m.applied_lsn = covered
            if wal:
                m.lag_bytes, m.lag_seconds = lag_bytes, lag_s or 0
        if report is None:
            self.idle_upkeep()
            return  # nothing to apply: no line, the tables are current
        self.cycles += 1
        if m is not None:
            m.cycles, m.events = self.cycles, m.events + events
            m.cycle_seconds, m.last_cycle_time = took, time.time()
        tables = dict(sorted(report.items()))
        text = (f"cycle {self.cycles}: {events:,} events, {len(tables)} table(s) written, "
                f"applied up to {format_lsn(covered)}, lag "
                f"{'?' if lag_bytes is None else _human(lag_bytes)} / "
                f"{'?' if lag_s is None else f'{lag_s:.1f}s'}, took {took:.1f}s")  # fmt: skip
        self.log.event("info", "apply", text, cycle=self.cycles, events=events, tables=tables,
                       applied_lsn=format_lsn(covered), lag_bytes=lag_bytes, lag_s=lag_s,
                       took_s=round(took, 3))  # fmt: skip
        self.maintain(tables)

    def maintain(self, written) -> None:
        """Keep the tables cheap to read for months: a checkpoint every CHECKPOINT_EVERY
        versions (readers replay the log from the last one: one commit per cycle adds up),
        a vacuum of the files removed more than --retain hours ago and of the log before them
        every :func:`vacuum_every` (a cycle that changes keys everywhere rewrites the whole
        table; a cycle a second adds 86,400 commits a day, which delta-rs lists at each open),
        and a warning when that retention would outgrow the disk (:meth:`check_disk`).

        The log is cleaned here only: sync's commits turn off delta-rs's cleanup after each
        commit, which reads the whole log every time (0.45 s a commit at 86,400 commits).
        Under --retain 0 (no vacuum) the log keeps Delta's default log retention,
        LOG_RETENTION, as delta-rs's cleanup did."""
        from pgcdc.apply.vacuum import clean_log
        from pgcdc.apply.vacuum import vacuum as vacuum_table

        now = time.monotonic()
        doc = self._applied_doc() or {}
        entries = {n: (doc.get("tables") or {}).get(n) or {} for n in written}
        versions = {n: e.get("version") for n, e in entries.items()}
        for name, entry in entries.items():  # the cycle's commit of each table it wrote
            if entry.get("bytes_removed"):
                self.rewrites.append((now, name, entry["bytes_removed"]))
                if self.metrics is not None:
                    self.metrics.rewritten_bytes += entry["bytes_removed"]
        due = now >= self.next_vacuum
        vacuum = self.args.retain > 0 and due
        log_keep = self.args.retain * 3600 if self.args.retain > 0 else LOG_RETENTION
        self._prune_when_due()
        for name in sorted(doc.get("tables") or {}) if due else sorted(written):
            if name in self.aside.names:
                continue  # (its Delta table may be what is wrong with it)
            path = self.out / name
            try:
                version = versions.get(name)
                if version and version % CHECKPOINT_EVERY == 0:
                    from deltalake import DeltaTable

                    DeltaTable(str(path)).create_checkpoint()
                if due:
                    t0 = time.monotonic()
                    gone = vacuum_table(str(path), self.args.retain * 3600) if vacuum else []
                    logs = clean_log(str(path), log_keep)
                    if gone or logs:
                        took = time.monotonic() - t0
                        self.log.event("info", "vacuum", f"{name}: {len(gone)} data file(s) "
                                       f"and {logs} log file(s) no version of the last "
                                       f"{log_keep / 3600:g}h uses deleted in {took:.1f}s",
                                       table=name, files=len(gone), log_files=logs,
                                       took_s=round(took, 3))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - upkeep: the next cycle tries again
                self.log.event("warning", "maintain", f"{name}: {e}", table=name)
        if due:
            self.next_vacuum = time.monotonic() + vacuum_every(self.args.retain)

    def idle_upkeep_due(self) -> bool:
        """Whether :meth:`idle_upkeep` has something to do now."""
        now = time.monotonic()
        return now >= self.next_prune or now >= self.next_restart_check

    def idle_upkeep(self) -> None:
        """What a moment with nothing to apply does (the loop's idle cycle, the query's watch
        between batches): prune the applied segments when due, and look again a second after
        a burst's end whether the slot's restart point took (:meth:`_restart_point`)."""
        self._prune_when_due()
        if time.monotonic() >= self.next_restart_check:
            self._restart_point(again=True)  # did the last record take?

    def _prune_when_due(self) -> None:
        """Prune the applied segments and look at the disk, once a minute (and once a rerun
        has caught up): after a cycle, whether it applied anything or not."""
        if time.monotonic() >= self.next_prune:
            if not self.args.keep_segments:
                self.prune()
            self.check_disk()
            self.next_prune = time.monotonic() + PRUNE_EVERY

    def check_disk(self) -> None:
        """Warn (once an hour at most) when the files the cycles rewrite, kept for --retain
        (a day when never vacuumed), would take more than half the free space of DIR's disk:
        copy-on-write tables whose updates fall all over them keep a table's size per
        cycle."""
        import shutil

        now = time.monotonic()
        while self.rewrites and self.rewrites[0][0] < now - REWRITE_WINDOW:
            self.rewrites.popleft()
        if not self.rewrites or now < self.next_disk_warning:
            return
        span = now - self.rewrites[0][0]
        if span < PRUNE_EVERY:
            return  # too short to tell a rate
        per_table = collections.Counter()
        for _t, name, n in self.rewrites:
            per_table[name] += n
        rate = sum(per_table.values()) / span
        retain = self.args.retain * 3600
        kept = rate * (retain + vacuum_every(self.args.retain) if retain > 0 else 86400)
        try:
            free = shutil.disk_usage(self.out).free
        except OSError:
            return
        if kept <= free / 2:
            return
        self.next_disk_warning = now + DISK_WARN_EVERY
        top, top_bytes = per_table.most_common(1)[0]
        if retain > 0:
            held = f"kept for --retain {self.args.retain:g}h"
            fix = f"use a shorter --retain (down to {RETAIN_LEAST:g}) or a longer --trigger"
        else:
            held = "a day of it kept (--retain 0 never vacuums)"
            fix = f"give a --retain ({RETAIN_LEAST:g} at least) or a longer --trigger"
        self.log.event(
            "warning", "disk",
            f"cycles rewrite {_human(rate)}/s of table files ({top}: {_human(top_bytes / span)}/s; "
            f"updates all over a table rewrite it whole); {held}, that is about {_human(kept)} "
            f"on disk, and {self.out}'s disk has {_human(free)} free: {fix}",
            rewrite_bytes_per_s=round(rate), kept_bytes=round(kept), free_bytes=free, table=top,
        )  # fmt: skip

    def prune(self) -> None:
        """Delete the capture's segments every table has applied (pgcdc prune)."""
        from pgcdc.capture.prune import PruneError, applied_position, prune

        if self.adding is not None:
            return  # the load reads the captures from the added snapshot's point: kept
        try:
            plan = prune(self.capture_dir, applied_position(self.out, self.capture_dir))
        except (PruneError, OSError) as e:
            self.log.event("warning", "prune", f"capture segments not pruned: {e}")
            return
        if plan.delete:
            self.log.event("info", "prune", f"{len(plan.delete)} applied capture segment(s), "
                           f"{_human(plan.bytes)}, deleted", segments=len(plan.delete),
                           bytes=plan.bytes)  # fmt: skip
        self.drop_loaded_snapshots()

    def drop_loaded_snapshots(self) -> None:
        """Delete the rows of the snapshots every table has loaded (the initial one, those of
        tables added later): the Delta tables hold them now, and once the capture's segments
        after them are pruned they can rebuild nothing, while a snapshot is a copy of its
        tables (the whole database, for the initial one). Each keeps its ``_snapshot.json``
        (point, tables, keys, OIDs: what the checks read). ``--keep-segments`` keeps them
        whole (the snapshot and every segment rebuild the tables)."""
        import shutil

        if self.adding is not None:
            return  # (its load reads its snapshot)
        done = []
        if (self.snapshot_dir / "_snapshot.json").exists() and not self.snapshot_pending():
            done.append(self.snapshot_dir)
        added = sorted(self.added_dir.iterdir()) if self.added_dir.is_dir() else []
        done += [d for d in added if (d / LOADED).exists()]
        freed, tables = 0, []
        for d in done:
            for t in sorted(p for p in d.iterdir() if p.is_dir() and "." in p.name):
                freed += sum(f.stat().st_size for f in t.rglob("*") if f.is_file())
                shutil.rmtree(t)
                tables.append(t.name)
        if tables:
            self.log.event("info", "snapshot_pruned", f"the rows of {len(tables)} loaded "
                           f"snapshot table(s), {_human(freed)}, deleted: the Delta tables "
                           "hold them", tables=tables, bytes=freed)  # fmt: skip

    def run(self) -> int:
        from pgcdc.apply.driver import warm_up

        self.stopper.install()
        # DIR/_sync.lock, held by this process and (inherited) its capture child; the child
        # imports while this one plans (each 0.15 s), and is given its configuration once the
        # plan says where it starts, or closed unused
        # (sync's log: stderr as it was before Spark's start moves descriptor 2 a while)
        stderr = self.log.stream if hasattr(self.log, "jvm_sink") else None
        self.capture = CaptureProcess(self._child_log_format(), self.lock(), stderr=stderr)
        self.capture.spawn()
        self.stopper.on_stop = self.capture.stop
        snap, start_lsn = self.plan()
        self.aside.said(self)  # tables an earlier run set aside stay so
        rerun = self.rerun = not snap and self.resync_reason is None
        # a rerun's capture reads the slot's backlog and its cycles are applied in the driver
        # while Spark is not there: it starts (seconds of both cores) once the backlog is
        # applied, SPARK_START_AFTER seconds have passed, or a cycle needs it
        self.spark = SessionLater(self._start_spark, deferred=rerun)
        self.stopper.spark = self.spark
        if rerun:
            self._serve_metrics()
            self._start_capture(start_lsn)
            warm_up()  # after: its imports hold the GIL the capture's start needs (0.3 s)
            return self._live()
        warm_up()
        self.spark = self.spark.session()
        self.stopper.spark = self.spark
        if self.stopper.requested:
            self.log.event("info", "stopped", "stopped before anything was started")
            return INTERRUPTED if snap else OK
        steps = []  # what comes before the capture: (step, its name, what a rerun does)
        if snap:
            steps.append((self.take_snapshot, "the initial snapshot",
                          "nothing was synced (run again to start over)"))  # fmt: skip
        if self.resync_reason is not None:
            steps.append((lambda: self.resync(self.resync_reason), "the resync",
                          "run again to finish it"))  # fmt: skip
        for step, what, rerun in steps:
            try:
                start_lsn = step()
            except BaseException:
                if self.stopper.requested:
                    self.log.event("error", "interrupted", f"interrupted during {what}; {rerun}")
                    return INTERRUPTED
                raise
            if self.stopper.requested:
                self.log.event("info", "stopped", f"stopped after {what}")
                return OK
        self._serve_metrics()
        self._start_capture(start_lsn)
        return self._live()

    def _live(self) -> int:
        """The live path: a Structured Streaming query's batches (the default, ``--engine
        streaming``: :mod:`pgcdc.sync.query`), or the cycles of :meth:`_loop` (``--engine loop``)."""
        if getattr(self.args, "engine", "streaming") == "streaming":
            from pgcdc.sync.query import StreamingEngine

            return StreamingEngine(self).run()
        return self._loop()

    def _start_spark(self):
        from pgcdc.spark.session import apply_session, quiet_spark

        # the JVM's own log (Spark's errors, stack traces and all) goes to DIR/_sync.log
        session = apply_session(self.args.master, app_name="pgcdc-sync",
                                jvm_log=getattr(self.log, "jvm_sink", None))  # fmt: skip
        quiet_spark(session)
        return session

    def _serve_metrics(self) -> None:
        """--metrics: sync's endpoint (its own metrics and the capture child's)."""
        if self.args.metrics is None or self.metrics is not None:
            return
        from pgcdc.capture.metrics import serve
        from pgcdc.sync.endpoint import SyncMetrics, free_port

        self.metrics = SyncMetrics(self.args.slot, free_port())
        self.aside.publish(self)
        self.metrics_server = serve(self.metrics, self.args.metrics)
        host, port = self.metrics_server.address
        self.log.event("info", "metrics", f"metrics at http://{host}:{port}/metrics",
                       address=f"{host}:{port}")  # fmt: skip

    def _start_capture(self, start_lsn: int | None) -> None:
        from pgcdc.lsn import parse_lsn

        # first: its start and a rerun's backlog wait for nothing here
        self.capture.start(self.capture_config(start_lsn))
        # then DIR/_applied.lsn: until it is written the child reads the one before, never
        # ahead of the tables (it is written after their commits), so it confirms no further
        from pgcdc.apply.state import applied_lsn

        applied = applied_lsn(self.out)
        self.said_applied = 0  # a resync's new slot starts from its own point
        self.say_applied(max(parse_lsn(applied) if applied else 0, self.consistent_point()))

    def _child_log_format(self) -> str:
        return "json" if self.log.json else "text"

    def _loop(self) -> int:
        from pgcdc.lsn import format_lsn

        records = NewRecords(self.capture_dir)
        trigger = self.args.trigger
        next_check = loop_start = time.monotonic()
        first = True
        self.last_covered = 0
        code = None
        while True:
            start = time.monotonic()
            try:
                if isinstance(self.spark, SessionLater):
                    self.spark.check()  # a session that could not start: said at once
                self.cycle(records, first)
                added.finish(self)  # an added table's snapshot taken: loaded
                if first:
                    self.log.event("info", "ready", f"the tables in {self.out} are current up "
                                   f"to {format_lsn(self.last_covered)}; applying every "
                                   f"{trigger:g}s", applied_lsn=format_lsn(self.last_covered))  # fmt: skip
                if time.monotonic() >= next_check and not self.stopper.requested:
                    aside.serve(self)  # snapshots pgcdc resnapshot asked for
                    added.check(self)  # after a cycle: the tables are current meanwhile
                    next_check = time.monotonic() + self.tables_check
            except BaseException as e:
                if self.stopper.requested:
                    break  # cancelled: every table stays at its last commit
                return self._apply_failed(e)
            first = False
            self._start_spark_when_caught_up(loop_start)
            if self.stopper.requested:
                break
            what, status = self.watch_capture()
            if what == "resynced":
                records = NewRecords(self.capture_dir)
                continue
            if what == "restarted":
                continue
            if what == "exit":
                return status
            if what != "running":  # ended, or stopped during a resync
                code = status
                break
            self.wait_for_cycle(start)
            if self.stopper.requested:
                break
        self.stopper.finished()
        self.capture.stop()
        child = self.capture.wait(60)
        code = child if code is None else code
        if self.stopper.requested:
            self.log.event("info", "stopped", f"stopped; the tables are applied up to "
                           f"{format_lsn(self.last_covered)}",
                           applied_lsn=format_lsn(self.last_covered))  # fmt: skip
            return OK
        return self._capture_ended(code)

    def wait_for_cycle(self, start: float, also=None) -> None:
        """Until the next cycle is due, the last one having started at ``start``: at once for a
        backlog (a burst, a rerun), applied in cycles back to back as Spark's default trigger
        does; else once --trigger has passed, a burst's WAL is durable (:meth:`_durable_ahead`),
        an added table's snapshot is taken (loaded now), the capture ended, a stop came, or
        ``also()`` says so."""
        poll = POLL_BURST if self.burst or not self.cycles else POLL
        while not self.catch_up and not self.stopper.event.wait(poll):
            if time.monotonic() - start >= self.args.trigger or self.capture.poll() is not None:
                return
            if self._durable_ahead():
                return
            if self.adding is not None and not self.adding.running:
                return  # an added table's snapshot is taken: loaded now
            if also is not None and also():
                return

    def watch_capture(self, before_resync=None) -> tuple[str, int | None]:
        """What both engines do about the capture child between their cycles:

        - ``("running", None)``;
        - ``("resynced", None)``: its slot was lost (exit 2) and ``--on-invalid-slot resync``
          made a new one, swapped a new snapshot in and started a new capture
          (``before_resync()`` first: the query stops);
        - ``("restarted", None)``: it died and was started again after a back-off;
        - ``("ended", status)``: it ended with ``status`` (0: stopped; 2: a usage error or a
          lost slot; else it died CHILD_RESTARTS times in a row, each within CAPTURE_UP
          seconds of its start), or a stop came during the back-off: sync ends with it;
        - ``("exit", code)``: the resync failed, sync exits with ``code`` (said);
        - ``("stopped", None)``: a stop came during the resync (its marker stays: a rerun
          finishes it)."""
        child = self.capture.poll()
        if child is None:
            if self.capture_failures and time.monotonic() - self.capture_restarted >= CAPTURE_UP:
                self.capture_failures = 0  # the capture started again holds
            return "running", None
        lost = self._lost_now() if child == 2 and self.on_invalid == "resync" else None
        if lost is not None:
            if before_resync is not None:
                before_resync()
            self.adding = None  # its snapshot is of the lost slot's time: taken again
            try:  # the slot is lost: a new one, a new snapshot swapped in, then on
                self._start_capture(self.resync(lost))
            except BaseException as e:
                if self.stopper.requested:
                    return "stopped", None
                return "exit", self._apply_failed(e)
            return "resynced", None
        if child in (0, 2):
            return "ended", child
        self.capture_failures += 1
        failures = self.capture_failures
        if failures >= CHILD_RESTARTS or not self.restart_capture(child, failures):
            return "ended", child
        self.capture_restarted = time.monotonic()
        return "restarted", None

    def restart_capture(self, child: int, failures: int) -> bool:
        """The capture process died (``child``, its exit status, neither 0 nor 2): said, and
        started again after a back-off for the ``failures``-th time in a row; False when a
        stop came meanwhile."""
        self.log.event("warning", "capture_died", f"the capture process ended with {child}: "
                       "starting it again (it resumes from its durable position)")  # fmt: skip
        if self.stopper.event.wait(min(30, 2**failures)):
            return False
        self.capture.start()
        if self.metrics is not None:
            self.metrics.capture_restarts += 1
        return True

    def _restart_point(self, again: bool = False) -> None:
        """Caught up: when the slot's restart_lsn trails the server's WAL by RESTART_LAG or
        more, log a running-transactions record (``pg_log_standby_snapshot()``, PostgreSQL
        16+), which the capture's next confirms move restart_lsn to. The server logs one
        only every 15 s of activity (and at checkpoints), so a sync stopped within that of a
        burst's end had the next walsender decode the burst again from before its start (a
        slot created at its start logs one there: 0.2-0.3 s of a 200,000-change rerun).
        Refused (an older server, a role without the grant, a standby): once is enough.

        The server keeps one candidate restart point at a time: a record decoded while the one
        before it still waits for a confirm (one logged at the burst's start, when the burst
        was applied in a single cycle) is passed over. So an idle cycle a second later looks
        ``again``, once, and logs another if restart_lsn still trails (it may for good: a
        transaction left open holds the restart point where it began)."""
        import psycopg

        self.next_restart_check = float("inf")
        if not self.restart_points:
            return
        rows = self._query(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8"
            " FROM pg_replication_slots WHERE slot_name = %s",
            [self.args.slot],
        )
        if not rows or rows[0][0] is None or rows[0][0] < RESTART_LAG:
            return
        try:
            self._connection().execute("SELECT pg_log_standby_snapshot()")
            if not again:
                self.next_restart_check = time.monotonic() + RESTART_RECHECK
        except psycopg.Error as e:
            self.restart_points = False
            self.log.event("info", "restart_points", "the slot's restart point follows the "
                           "server's own running-transactions records (every 15 s of "
                           f"activity): {str(e).strip().splitlines()[0]}")  # fmt: skip

    def _durable_ahead(self) -> bool:
        """Whether the capture has made enough durable past what the last cycle read to start
        the next cycle before the trigger: EAGER_WAL of WAL, or anything after a cycle of
        CATCH_UP_EVENTS or more (a burst goes on, or its tail came) or before a rerun's first
        cycle. Small transactions of a steady flow wait for the trigger."""
        from pgcdc.capture.segments import CaptureDirError, read_state

        try:
            state = read_state(self.capture_dir)
        except CaptureDirError:
            return False  # the cycle says what is wrong with it
        if state is None:
            return False
        ahead = state.lsn - self.last_covered  # the last cycle's durable, applied or snapshot
        # a rerun's first cycle starts on the capture's first commit (of its backlog, or of
        # whatever came), its warm-up overlapping the rest of the read; the next ones as a
        # burst's do. Not a fresh sync's: a steady flow's cycles keep to the trigger
        first = self.rerun and not self.cycles
        return ahead >= EAGER_WAL or ((self.burst or first) and ahead > 0)

    def _start_spark_when_caught_up(self, loop_start: float) -> None:
        later = self.spark
        if not isinstance(later, SessionLater) or later.begun:
            return
        backlog_end = self.samples[0][1] if self.samples else 0  # the WAL when sync started
        if self.last_covered >= backlog_end or time.monotonic() - loop_start >= SPARK_START_AFTER:
            later.begin()
            # and prune now rather than a minute on: a sync restarted more often than that
            # (a crash loop, a scheduler's restarts) would otherwise never delete a segment
            self.next_prune = min(self.next_prune, time.monotonic())

    def _lost_now(self) -> str | None:
        """Why the slot is lost (gone or invalidated), or None (alive, or cannot be asked)."""
        health = self._health()
        if health is not None and (not health.exists or health.invalidated):
            return self._lost_reason(health)
        return None

    def _capture_ended(self, code: int | None) -> int:
        from pgcdc.lsn import format_lsn

        where = format_lsn(self.last_covered)
        if code == 0:
            self.log.event("info", "stopped", f"the capture stopped; applied up to {where}")
            return OK
        health = self._health()
        if health is not None and (not health.exists or health.invalidated):
            self.log.event("error", "slot_lost", self._slot_lost(health), slot=self.args.slot,
                           applied_lsn=where, reason=health.reason)  # fmt: skip
            return USAGE
        self.log.event("error", "capture_failed", f"the capture ended with exit status {code} "
                       f"(its reason is above); the tables are applied up to {where}",
                       exit_status=code)  # fmt: skip
        return USAGE if code == 2 else BAD_DATA

    def _apply_failed(self, e: BaseException) -> int:
        from pgcdc.capture.segments import CaptureDirError
        from pgcdc.capture.files import SourceError
        from pgcdc.apply.state import ApplyError, SourceMismatch
        from pgcdc.apply.delta import DeltaError

        self.stopper.finished()
        self.capture.stop()
        self.capture.wait(60)
        if isinstance(e, (CaptureDirError, SourceError, SourceMismatch)):
            self._say_failure(e)
            return USAGE
        if isinstance(e, (ApplyError, DeltaError, ValueError, OSError)):
            self._say_failure(e)
            return BAD_DATA
        raise e  # (pgcdc.cli.sync: one line, its traceback in DIR/_sync.log)

    def _say_failure(self, e: BaseException) -> None:
        """Apply's error in one line (its first), the whole of it in the log file."""
        from pgcdc.apply.delta import redact
        from pgcdc.sync.logfile import format_error

        text = redact(str(e)).strip()
        line = text.splitlines()[0] if text else type(e).__name__
        detail = getattr(self.log, "detail", None)
        if detail is not None:
            detail(f"apply failed:\n{format_error(e)}")
            if line != text:
                line += f"; {self.log.where()}"
        self.log.event("error", "apply", line)

    def close(self) -> None:
        self.stopper.finished()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.capture is not None:
            self.capture.stop()
            self.capture.wait(60)
        if self.spark is not None and getattr(self.spark, "begun", True):
            from pgcdc.spark.session import stop_quietly

            stop_quietly(self.spark)
        if self.conn is not None:
            self.conn.close()


class _LogHandler(logging.Handler):
    """The snapshot's notes (its logger's warnings) as the sync log's events."""

    def __init__(self, log):
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log.event("warning", "snapshot_note", record.getMessage())


class SetupError(Exception):
    """A directory, slot or option that does not go with the others (exit 2, one line)."""


def vacuum_every(retain_hours: float) -> float:
    """Seconds between two vacuums: hourly, or a quarter of a shorter retention (a minute at
    least), so files past the retention stay on disk a quarter of it at most; hourly under
    --retain 0 (the log's cleanup only)."""
    if retain_hours <= 0:
        return VACUUM_EVERY
    return min(VACUUM_EVERY, max(60.0, retain_hours * 3600 / 4))


def _human(n: float) -> str:
    from pgcdc.capture.runner import human_bytes

    return human_bytes(n)
