"""``pgcdc sync`` (``--engine streaming``, the default): the live path as a Spark Structured
Streaming query.

The query reads the sync's capture directory (``format("pgcdc_capture")``, offsets are the
capture's durable positions: :mod:`pgcdc.streaming.directory`) with a checkpoint in
``DIR/_checkpoint/``. Spark triggers every 100 ms; the source moves its offset as the loop
engine (:mod:`pgcdc.sync.loop`) starts its cycles (every ``--trigger``, at once for a burst's
WAL). Each micro-batch, in ``foreachBatch``, is one cycle (:mod:`pgcdc.sync.cycle`) bounded by
the batch's end offset:
``apply_changes(..., until=end)`` applies what the capture had made durable at the batch's
planning, with apply's semantics, and writes ``DIR/_applied.lsn`` for the capture to confirm
the slot no further. So the slot advances only after the tables commit, and a batch run again
after a kill (planned in the offset log, not committed) finds its changes applied (each table's
position) and applies nothing twice. The checkpoint holds no truth of its own: apply reads
from the tables' positions, not from the batch's start, so a batch skipped (a stop) or a
checkpoint deleted loses nothing; a resync's new capture directory starts a new checkpoint.

Before the query starts, the loop engine's cycles run: the first one (the initial snapshot's
load), and on a rerun those of the backlog, applied in the driver while the JVM starts once
they have caught up, as the loop engine does; ``ready`` comes once the query has left its
initialisation. While no batch comes (an idle database without heartbeats) the driver keeps
the loop engine's checks every ``--tables-check``. Ctrl-C or SIGTERM: the running batch
finishes (``--stop-timeout``), later batches apply nothing, the query stops, exit 0. The
cost next to the loop engine (docs/sync.md): Spark's offset and commit logs around every
batch.
"""

from __future__ import annotations

import shutil
import threading
import time

from pgcdc.lsn import format_lsn
from pgcdc.spark.later import SessionLater, resolve
from pgcdc.status import planned_offset
from pgcdc.streaming.directory import NAME, CaptureDataSource, position_of
from pgcdc.sync import added, aside
from pgcdc.sync.config import CHECKPOINT
from pgcdc.sync.pace import EAGER_WAL, POLL
from pgcdc.sync.records import NewRecords

WATCH = 0.1  # seconds between two looks of the driver's main thread at the query


def batch_end(checkpoint, batch_id: int):
    """The end offset Spark planned for ``batch_id``, as a capture position (State)."""
    return position_of(planned_offset(checkpoint, batch_id))


