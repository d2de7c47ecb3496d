"""Change events of capture files as Spark DataFrames, one per table, built on the executors.

Design: two Spark jobs, the second one task per *unit* (a capture file, or a slice of one),
so the values are decoded and typed on the executors. Steps 1 and 2 are in
:mod:`pgcdc.spark.units`, the Arrow batches of step 3 in :mod:`pgcdc.spark.table_batches`; this
module reads the units and builds the DataFrame:

1. **Summary** (one task per file): reads every record's header and tag byte (through
   :mod:`pgcdc.capture.files`, in C where the reader is built) and decodes only the small messages
   that frame transactions (Begin/Commit, Stream Start/Commit/Abort, Begin Prepare/Prepare/
   Commit Prepared/Rollback Prepared, Stream Prepare) and the Relation/Type messages.
   Inserts, updates and deletes are skipped unread. It returns these control entries with
   their position, and a possible split point every 50,000 records. Units are at most
   ``split_records`` records (1M by default) and as large as gives every core one
   (:func:`plan`): apply's tasks combine a unit's changes per key, which larger units do
   better.
2. **Plan** (driver, on the small summaries only): folds the control entries in stream order
   into, for each unit, the position of the oldest transaction still open where the unit
   starts (a streamed, prepared or plain transaction begun earlier), and the relation cache
   at that position (the latest Relation message per table, Type messages). It also gives
   each table's schema: the union of the columns of all its Relation messages (schema
   evolution: a column added by ALTER TABLE is null before it existed, a dropped one stops
   being filled), typed by :mod:`pgcdc.spark.types`.
3. **Events** (one task per unit, ``mapInArrow``): loads the carried relations into a
   :class:`pgcdc.events.reader.EventReader`, reads from that oldest open transaction's start to the
   unit's end, and emits the events that the unit's own records release (a transaction's
   events come out at its commit, or as they arrive for a plain Begin ... Commit), so every
   event is emitted by exactly one task, typed and in Arrow batches. The cost of carrying
   state is re-reading a transaction that spans a unit boundary, once per unit it spans.

The result (:class:`ChangeEvents`) is one wide DataFrame with the common columns and one
``<table>`` struct column per table holding ``before``/``after``; :meth:`ChangeEvents.table`
projects one table's DataFrame from it (persist it when several tables are read). A capture
directory is read up to its durable position (``state.json``), where nothing is open.

Columns of a table's DataFrame (Debezium names, as ``pgcdc changes`` writes them): ``op``
(c, u, d, t), ``before`` and ``after`` (structs of the table's columns plus ``_pg_text``; see
:mod:`pgcdc.spark.types`; ``before`` holds only the key columns unless the identity is FULL),
``before_is_key``, ``unchanged`` (unchanged TOAST columns, null in ``after``), ``commit_lsn``
and ``tx_ordinal`` (LongType: the total order), ``source`` (``lsn`` and ``commit_lsn`` as
PostgreSQL prints them, ``tx_ordinal``, ``commit_time``, ``xid``, ``origin``, ``schema``,
``table``), ``truncate`` (cascade, restart_identity) and ``errors`` (lenient mode). Logical
messages are not table changes and are left out (``pgcdc changes`` prints them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

import pgoutput_codec as pgc
from pgoutput_codec import capture as capfmt

from pgcdc.capture.files import CaptureFile, Captures, catalog_of, open_capture, range_chunks
from pgcdc.tablekey import table_key

# the parts, re-exported: what pgcdc.spark.changes has always offered
from pgcdc.spark.table_batches import (
    BATCH_ROWS,
    EVENT_FIELDS,
    EventStats,
    TableBuffer,
    arrow_type,
    batch_stats,
    event_schema,
    events_batch,
    lsn_texts,
    table_column,
)
from pgcdc.spark.units import (
    DEFAULT_SPLIT_RECORDS,
    SPLIT_GRAIN,
    TableSchema,
    Unit,
    plan,
    relation_record,
    summarize_file,
)
from pgcdc.events.gcpause import paused
from pgcdc.events.reader import EventReader, RawRun
from pgcdc.spark.later import resolve, started
from pgcdc.spark.ship import is_local_master, ship_packages

__all__ = [
    "ChangeEvents",
    "EventStats",
    "Unit",
    "change_events",
    "list_capture_files",
    # the parts (pgcdc.spark.units, pgcdc.spark.table_batches)
    "BATCH_ROWS",
    "CaptureFile",
    "DEFAULT_SPLIT_RECORDS",
    "EVENT_FIELDS",
    "SPLIT_GRAIN",
    "TableSchema",
    "arrow_type",
    "batch_stats",
    "event_schema",
    "events_to_batches",
    "lsn_texts",
    "plan",
    "summarize_file",
    "table_column",
    "unit_events",
    "unit_parts",
]

DRIVER_SUMMARY_BYTES = 256 << 20  # captures up to this size are summarised on the driver
# ... and up to this size while the session is still starting (pgcdc sync's rerun, which
# summarises every segment not yet pruned once): the driver reads 350 MB of segments in
# 0.1 s, and the job would wait for the JVM's start, 5-6 s on two cores
STARTING_SUMMARY_BYTES = 4 << 30


def list_capture_files(paths) -> list[CaptureFile]:
    """Capture files and directories -> the files to read, in stream order, each up to where
    it may be read (:class:`pgcdc.capture.files.Captures`: a directory's durable position, the
    last commit boundary of a file or of a directory without state.json)."""
    return Captures.open(paths).logged().files


# --- 3. events ----------------------------------------------------------------------------------


def unit_events(unit: Unit, lenient: bool = False) -> Iterator:
    """The events one unit emits, in stream order (runs in a task)."""
    for part in unit_parts(unit, lenient):
        yield from part


def unit_parts(unit: Unit, lenient: bool = False, raw_runs: bool = False) -> Iterator:
    """:func:`unit_events` as lists (a run of changes loaded column-wise, or the messages
    between such runs; at most a chunk of records each); with ``raw_runs``, a run that
    would load column-wise comes as a :class:`pgcdc.events.reader.RawRun` instead."""

    catalog = unit.catalog
    if catalog is None:  # the catalog.jsonl beside the unit's files (see sources.catalog_of)
        catalog = catalog_of([f[1] for f in unit.files])
    reader = EventReader(lenient=lenient, catalog=catalog, passed_over=unit.passed_over)
    rels = reader.relations
    for fields in unit.relations:
        msg = capfmt.Record(fields[0], fields[1], fields[2], 0, fields[3]).decode()
        if type(msg) is pgc.Type:
            rels.on_type(msg)
        else:
            rels.on_relation(msg)
    for fno, path, fend, start_idx, start_off, end_idx, end_off, before, cut in unit.files:
        with open_capture(CaptureFile(path, fend)) as (data, start, end):
            off = start if start_off is None else start_off
            stop = end if end_off is None else end_off
            reader.index = start_idx
            records = range_chunks(data, off, stop)
            try:
                if before:
                    for _ in reader.read_chunks(records):
                        pass
                    continue
                if cut is not None and cut[0] > start_idx:
                    for _ in reader.read_chunks(range_chunks(data, off, cut[1])):
                        pass
                    records = range_chunks(data, cut[1], stop)
                for part in reader.read_chunk_parts(records, raw_runs):
                    if type(part) is RawRun:
                        part.path = path
                        yield part
                        continue
                    events = list(part)  # here, so that its errors name the file
                    if events:
                        yield events
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from e


def events_to_batches(
    unit: Unit, tables: dict, schema, lenient: bool = False, stats: dict | None = None
):
    """Arrow RecordBatches of one unit's table change events (runs in a task); ``stats``:
    a dict ``{"after": LSN or None}`` that :func:`batch_stats` fills as the batches go."""

    with paused():
        yield from _events_to_batches(unit, tables, schema, lenient, stats)


def _events_to_batches(unit: Unit, tables: dict, schema, lenient: bool, stats: dict | None):
    arrow_schema = arrow_type(schema)
    import pyarrow as pa

    arrow_schema = pa.schema(list(arrow_schema))
    buffers = {}
    for i, (name, ts) in enumerate(tables.items()):
        col = arrow_schema.field(table_column(name, i)).type
        buffers[name] = TableBuffer(ts, i, col.field("after").type)

    def batch_of(buf, rows):
        """The batch of a table's rows, with its stats taken; None if none changed it."""
        batch = events_batch(buf, rows, arrow_schema)
        if batch is not None and stats is not None:
            batch_stats(batch, buf.ts.qualified, stats)
        return batch

    for rel, group in groupby(unit_events(unit, lenient), itemgetter(1)):
        if rel is None:  # logical messages
            continue
        buf = buffers.get(table_key(rel.schema, rel.table))
        if buf is None:  # lenient: an unknown relation; its errors say so
            continue
        rows = buf.rows
        rows.extend(group)
        while len(rows) >= BATCH_ROWS:
            batch = batch_of(buf, rows[:BATCH_ROWS])
            del rows[:BATCH_ROWS]
            if batch is not None:
                yield batch
    for buf in buffers.values():
        if buf.rows:
            batch = batch_of(buf, buf.rows)
            buf.rows = []
            if batch is not None:
                yield batch


