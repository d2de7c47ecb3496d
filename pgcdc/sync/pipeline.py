"""The pipeline of :mod:`pgcdc.sync`: set-up (the lock, the plan, the initial snapshot or the
resync), the capture process and the Spark session, and the run to its end. A cycle of apply
is :mod:`pgcdc.sync.cycle`'s, the tables' upkeep :mod:`pgcdc.sync.upkeep`'s, and the live path
is run by one of two engines: the driver's loop (:mod:`pgcdc.sync.loop`) or a Structured
Streaming query (:mod:`pgcdc.sync.query`, the default).

What the collaborators (:mod:`.added`, :mod:`.aside`, :mod:`.drift`, :mod:`.resync`, the
engines) use of a :class:`Sync` is its public side: ``config``, its directories (``out``,
``capture_dir``, ``snapshot_dir``, ``added_dir``), ``log``, ``spark``, ``stopper``, the side
connection (:meth:`Sync.connection`, :meth:`Sync.query`, :meth:`Sync.disconnect`), the
directory's state (:meth:`Sync.applied_doc`, :meth:`Sync.consistent_point`,
:meth:`Sync.snapshot_pending`), and the state they share (``adding``, ``aside``, ``drift``,
the ``*_warned`` sets)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
import time

import psycopg

from pgcdc.apply.driver import warm_up
from pgcdc.apply.state import applied_lsn
from pgcdc.spark.session import apply_session, quiet_spark, stop_quietly
from pgcdc.capture.checks import slot_health
from pgcdc.capture.metrics import serve
from pgcdc.capture.segments import CaptureDirError, read_state
from pgcdc.errors import DataError, Interrupted, SetupError
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.spark.later import SessionLater, resolve, started
from pgcdc.sync import aside, resync
from pgcdc.sync.added import ADDED
from pgcdc.sync.child import CaptureProcess
from pgcdc.sync.config import APPLIED, LOCK, STATE, SyncConfig
from pgcdc.sync.cycle import Cycle
from pgcdc.sync.endpoint import SyncMetrics, free_port
from pgcdc.sync.logfile import say_failure
from pgcdc.sync.loop import LoopEngine
from pgcdc.sync.pace import CAPTURE_UP, CHILD_RESTARTS
from pgcdc.sync.upkeep import Upkeep

__all__ = ["CaptureFailed", "CaptureRefused", "SlotLost", "Stopper", "Sync"]

# the capture commits (fsyncs) every this many records while data flows, besides every
# quarter trigger: a backlog's cycles start on its first 32,768 (2 MiB of narrow rows) rather
# than on what a quarter second brought (90,000 at a rerun's pace), and its last one is
# smaller. Records, not bytes: a cycle of fewer than CATCH_UP_EVENTS changes ends a burst's
# eager cycles, and 2 MiB of wide rows were 9,000 (its tail then waited for the trigger);
# 32,768 records hold 10,922 changes at least (a BEGIN and a COMMIT around each one)
COMMIT_RECORDS = 32_768
LOCK_PATIENCE = 60.0  # seconds to wait for a killed sync's capture to let go of DIR
SPARK_START_AFTER = 30.0  # seconds: a rerun's Spark session starts by then at the latest
SLOT_PATIENCE = 30.0  # seconds to wait for a killed run's slot to be let go before a snapshot


class SlotLost(SetupError):
    """The slot was invalidated or dropped while sync ran (``--on-invalid-slot fail``)."""


class CaptureRefused(SetupError):
    """The capture process ended refused (its exit 2: an option, the slot, the server)."""


class CaptureFailed(DataError):
    """The capture process failed, or died CHILD_RESTARTS times in a row."""


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
    """One ``pgcdc sync`` run (see :mod:`pgcdc.sync`): :meth:`run` returns once it has
    stopped cleanly (a signal, the capture's end, ``--once`` done) and raises otherwise
    (:mod:`pgcdc.errors`; what it has said already is :attr:`said`)."""

    def __init__(self, config: SyncConfig, log):
        self.config, self.log = config, log
        self.out = config.dir
        self.capture_dir = config.capture_dir
        self.snapshot_dir = config.snapshot_dir
        self.added_dir = self.out / ADDED
        self.pubs = config.pubs
        self.resync_reason: str | None = None  # the slot is lost: resync before the capture
        self.spark = None
        self.conn = None  # a plain connection: the server's WAL position, the published tables
        self.stopper = Stopper(config.stop_timeout)
        self.capture: CaptureProcess | None = None
        self.warned_tables: set[str] = set()
        self.keys_warned: set[str] = set()  # key_changed said once a run
        self.columns_warned: set[str] = set()  # --scd 2: changed columns said (added.check)
        self.drift: dict = {}  # sync.drift: tables whose columns changed with no change since
        self.rerun = False  # started on a directory in use: no snapshot, no resync first
        self.metrics = None  # sync.endpoint.SyncMetrics with --metrics
        self.metrics_server = None
        self.said_applied = 0  # the LSN last written to DIR/_applied.lsn
        self.adding = None  # sync.added.Adding: tables added later, snapshotted in a thread
        self.capture_failures = 0  # deaths in a row of the capture child (watch_capture)
        self.capture_restarted = 0.0  # when it was last started again
        self.once_lsn: int | None = None  # --once: the server's WAL position at the start
        self.aside = aside.SetAside(self.out)  # tables not applied until a snapshot
        self.cycle = Cycle(self)  # a cycle of apply, and when the next is due
        self.upkeep = Upkeep(self)  # checkpoints, vacuum, pruning, the slot's restart point
        self.said: BaseException | None = None  # the error the run ended with, said in its log

    @property
    def last_covered(self) -> int:
        """What the tables hold: the last cycle's durable, applied or snapshot position."""
        return self.cycle.last_covered

    # -- the server -------------------------------------------------------------------------

    def connection(self) -> psycopg.Connection:
        """The side connection (opened when needed): raises with the server's reason."""
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.config.dsn, autocommit=True, connect_timeout=10,
                                        application_name="pgcdc sync")  # fmt: skip
        return self.conn

    def disconnect(self) -> None:
        """Forget the side connection (the server went away): the next use opens another."""
        self.conn = None

    def query(self, sql: str, params=()):
        """Rows of a query on the side connection, or None when the server cannot be asked
        (sync goes on: the capture has its own connection and retries)."""
        try:
            return self.connection().execute(sql, params).fetchall()
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None

    def health(self):
        """The slot's :class:`pgcdc.capture.checks.SlotHealth`, None when the server cannot be
        asked."""
        try:
            conn = self.connection()
            return slot_health(lambda q: conn.execute(q).fetchall(), self.config.slot)
        except psycopg.Error:
            self.conn = None
            return None

    def _slot(self) -> tuple | None:
        rows = self.query(
            "SELECT active, wal_status FROM pg_replication_slots WHERE slot_name = %s",
            [self.config.slot],
        )
        return rows[0] if rows else None

    # -- the directory ----------------------------------------------------------------------

    def applied_doc(self) -> dict | None:
        """Apply's summary of the tables (``DIR/_pgcdc_state.json``), None before the first."""
        try:
            return json.loads((self.out / STATE).read_text())
        except (OSError, ValueError):
            return None

    def consistent_point(self) -> int:
        """The initial snapshot's consistent point (0: none)."""
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
        doc = self.applied_doc() or {}
        loaded = set(doc.get("tables") or {}) | self.aside.names
        return bool(set(snap.get("tables") or {}) - loaded)

    def say_applied(self, lsn: int) -> None:
        """Write DIR/_applied.lsn: every change up to ``lsn`` is in the tables (committed),
        so the slot may be confirmed that far; the capture reads it at each status update.
        Not fsynced: after a crash an older position only keeps more WAL."""
        if lsn <= self.said_applied:
            return
        tmp = self.out / f".{APPLIED}.tmp"
        tmp.write_text(format_lsn(lsn) + "\n")
        os.replace(tmp, self.out / APPLIED)
        self.said_applied = lsn

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
        manifest = self.snapshot_dir / "_snapshot.json"
        applied = self.applied_doc()
        if applied is not None and applied.get("scd", self.config.scd) != self.config.scd:
            raise SetupError(f"{self.out} holds SCD{applied['scd']} tables; this run asks for "
                             f"--scd {self.config.scd} (use --scd {applied['scd']}, or another "
                             "--out)")  # fmt: skip
        marker = resync.under_way(self.out)
        if marker is not None:  # a resync killed before it finished: finished first
            if marker.get("slot") not in (None, self.config.slot):
                raise SetupError(f"{self.out} is being resynced from slot {marker['slot']!r}, "
                                 f"not {self.config.slot!r} (use --slot {marker['slot']})")  # fmt: skip
            self.resync_reason = marker.get("reason") or "a resync is under way"
            return False, None
        resync.tidy(self.out)
        state = read_state(self.capture_dir)
        if state is not None:
            if state.slot not in (None, self.config.slot):
                raise SetupError(f"{self.out} syncs slot {state.slot!r}, not "
                                 f"{self.config.slot!r} (use --slot {state.slot}, or another "
                                 "--out)")  # fmt: skip
            self._check_slot_alive()
            return False, None  # a resume: the capture knows where it is
        if manifest.exists():
            doc = json.loads(manifest.read_text())
            if doc.get("slot") != self.config.slot:
                raise SetupError(f"{self.snapshot_dir} is a snapshot of slot {doc.get('slot')!r}, "
                                 f"not {self.config.slot!r} (use --slot {doc.get('slot')}, or "
                                 "another --out)")  # fmt: skip
            self._check_slot_alive()
            return False, parse_lsn(doc["consistent_point"])
        if applied is not None and applied.get("tables"):
            raise SetupError(f"{self.out} holds tables but no capture of slot "
                             f"{self.config.slot!r} and no snapshot: not a directory pgcdc sync "
                             "made; use another --out")  # fmt: skip
        rows = self.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                           [self.config.slot])  # fmt: skip
        if rows is None:
            self.connection()  # raises with the server's reason
        if rows and not self._own_unfinished_snapshot():
            drop = f"SELECT pg_drop_replication_slot('{self.config.slot}')"
            raise SetupError(
                f"slot {self.config.slot!r} exists, and {self.out} has neither its capture nor "
                f"its snapshot: the rows the slot's consistent point needs are not here. Either "
                f"sync into the directory that already syncs this slot (--out), or give a new "
                f"--slot to start {self.out} from a new snapshot, or drop the slot if nothing "
                f"else uses it ({drop}) and run again"
            )
        return True, None

    def _check_slot_alive(self) -> None:
        """Raises SetupError when the slot is gone or invalidated; with ``--on-invalid-slot
        resync``, says instead that a resync is to come first (``resync_reason``)."""
        health = self.health()
        if health is None:
            self.connection()  # cannot ask: raises with the server's reason
        if not health.exists or health.invalidated:
            if self.config.on_invalid_slot != "resync":
                raise SetupError(self._slot_lost(health))
            self.resync_reason = self._lost_reason(health)

    def resync(self, reason: str) -> int:
        """A new slot and snapshot swapped into the tables (:mod:`pgcdc.sync.resync`); the
        capture's start LSN."""
        return resync.resync(self, reason)

    def _lost_reason(self, health) -> str:
        if health.exists:
            return f"slot {self.config.slot} was invalidated ({health.reason})"
        return f"slot {self.config.slot} does not exist"

    def _slot_lost(self, health) -> str:
        """One line: the slot is gone or invalidated, what is lost, what to do."""

        where = applied_lsn(self.out)
        redo = (f"sync from a new snapshot: move {self.out} aside (or remove it), drop the slot "
                f"if it still exists, and run again (or use a new --slot and --out), or run "
                f"again with --on-invalid-slot resync, which does that in place")  # fmt: skip
        if health.exists:  # invalidated: the capture layer's line (reason, setting to raise)
            text = health.invalidation_message(str(self.out), parse_lsn(where) if where else None,
                                               position="applied position")  # fmt: skip
            return f"{text}; with pgcdc sync: {redo}"
        return (f"slot {self.config.slot} does not exist: the changes after "
                f"{where or 'its snapshot'} (what {self.out} is applied up to) are gone from "
                f"the server, so these tables cannot be brought up to date; {redo}")  # fmt: skip

    def _own_unfinished_snapshot(self) -> bool:
        """A sync killed while taking its snapshot left the slot it created and a progress
        file naming it: take_snapshot starts over (and drops that slot)."""
        try:
            doc = json.loads((self.snapshot_dir / "_snapshot.progress.json").read_text())
        except (OSError, ValueError):
            return False
        return doc.get("slot") == self.config.slot

    def take_snapshot(self, why: str | None = None) -> int:
        """Take the initial snapshot (creating the slot, aligned with it) into
        DIR/_snapshot, saying ``why``; its consistent point."""
        from pgcdc.snapshot.job import take_snapshot  # lazy: pyspark

        # a killed run's slot may still be active for a moment (its walsender going away)
        deadline = time.monotonic() + SLOT_PATIENCE
        while time.monotonic() < deadline:
            slot = self._slot()
            if slot is None or not slot[0]:
                break
            time.sleep(0.5)
        why = why or (f"slot {self.config.slot} is new: taking the initial snapshot of "
                      f"{','.join(self.pubs)} into {self.snapshot_dir}")  # fmt: skip
        self.log.event("info", "snapshot", why)
        t0 = time.monotonic()
        note = _LogHandler(self.log)
        logging.getLogger("pgcdc.snapshot.server").addHandler(note)
        try:
            result = take_snapshot(resolve(self.spark), self.config.dsn, self.config.slot, self.pubs,
                                   self.snapshot_dir, progress=self._snapshot_progress())  # fmt: skip
        finally:
            logging.getLogger("pgcdc.snapshot.server").removeHandler(note)
        took = time.monotonic() - t0
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
        a = self.config
        # with --metrics the child serves on a port of its own that sync's endpoint reads
        child_metrics = None if self.metrics is None else self.metrics.child_address
        return dict(dsn=a.dsn, slot=a.slot, publications=self.pubs, out=str(self.capture_dir),
                    start_lsn=start_lsn, heartbeat=a.heartbeat, metrics=child_metrics,
                    failover=a.failover, fsync=a.fsync,
                    flush_interval=max(0.1, min(1.0, a.trigger / 4)),
                    commit_records=COMMIT_RECORDS,
                    # the slot follows the tables, told four times a trigger (10 s at most):
                    # restart_lsn moves to a running-transactions record only once a confirm
                    # passes the one pending before it, and a record logged at a burst's
                    # start (a slot created, the bgwriter's) confirmed a trigger later left
                    # the checkpoint's after the burst unused: a rerun decoded the burst again
                    status_interval=max(0.25, min(10.0, a.trigger / 4)),
                    confirm_limit=str(self.out / APPLIED),
                    # --once: the capture stops at the first boundary past the WAL position
                    # read at the start (the last cycle then applies up to it)
                    until_lsn=self.once_lsn)  # fmt: skip

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> None:
        """Set up, then the live path until a stop, the capture's end or (``--once``) the
        tables hold the server's WAL position at the start. Raises what ended it otherwise:
        SetupError (a directory or slot that does not fit, the slot lost, the capture
        refused), DataError, Interrupted (a stop before the first snapshot or the resync was
        done), or what it has no answer for."""
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
        if self.config.once:
            wal = self.query("SELECT pg_current_wal_lsn()::text")
            if wal is None:
                self.connection()  # raises with the server's reason
            self.once_lsn = parse_lsn(wal[0][0])
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
            if snap:
                self._said(Interrupted("stopped before the initial snapshot"))
            return
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
                    text = f"interrupted during {what}; {rerun}"
                    self.log.event("error", "interrupted", text)
                    self._said(Interrupted(text))
                raise
            if self.stopper.requested:
                self.log.event("info", "stopped", f"stopped after {what}")
                return
        self._serve_metrics()
        self._start_capture(start_lsn)
        return self._live()

    def _live(self) -> None:
        """The live path: a Structured Streaming query's batches (the default, ``--engine
        streaming``: :mod:`pgcdc.sync.query`), or the driver's cycles (``--engine loop``,
        ``--once``: :mod:`pgcdc.sync.loop`)."""
        if self.config.loop:
            return LoopEngine(self).run()
        from pgcdc.sync.query import StreamingEngine  # lazy: pyspark

        return StreamingEngine(self).run()

    def _start_spark(self):
        # the JVM's own log (Spark's errors, stack traces and all) goes to DIR/_sync.log
        session = apply_session(self.config.master, app_name="pgcdc-sync",
                                jvm_log=getattr(self.log, "jvm_sink", None))  # fmt: skip
        quiet_spark(session)
        return session

    def _serve_metrics(self) -> None:
        """--metrics: sync's endpoint (its own metrics and the capture child's)."""
        if self.config.metrics is None or self.metrics is not None:
            return
        self.metrics = SyncMetrics(self.config.slot, free_port())
        self.aside.publish(self)
        self.metrics_server = serve(self.metrics, self.config.metrics)
        host, port = self.metrics_server.address
        self.log.event("info", "metrics", f"metrics at http://{host}:{port}/metrics",
                       address=f"{host}:{port}")  # fmt: skip

    def _start_capture(self, start_lsn: int | None) -> None:
        # first: its start and a rerun's backlog wait for nothing here
        self.capture.start(self.capture_config(start_lsn))
        # then DIR/_applied.lsn: until it is written the child reads the one before, never
        # ahead of the tables (it is written after their commits), so it confirms no further
        applied = applied_lsn(self.out)
        self.said_applied = 0  # a resync's new slot starts from its own point
        self.say_applied(max(parse_lsn(applied) if applied else 0, self.consistent_point()))

    def _child_log_format(self) -> str:
        return "json" if self.log.json else "text"

    # -- between the cycles, for both engines -----------------------------------------------

    def start_spark_when_caught_up(self, loop_start: float) -> None:
        """A rerun's deferred Spark session: started once its backlog is applied, or
        SPARK_START_AFTER seconds after ``loop_start`` (with ``--once``, only by a cycle
        that needs it)."""
        later = self.spark
        if not isinstance(later, SessionLater) or later.begun or self.config.once:
            return  # (--once: a cycle that needs Spark starts it; a caught-up run ends)
        samples = self.cycle.samples
        backlog_end = samples[0][1] if samples else 0  # the WAL when sync started
        if self.last_covered >= backlog_end or time.monotonic() - loop_start >= SPARK_START_AFTER:
            later.begin()
            # and prune now rather than a minute on: a sync restarted more often than that
            # (a crash loop, a scheduler's restarts) would otherwise never delete a segment
            self.upkeep.next_prune = min(self.upkeep.next_prune, time.monotonic())

    def watch_capture(self, resynced=None) -> tuple[str, int | None]:
        """What both engines do about the capture child between their cycles:

        - ``("running", None)``: it runs; on with the next cycle when it is due;
        - ``("again", None)``: the next cycle now: the child died and was started again after
          a back-off, or its slot was lost (exit 2) and ``--on-invalid-slot resync`` made a
          new one, swapped a new snapshot in and started a new capture (``resynced(True)``
          before, the engine lets go of the old capture directory; ``resynced(False)`` after,
          it reads the new one);
        - ``("ended", status)``: it ended with ``status`` (0: stopped; 2: a usage error or a
          lost slot; else it died CHILD_RESTARTS times in a row, each within CAPTURE_UP
          seconds of its start), or a stop came during the back-off or the resync (None; a
          resync's marker stays: a rerun finishes it): the engine ends (:meth:`end`).

        A resync that fails raises (said: :meth:`fail`)."""
        child = self.capture.poll()
        if child is None:
            if self.capture_failures and time.monotonic() - self.capture_restarted >= CAPTURE_UP:
                self.capture_failures = 0  # the capture started again holds
            return "running", None
        resync_on = child == 2 and self.config.on_invalid_slot == "resync"
        lost = self._lost_now() if resync_on else None
        if lost is not None:
            if resynced is not None:
                resynced(True)
            self.adding = None  # its snapshot is of the lost slot's time: taken again
            try:  # the slot is lost: a new one, a new snapshot swapped in, then on
                self._start_capture(self.resync(lost))
            except BaseException as e:
                if self.stopper.requested:
                    return "ended", None
                self.fail(e)
                raise
            if resynced is not None:
                resynced(False)
            return "again", None
        if child in (0, 2):
            return "ended", child
        self.capture_failures += 1
        failures = self.capture_failures
        if failures >= CHILD_RESTARTS or not self._restart_capture(child, failures):
            return "ended", child
        self.capture_restarted = time.monotonic()
        return "again", None

    def _restart_capture(self, child: int, failures: int) -> bool:
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

    def _lost_now(self) -> str | None:
        """Why the slot is lost (gone or invalidated), or None (alive, or cannot be asked)."""
        health = self.health()
        if health is not None and (not health.exists or health.invalidated):
            return self._lost_reason(health)
        return None

    def end(self, code: int | None) -> None:
        """The live path's end, for both engines: the capture stopped and waited for, then
        said; ``code``: the capture's exit status when it ended first (else its own). Returns
        for a stop, a capture stopped cleanly, ``--once`` done; raises SlotLost,
        CaptureRefused or CaptureFailed (said)."""
        self.stopper.finished()
        self.capture.stop()
        child = self.capture.wait(60)
        code = child if code is None else code
        where = format_lsn(self.last_covered)
        if self.stopper.requested:
            self.log.event("info", "stopped", f"stopped; the tables are applied up to {where}",
                           applied_lsn=where)  # fmt: skip
            return
        if code == 0 and self.once_lsn is not None:
            self.log.event("info", "stopped", f"--once: the tables are applied up to {where}, "
                           f"past the server's WAL position at the start "
                           f"({format_lsn(self.once_lsn)}); the slot and {self.out} are kept "
                           "for the next run", applied_lsn=where,
                           once_lsn=format_lsn(self.once_lsn))  # fmt: skip
            return
        if code == 0:
            self.log.event("info", "stopped", f"the capture stopped; applied up to {where}")
            return
        health = self.health()
        if health is not None and (not health.exists or health.invalidated):
            text = self._slot_lost(health)
            self.log.event("error", "slot_lost", text, slot=self.config.slot,
                           applied_lsn=where, reason=health.reason)  # fmt: skip
            self._said(SlotLost(text))
        text = (f"the capture ended with exit status {code} (its reason is above); the tables "
                f"are applied up to {where}")  # fmt: skip
        self.log.event("error", "capture_failed", text, exit_status=code)
        self._said((CaptureRefused if code == 2 else CaptureFailed)(text))

    def fail(self, error: BaseException) -> None:
        """The live path failed with ``error`` (the caller raises it): the capture stopped;
        an error of the data or of the capture directory is said as apply's (its first line;
        the whole of it in the log file) and becomes :attr:`said`. The others (the server's,
        what sync has no answer for) are the caller's to say (:mod:`pgcdc.cli.sync`)."""
        self.stopper.finished()
        self.capture.stop()
        self.capture.wait(60)
        if isinstance(error, (DataError, CaptureDirError, ValueError, OSError)):
            say_failure(self.log, error)
            self.said = error

    def _said(self, error: BaseException):
        """Raise ``error``, which the log has said."""
        self.said = error
        raise error

    def close(self) -> None:
        self.stopper.finished()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.capture is not None:
            self.capture.stop()
            self.capture.wait(60)
        if self.spark is not None and getattr(self.spark, "begun", True):
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
