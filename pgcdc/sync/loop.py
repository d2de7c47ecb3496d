"""``pgcdc sync --engine loop`` (and ``--once``): the live path as the driver's own cycles,
no Structured Streaming query. A cycle (:meth:`pgcdc.sync.cycle.Cycle.run`) every
``--trigger``, at once for a burst or a backlog; between two, the tables checks every
``--tables-check`` and the capture watched (:meth:`pgcdc.sync.pipeline.Sync.watch_capture`).
Ready without waiting for the JVM (a rerun's backlog is applied in the driver), a third of the
streaming engine's idle CPU. With ``--once`` the capture stops at the server's WAL position
read at the start, and the cycle after its end is the last."""

from __future__ import annotations

import time

from pgcdc.lsn import format_lsn
from pgcdc.spark.later import SessionLater
from pgcdc.sync import added, aside
from pgcdc.sync.records import NewRecords


class LoopEngine:
    """Runs a :class:`pgcdc.sync.pipeline.Sync`'s live path as the driver's cycles; :meth:`run`
    returns when it stopped cleanly, and raises (said) when it failed."""

    def __init__(self, sync):
        self.sync = sync
        self.records = NewRecords(sync.capture_dir)

    def _resynced(self, before: bool) -> None:
        if not before:  # a new capture directory: read from its start
            self.records = NewRecords(self.sync.capture_dir)

    def run(self) -> None:
        s = self.sync
        trigger = s.config.trigger
        next_check = loop_start = time.monotonic()
        first = True
        last = False  # --once: the capture has stopped at its point; this cycle is the last
        s.cycle.last_covered = 0
        code = None
        while True:
            start = time.monotonic()
            try:
                if isinstance(s.spark, SessionLater):
                    s.spark.check()  # a session that could not start: said at once
                s.cycle.run(self.records, first)
                added.finish(s)  # an added table's snapshot taken: loaded
                if first:
                    where = format_lsn(s.last_covered)
                    s.log.event("info", "ready", f"the tables in {s.out} are current up to "
                                f"{where}; applying every {trigger:g}s", applied_lsn=where)  # fmt: skip
                if time.monotonic() >= next_check and not s.stopper.requested and not last:
                    aside.serve(s)  # snapshots pgcdc resnapshot asked for
                    added.check(s)  # after a cycle: the tables are current meanwhile
                    next_check = time.monotonic() + s.config.tables_check
            except BaseException as e:
                if s.stopper.requested:
                    break  # cancelled: every table stays at its last commit
                s.fail(e)
                raise
            first = False
            s.start_spark_when_caught_up(loop_start)
            if s.stopper.requested or last:
                break
            what, status = s.watch_capture(self._resynced)
            if what == "again":
                continue
            if what == "ended":
                code = status
                if status == 0 and s.once_lsn is not None:
                    last = True  # what it made durable up to there: applied by one more
                    continue
                break
            s.cycle.wait(start)
            if s.stopper.requested:
                break
        s.end(code)