# --- the DataFrames -----------------------------------------------------------------------------


@dataclass
class ChangeEvents:
    """The events of some captures: ``events`` (the wide DataFrame), the table schemas and
    the plan (units) it was built from. The DataFrames are made when first asked for: a run
    that reads the units in the driver (driver_apply) makes none (the first DataFrame of a
    new session costs about a second of Spark's analysis)."""

    build: object  # () -> (events, seeds)
    tables: dict
    units: list
    skipped_units: int = 0  # units not read: all they emit was committed by min_commit_lsn
    stats: object = None  # change_events(stats=True): an EventStats accumulator
    lenient: bool = False
    min_commit_lsn: int | None = None
    catalog: object = None  # the pgcdc.values.Catalog the values were typed with, or None
    _frames: tuple | None = None

    def _built(self) -> tuple:
        if self._frames is None:
            self._frames = self.build()
        return self._frames

    @property
    def events(self):
        """The wide DataFrame of the events."""
        return self._built()[0]

    @property
    def seeds(self):
        """One row (a unit number) per partition, what the tasks map over; None if no unit."""
        return self._built()[1] if self.units else None

    def table_stats(self) -> dict:
        """With ``stats=True``, once ``events`` has been computed: {table: {"last",
        "truncate", "unchanged"}} of the events committed after ``min_commit_lsn`` (see
        :class:`EventStats`); tables without such events are not in it."""
        if self.stats is None:
            return {}
        return {t: dict(s) for t, s in self.stats.value.items()}

    def files_read(self) -> list[str]:
        """The capture files the units read (any part of them)."""
        return sorted({part[1] for unit in self.units for part in unit.files})

    def table_names(self) -> list[str]:
        return list(self.tables)

    def table(self, qualified: str, events=None, extra=("truncate", "errors")):
        """One table's change events: the common columns, ``before`` and ``after``, then the
        ``extra`` columns; from ``events`` when given (a DataFrame of this one's rows and
        columns, such as apply's cache of what it reads)."""
        from pyspark.sql import functions as F

        names = list(self.tables)
        if qualified not in self.tables:
            raise KeyError(f"no changes of table {qualified!r} (tables: {names})")
        col = table_column(qualified, names.index(qualified))
        df = (self.events if events is None else events).where(F.col("table_name") == qualified)
        return df.select(
            "op",
            F.col(col + ".before").alias("before"),
            F.col(col + ".after").alias("after"),
            "before_is_key",
            "unchanged",
            "commit_lsn",
            "tx_ordinal",
            "source",
            *extra,
        )


