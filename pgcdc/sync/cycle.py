"""``pgcdc sync``: one cycle of apply (:meth:`Cycle.run`), for both engines, and when the
next one is due (:meth:`Cycle.wait`, :meth:`Cycle.durable_ahead`)."""

from __future__ import annotations

import collections
import functools
import time

from pgcdc.apply.driver import DRIVER_BYTES
from pgcdc.apply.run import apply_changes
from pgcdc.apply.state import applied_lsn
from pgcdc.capture.runner import human_bytes as _human
from pgcdc.capture.segments import CaptureDirError, read_state
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.sync import aside
from pgcdc.sync.pace import EAGER_WAL, POLL, POLL_BURST
from pgcdc.sync.records import NewRecords

# a cycle that leaves this many changes durable past what it applied starts the next at
# once, and so on while a cycle applies this many and leaves any (a burst, a rerun's backlog)
CATCH_UP_EVENTS = 10_000
# records per unit of a cycle's plan: a unit is read whole when it holds anything new, so
# small units keep a cycle's reading to what is new (and its run in the driver), however
# large the segment it is in
CYCLE_UNIT_RECORDS = 50_000


class Cycle:
    """The cycles of one sync: what the last one covered and whether the next is due at
    once; ``sync``: a :class:`pgcdc.sync.pipeline.Sync`, of which it uses the public side."""

    def __init__(self, sync):
        self.sync = sync
        self.count = 0  # cycles that applied something
        self.last_covered = 0  # the last cycle's durable, applied or snapshot position
        self.catch_up = False  # the next cycle at once: a backlog (CATCH_UP_EVENTS)
        self.burst = False  # the last cycle applied CATCH_UP_EVENTS or more
        self.samples: collections.deque = collections.deque(maxlen=4096)  # (time, server WAL)

    def run(self, records: NewRecords, first: bool, until=None) -> None:
        """Apply what is durable in the capture, when there is something to apply; one line.
        ``until``: what was durable at an earlier point, applied no further (a Structured
        Streaming batch's end, :mod:`pgcdc.sync.query`; ``records`` looks no further)."""
        s = self.sync
        t0, wall0 = time.monotonic(), time.time()
        self.catch_up = self.burst = False
        wal = s.query("SELECT pg_current_wal_lsn()::text")
        if wal:
            self.samples.append((wall0, parse_lsn(wal[0][0])))
        floor_text = applied_lsn(s.out)
        floor = parse_lsn(floor_text) if floor_text else None
        events, worth, durable = records.look(floor, until=until)
        pending = s.snapshot_pending()
        self.last_covered = max(floor or 0, s.consistent_point())  # durable: once applied
        if durable is None and not pending:
            return  # nothing durable yet, nothing to load
        report = None
        if worth or pending or (first and s.applied_doc() is None):
            snapshot = str(s.snapshot_dir) if pending else None
            captures = [str(s.capture_dir)] if durable is not None else []
            # (maintain() cleans the log); a table at fault is set aside, the rest applied
            run = functools.partial(apply_changes, s.spark, captures, str(s.out),
                                    scd=s.config.scd, snapshot=snapshot,
                                    driver_bytes=DRIVER_BYTES, split_records=CYCLE_UNIT_RECORDS,
                                    until=until, log_cleanup=False)  # fmt: skip
            report = aside.apply(s, run, snapshot)
        covered = max(durable or 0, s.consistent_point())
        applied = applied_lsn(s.out)
        if applied:
            applied_at = parse_lsn(applied)
            covered = max(covered, applied_at)
            if report is not None:  # apply read on past what the look saw: count it too
                more, held = records.after_apply(floor, applied_at, until)
                events += more
                if held is not None:  # (the line says so: it stayed short of the end until
                    covered = max(covered, held)  # the next change, after a burst's end)
                    s.upkeep.restart_point()
                self.burst = events >= CATCH_UP_EVENTS
                if applied_at > (floor or 0):  # (a transaction not yet whole waits too)
                    left = records.later[0]  # what it left: a backlog, or not
                    # on at once while there is more, until a cycle applies fewer than that
                    self.catch_up = left >= CATCH_UP_EVENTS or (
                        left > 0 and events >= CATCH_UP_EVENTS
                    )
        took = time.monotonic() - t0
        self.last_covered = covered
        s.say_applied(covered)
        lag_bytes = max(0, self.samples[-1][1] - covered) if wal else None
        seen = [t for t, lsn in self.samples if lsn <= covered]
        lag_s = round(time.time() - max(seen), 3) if seen else None
        m = s.metrics
        if m is not None:
            m.applied_lsn = covered
            if wal:
                m.lag_bytes, m.lag_seconds = lag_bytes, lag_s or 0
        if report is None:
            s.upkeep.idle()
            return  # nothing to apply: no line, the tables are current
        self.count += 1
        if m is not None:
            m.cycles, m.events = self.count, m.events + events
            m.cycle_seconds, m.last_cycle_time = took, time.time()
        tables = dict(sorted(report.items()))
        text = (f"cycle {self.count}: {events:,} events, {len(tables)} table(s) written, "
                f"applied up to {format_lsn(covered)}, lag "
                f"{'?' if lag_bytes is None else _human(lag_bytes)} / "
                f"{'?' if lag_s is None else f'{lag_s:.1f}s'}, took {took:.1f}s")  # fmt: skip
        s.log.event("info", "apply", text, cycle=self.count, events=events, tables=tables,
                    applied_lsn=format_lsn(covered), lag_bytes=lag_bytes, lag_s=lag_s,
                    took_s=round(took, 3))  # fmt: skip
        s.upkeep.maintain(tables)

    def wait(self, start: float, also=None) -> None:
        """Until the next cycle is due, the last one having started at ``start``: at once for a
        backlog (a burst, a rerun), applied in cycles back to back as Spark's default trigger
        does; else once --trigger has passed, a burst's WAL is durable (:meth:`durable_ahead`),
        an added table's snapshot is taken (loaded now), the capture ended, a stop came, or
        ``also()`` says so."""
        s = self.sync
        poll = POLL_BURST if self.burst or not self.count else POLL
        while not self.catch_up and not s.stopper.event.wait(poll):
            if time.monotonic() - start >= s.config.trigger or s.capture.poll() is not None:
                return
            if self.durable_ahead():
                return
            if s.adding is not None and not s.adding.running:
                return  # an added table's snapshot is taken: loaded now
            if also is not None and also():
                return

    def durable_ahead(self) -> bool:
        """Whether the capture has made enough durable past what the last cycle read to start
        the next cycle before the trigger: EAGER_WAL of WAL, or anything after a cycle of
        CATCH_UP_EVENTS or more (a burst goes on, or its tail came) or before a rerun's first
        cycle. Small transactions of a steady flow wait for the trigger."""
        try:
            state = read_state(self.sync.capture_dir)
        except CaptureDirError:
            return False  # the cycle says what is wrong with it
        if state is None:
            return False
        ahead = state.lsn - self.last_covered  # the last cycle's durable, applied or snapshot
        # a rerun's first cycle starts on the capture's first commit (of its backlog, or of
        # whatever came), its warm-up overlapping the rest of the read; the next ones as a
        # burst's do. Not a fresh sync's: a steady flow's cycles keep to the trigger
        first = self.sync.rerun and not self.count
        return ahead >= EAGER_WAL or ((self.burst or first) and ahead > 0)