class StreamingEngine:
    """Runs a :class:`pgcdc.sync.pipeline.Sync`'s live path as a Structured Streaming query
    (see the module docstring); :meth:`run` returns when it stopped cleanly, and raises
    (said) when it failed."""

    def __init__(self, sync):
        self.sync = sync
        self.checkpoint = sync.out / CHECKPOINT
        self.lock = threading.Lock()  # one cycle at a time: a batch's or the driver's checks
        self.error: BaseException | None = None  # what a batch raised
        self.records = NewRecords(sync.capture_dir)
        self.next_check = time.monotonic()
        self.query = None

    def run(self) -> None:
        s = self.sync
        s.cycle.last_covered = 0
        try:
            self._before_the_query()
        except BaseException as e:
            if s.stopper.requested:
                return s.end(None)
            s.fail(e)
            raise
        if s.stopper.requested:
            return s.end(None)
        s.spark = resolve(s.spark)
        s.stopper.spark = s.spark
        self._start(fresh=s.resync_reason is not None)  # resynced before the query
        self._wait_running()
        where = format_lsn(s.last_covered)
        s.log.event("info", "ready", f"the tables in {s.out} are current up to {where}; a "
                    f"Structured Streaming query applies every {s.config.trigger:g}s",
                    applied_lsn=where)  # fmt: skip
        code = None
        while not s.stopper.requested:
            if self.error is not None or (self.query is not None and not self.query.isActive):
                self._failed()
            what, status = s.watch_capture(self._resynced)
            if what == "again":
                continue
            if what == "ended":
                code = status
                break
            taken = s.adding is not None and not s.adding.running  # an added table's snapshot
            # the loop's idle cycles prune and look at the restart point (Upkeep.idle);
            # a query runs no batch while nothing new is durable, so its watch does
            due = taken or s.upkeep.idle_due() or time.monotonic() >= self.next_check
            if due and self.lock.acquire(False):
                try:  # no batch for a while (nothing durable came): the checks go on
                    if time.monotonic() >= self.next_check:
                        self._checks()
                    elif taken:
                        added.finish(s)  # loaded now, not at the next batch
                    s.upkeep.idle()
                except BaseException as e:
                    if s.stopper.requested:
                        break
                    s.fail(e)
                    raise
                finally:
                    self.lock.release()
            s.stopper.event.wait(WATCH)
        self._stop_query()
        s.end(code)

    def _resynced(self, before: bool) -> None:
        """A resync: the query stops before it; a new one reads the new capture directory
        after it."""
        if before:
            self._stop_query()
        else:
            self.records = NewRecords(self.sync.capture_dir)
            self._start(fresh=True)

    def _before_the_query(self) -> None:
        """The loop engine's cycles until Spark is there: one (the initial snapshot's load;
        Spark started), or, on a rerun, as many as the backlog takes while the JVM starts
        (it starts once they have caught up: :meth:`Sync.start_spark_when_caught_up`)."""
        s = self.sync
        first, loop_start = True, time.monotonic()
        while not s.stopper.requested:
            start = time.monotonic()
            if isinstance(s.spark, SessionLater):
                s.spark.check()
            with self.lock:
                self._cycle(None, first)
            first = False
            s.start_spark_when_caught_up(loop_start)
            if not isinstance(s.spark, SessionLater) or s.spark.started:
                return
            s.cycle.wait(start, also=lambda: s.spark.started)

    # --- the query ---------------------------------------------------------------------------

    def _start(self, fresh: bool = False) -> None:
        s = self.sync
        if fresh:  # a resync's new capture: the old one's positions name files not there
            shutil.rmtree(self.checkpoint, ignore_errors=True)  # (it holds no truth of its own)
        s.spark.dataSource.register(CaptureDataSource)
        # the source paces the batches as the loop engine paces its cycles (a new end offset
        # every --trigger, or as soon as a burst's WAL is durable); Spark looks often
        trigger = s.config.trigger
        pace = min(trigger, POLL)
        self.query = (
            s.spark.readStream.format(NAME).option("path", str(s.capture_dir))
            .option("pace", str(trigger)).option("eager_bytes", str(EAGER_WAL))
            .option("floor_lsn", str(s.last_covered)).load()
            .writeStream.foreachBatch(self._batch)
            .trigger(processingTime=f"{int(pace * 1000)} milliseconds")
            .option("checkpointLocation", str(self.checkpoint))
            .queryName(f"pgcdc-sync-{s.config.slot}")
            .start()
        )  # fmt: skip

    def _wait_running(self, patience: float = 60.0) -> None:
        """Until the query has run its first trigger and waits for the next (its source has a
        Python worker, its first batch, if any, is done): ``ready`` means the next change is
        applied by a batch, not after the query's start. A new query's first batch costs
        Spark 0.6-0.8 s (measured); a burst that came meanwhile all waited for it."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline and not self.sync.stopper.requested:
            q = self.query
            if q is None or not q.isActive or self.error is not None:
                return  # said by the main loop
            if q.status.get("message", "").startswith("Waiting for"):
                return  # "... data to arrive" or "... next trigger"
            self.sync.stopper.event.wait(0.05)

    def _batch(self, df, batch_id: int) -> None:
        """foreachBatch: one cycle up to the batch's end (the rows are not read: apply reads
        the same records, from the tables' positions on)."""
        s = self.sync
        if s.stopper.requested or self.error is not None:
            return  # stopping: applies nothing (the next run's first batch applies it)
        try:
            end = batch_end(self.checkpoint, batch_id)
            with self.lock:
                if s.stopper.requested:
                    return
                self._cycle(end)
                if time.monotonic() >= self.next_check:
                    self._checks()
        except BaseException as e:  # said by the main thread, which stops the query
            if not s.stopper.requested:
                self.error = e

    def _cycle(self, end, first: bool = False) -> None:
        s = self.sync
        s.cycle.run(self.records, first, until=end)
        added.finish(s)  # an added table's snapshot taken: loaded

    def _checks(self) -> None:
        s = self.sync
        if not s.stopper.requested:
            aside.serve(s)  # snapshots pgcdc resnapshot asked for
            added.check(s)  # (a snapshot it starts is loaded by a cycle, or the loop's watch)
        self.next_check = time.monotonic() + s.config.tables_check

    def _stop_query(self) -> None:
        """Stop after the running batch (the lock waits for it; later batches apply nothing)."""
        q, self.query = self.query, None
        if q is None:
            return
        with self.lock:
            pass
        try:
            q.stop()
        except Exception:  # noqa: BLE001 - a query that failed: said already
            pass

    def _failed(self) -> None:
        """A batch failed, or the query stopped: raised (said)."""
        s = self.sync
        e = self.error
        if e is None and self.query is not None:
            e = RuntimeError(f"the streaming query stopped: {self.query.exception()}")
        self._stop_query()
        s.fail(e)
        raise e