# summaries of capture files as they were: a long run (sync: a cycle a second) reads the
# same sealed segments again and again, and a growing segment's durable records once each
_SUMMARIES: dict = {}
# a summary holds a segment's transaction boundaries (megabytes for a large one): those of
# files gone (pruned) are dropped, and at most this many kept
_SUMMARIES_KEPT = 64


def _summary_of(f, grain: int) -> tuple:
    """(the key of file ``f``'s summary, the stat that must match for a whole hit)."""
    try:
        st = os.stat(f.path)
    except OSError:
        return None, None
    key = (os.path.abspath(f.path), st.st_ino, f.boundary, f.partial_ok, grain)
    return key, (f.end, st.st_size, st.st_mtime_ns)


def _cached_summary(file_no: int, f, grain: int) -> dict | None:
    """The summary of ``f`` as remembered, or brought up to date from it when ``f`` is a
    directory's growing segment (its records up to an earlier durable end are unchanged:
    a capture never rewrites what it made durable); None when it is to be made anew."""
    key, stat = _summary_of(f, grain)
    got = _SUMMARIES.get(key) if key is not None else None
    if got is None:
        return None
    was, summary = got
    if was == stat:
        return {**summary, "file_no": file_no}
    in_directory = f.boundary and os.path.exists(
        os.path.join(os.path.dirname(f.path), "state.json")
    )
    if in_directory and f.end is not None and was[0] is not None and was[0] <= f.end:
        summary = summarize_file(file_no, f, grain, since=summary)
        _SUMMARIES[key] = (stat, summary)
        return summary
    return None


def _remember_summary(f, grain: int, summary: dict) -> None:
    key, stat = _summary_of(f, grain)
    if key is None:
        return
    for old in [k for k in _SUMMARIES if not os.path.exists(k[0])]:
        del _SUMMARIES[old]
    while len(_SUMMARIES) >= _SUMMARIES_KEPT:
        del _SUMMARIES[next(iter(_SUMMARIES))]  # the oldest remembered
    _SUMMARIES[key] = (stat, summary)


