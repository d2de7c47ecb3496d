"""A Structured Streaming source over a capture directory: ``format("pgcdc_capture")``.

::

    from pgcdc.streaming.directory import CaptureDataSource
    spark.dataSource.register(CaptureDataSource)
    events = spark.readStream.format("pgcdc_capture").option("path", "cdc/").load()

``pgcdc capture`` (or ``pgcdc sync``'s) keeps reading the slot into the directory, durably,
and confirms the slot itself; this source reads what the capture has made durable. The rows
are those of ``format("pgcdc")`` (:func:`pgcdc.streaming.event_rows.event_schema`).

Offsets are the capture's durable positions as its ``state.json`` records them,
``{"lsn": "0/16B3748", "segment": "…", "offset": 8192}``: the segment and the bytes of it
that were durable. A capture never rewrites what it made durable, so a batch ``(start, end]``
reads the same records every time: those durable at ``end`` (:func:`pgcdc.capture.segments.
durable_segments` with ``until``), from the transactions committing after ``start``'s LSN.
``initialOffset`` is the position before anything (``lsn`` 0/0, no segment). ``commit`` does
nothing: the directory is not consumed (``pgcdc prune`` deletes what a consumer applied).

``read`` runs in one task per batch and needs the directory where the task runs (the
driver's file system on a local master, or a shared one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from pgcdc.capture.files import Captures
from pgcdc.capture.segments import State, read_state
from pgcdc.events.gcpause import paused
from pgcdc.events.reader import EventReader, RawRun
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.streaming import json_runs  # (its run_batch looked up at each call)
from pgcdc.streaming.event_rows import (
    RAW_RUN_ROWS,
    Batches,
    arrow_schema,
    event_schema,
    events_batch,
)

NAME = "pgcdc_capture"
INITIAL = {"lsn": "0/0", "segment": None, "offset": 0}


def offset_of(state) -> dict:
    """The offset of a :class:`pgcdc.capture.segments.State` (None: nothing durable yet)."""
    if state is None:
        return dict(INITIAL)
    return {"lsn": format_lsn(state.lsn), "segment": state.segment, "offset": state.offset}


def position_of(offset: dict):
    """The :class:`pgcdc.capture.segments.State` an offset names, None for the initial one."""
    if not offset.get("segment"):
        return None
    return State(parse_lsn(offset["lsn"]), offset["segment"], int(offset["offset"]))


class CaptureDataSource(DataSource):
    """``format("pgcdc_capture")``: options ``path`` (the capture directory), ``lenient``,
    and the pace of ``pgcdc sync``'s cycles: ``pace`` (seconds: a new end offset at most this
    often, unless...) and ``eager_bytes`` (...this much WAL is durable past the last one, or
    anything is after such a batch: a burst, a backlog); with a short processing-time trigger,
    a burst's batches start as the capture makes it durable rather than on the trigger's grid.
    ``floor_lsn``: where the capture starts, for a query started before it made anything
    durable (a new sync's): its first records are paced from there, not taken at once.
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return event_schema()

    def streamReader(self, schema) -> DataSourceStreamReader:
        if not self.options.get("path"):
            raise ValueError("format('pgcdc_capture') needs option path: a capture directory")
        return CaptureStreamReader(dict(self.options))


class _Range(InputPartition):
    def __init__(self, start: dict, end: dict):
        super().__init__(0)
        self.start, self.end = start, end


class CaptureStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict):
        self.path = options["path"]
        self.lenient = str(options.get("lenient", "false")).lower() == "true"
        self.pace = float(options["pace"]) if options.get("pace") else None
        self.eager = int(options.get("eager_bytes", 0)) or None
        self.floor = int(options["floor_lsn"]) if options.get("floor_lsn") else None
        self.last: tuple | None = None  # (offset, its LSN, when) given last
        self.burst = False

    def initialOffset(self) -> dict:
        return dict(INITIAL)

    def latestOffset(self) -> dict:
        import time

        state = read_state(self.path)
        offset = offset_of(state)
        now = time.monotonic()
        if self.pace is None or state is None:
            if self.pace is not None and self.last is None and self.floor is not None:
                self.last = (offset, self.floor, now)  # nothing durable yet: paced from here
            return offset
        if self.last is not None:
            given, lsn, when = self.last
            ahead = state.lsn - lsn
            eager = self.eager is not None and ahead >= self.eager
            if ahead <= 0 or not (eager or self.burst or now - when >= self.pace):
                return given  # (a batch is planned only when the offset moves)
            self.burst = eager
        self.last = (offset, state.lsn, now)  # the first look: at once (a rerun's backlog)
        return offset

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [_Range(start, end)]

    def commit(self, end: dict) -> None:
        pass  # read, not consumed

    def read(self, partition: _Range) -> Iterator:
        yield from read_range(self.path, partition.start, partition.end, lenient=self.lenient)


def read_range(path, start: dict, end: dict, *, lenient: bool = False, batch_rows=10_000):
    """Arrow batches (``event_schema``) of the events of transactions committing after
    ``start``'s LSN in what was durable at ``end``."""
    until = position_of(end)
    if until is None:
        return
    after = parse_lsn(start["lsn"])
    captures = Captures.open([path], until)
    reader = EventReader(lenient=lenient, catalog=captures.catalog)
    reader.seed_relations(captures.known_relations())
    out = Batches(events_batch, batch_rows)
    schema = arrow_schema()
    with paused():
        for part in reader.read_chunk_parts(captures.chunks(), raw_runs=True):
            if type(part) is RawRun:  # one transaction's: rendered from its text if it can
                if part.txn[0] <= after:
                    continue
                made = json_runs.run_batch(part, schema) if part.m >= RAW_RUN_ROWS else None
                if made is not None:
                    yield from out.add_batch(made)
                    continue
                part = part.events()
            events = [ev for ev in part if ev.commit_lsn > after]
            if events:
                yield from out.add_events(events)  # in batches of batch_rows
        yield from out.finish()