def change_events(
    spark,
    captures,
    *,
    split_records: int = DEFAULT_SPLIT_RECORDS,
    min_units: int | None = None,
    lenient: bool = False,
    min_commit_lsn: int | None = None,
    ship: bool | None = None,
    stats: bool = False,
    known: list | None = None,
    catalog=None,
    until=None,
    load=None,
) -> ChangeEvents:
    """Change events of capture files/directories (one continuous stream, in the order given)
    as a :class:`ChangeEvents`. ``min_commit_lsn``: units that can only emit transactions
    committed at or before it are not read (incremental runs). ``split_records``: records
    per task at most; ``min_units``: tasks at least, when there are records enough (default:
    the context's parallelism), see :func:`plan`. ``ship``: add pgcdc and the
    codecs to the executors (:mod:`pgcdc.spark.ship`); by default unless the master is local
    (local executors run this interpreter, which has them). ``stats``: the tasks also gather
    :attr:`ChangeEvents.stats` as they compute ``events`` (no job of its own). ``known``
    (Relation records, see :func:`plan`) and ``catalog`` (a :class:`pgcdc.values.Catalog`):
    what an earlier run learnt from captures no longer given (apply's state); the captures'
    own relations.jsonl and catalog.jsonl come on top. ``until``: the capture directory's
    durable position to read to (see :func:`pgcdc.capture.segments.durable_segments`).
    ``load``: which tables' values are loaded (a predicate on ``schema.table``; default all):
    the others' events hold None for every value (a run that applies some tables only)."""

    asked = []  # whether the session was asked for (and the packages shipped if need be)

    def ready_spark():
        """The session, with the packages shipped, before its first job."""
        session = resolve(spark)
        if not asked:
            if ship or (ship is None and not is_local_master(session)):
                ship_packages(session)
            asked.append(True)
        return session

    if started(spark):
        ready_spark()
    found = Captures.open(captures, until).logged()
    files = found.files
    if catalog is None:
        catalog = found.catalog
    elif found.catalog is not None:
        catalog = catalog.merged(found.catalog)
    known = list(known or []) + [relation_record(m) for m in found.known_relations()]
    grain = min(SPLIT_GRAIN, split_records)
    jobs = list(enumerate(files))
    summaries = [_cached_summary(i, f, grain) for i, f in jobs]
    todo = [(i, f) for (i, f), got in zip(jobs, summaries) if got is None]
    size = sum(os.path.getsize(f.path) for _i, f in todo)
    if size <= (DRIVER_SUMMARY_BYTES if started(spark) else STARTING_SUMMARY_BYTES):
        # a job costs more than reading these headers here (about 0.04 s per 1M records)
        done = [summarize_file(i, f, grain) for i, f in todo]
    else:
        done = (
            ready_spark()
            .sparkContext.parallelize(todo, len(todo))
            .map(lambda job: summarize_file(job[0], job[1], grain))
            .collect()
        )
    for (i, f), got in zip(todo, done):
        _remember_summary(f, grain, got)
        summaries[i] = got
    if min_units is None:  # a session still starting: its driver reads small runs alone
        min_units = spark.sparkContext.defaultParallelism if started(spark) else os.cpu_count()
    units, tables = plan(files, summaries, split_records, min_units, catalog=catalog, known=known)
    passed_over = frozenset(n for n in tables if load is not None and not load(n))
    for u in units:  # what the tasks need to type values of types that are not built in
        u.catalog = catalog  # (shipped with the unit: executors need not read the file)
        u.passed_over = passed_over
    if min_commit_lsn is not None:
        kept = [u for u in units if u.max_commit_lsn > min_commit_lsn]
        skipped, units = len(units) - len(kept), kept
    else:
        skipped = 0
    acc = ready_spark().sparkContext.accumulator({}, EventStats()) if stats else None
    if not units:
        return ChangeEvents(
            lambda: (ready_spark().createDataFrame([], event_schema(tables)), None),
            tables,
            units,
            skipped,
            acc,
            lenient,
            min_commit_lsn,
            catalog,
        )
    tables_b = tables
    units_by_no = {u.unit_no: u for u in units}
    _UNITS_LOCAL = units_by_no

    def build():
        # the schema here: a run the driver reads (driver_apply) never imports Spark's types
        schema = event_schema(tables)

        def run_units(batches):
            for batch in batches:
                for unit_no in batch.column(0).to_pylist():
                    found = {"after": min_commit_lsn, "tables": {}} if acc is not None else None
                    yield from events_to_batches(
                        _UNITS_LOCAL[unit_no], tables_b, schema, lenient, found
                    )
                    if acc is not None:
                        acc.add(found["tables"])

        # one partition per unit: spark.range puts exactly one id in each
        seeds = (
            ready_spark()
            .range(0, len(units), 1, numPartitions=len(units))
            .selectExpr(
                f"element_at(array({','.join(str(u.unit_no) for u in units)}), int(id) + 1) AS unit"
            )
        )
        return seeds.mapInArrow(run_units, schema), seeds

    return ChangeEvents(build, tables, units, skipped, acc, lenient, min_commit_lsn, catalog)
