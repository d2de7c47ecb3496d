"""The initial snapshot on Spark: a slot's published tables, read at the slot's exported
snapshot by Spark tasks, written as Parquet following the snapshot contract of
:mod:`pgcdc.apply.state`.

::

    from pgcdc.snapshot.job import take_snapshot
    result = take_snapshot(spark, dsn, "cdc", ["app_pub"], "snapshot/")
    # then: pgcdc capture --slot cdc ... (it starts at result.consistent_point)

The driver creates the slot with an exported snapshot (:class:`pgcdc.snapshot.server.SlotSnapshot`)
and keeps that replication connection open while the tasks run. Each table is one Spark job
of the ``pgcdc_snapshot`` Python Data Source: one partition per range of heap blocks, and each
task opens its own connection, imports the snapshot (``SET TRANSACTION SNAPSHOT``), reads its
range through ``COPY (SELECT ...) TO STDOUT`` and yields typed Arrow batches (types and values
by :mod:`pgcdc.spark.types`, the same as change events). Nothing goes through the driver.

Output (the contract in :mod:`pgcdc.apply.state`):

- ``OUT/<schema>.<table>/``: Parquet, the published columns typed by ``spark_type``, plus
  ``_pg_text`` (map: column -> PostgreSQL text of values the typed column holds as null),
  ``_commit_lsn`` (the consistent point) and ``_tx_ordinal`` (0): every row is op 'r';
- ``OUT/_snapshot.json``, written last (its presence means the snapshot is complete): the
  slot, the consistent point, the snapshot's keys and per-table row counts.

A failure before ``_snapshot.json`` is written drops the slot the run created (a slot
without its snapshot is of no use and would hold WAL on the server), so the run can be
started again with the same name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pgcdc.snapshot import server as pgsnap
from pgcdc.durable import write_json
from pgcdc.lsn import format_lsn
from pgcdc.spark.types import SPECIAL_COLUMN, RowConverter, columns_schema
from pgcdc.snapshot.binary_copy import RangeReader, Recheck, adbc_available, xid_fixes

__all__ = [
    "COMMIT_LSN_COLUMN",
    "TX_ORDINAL_COLUMN",
    "SnapshotDataSource",
    "SnapshotResult",
    "table_schema",
    "take_snapshot",
]

FORMAT = "pgcdc_snapshot"
FILES_FORMAT = "pgcdc_snapshot_files"
TABLE_DONE = "_pgcdc_table.json"  # a table's marker: all its ranges are written
PROGRESS = "_snapshot.progress.json"  # a run under way (or one that died)
FAULTS = "_snapshot.faults.json"  # tests only: ranges whose task fails once
COMMIT_LSN_COLUMN = "_commit_lsn"
TX_ORDINAL_COLUMN = "_tx_ordinal"
MANIFEST = "_snapshot.json"

_log = logging.getLogger("pgcdc.snapshot.server")


def table_schema(table: pgsnap.PublishedTable, catalog=None):
    """The Spark schema of a table's snapshot: its columns (types that are not built in typed
    by ``catalog``, as the change events type them), then the contract's columns."""
    from pyspark.sql.types import LongType, MapType, StringType, StructField

    typmods = [c.type_modifier for c in table.columns]
    schema = columns_schema(table.names, table.type_oids, typmods, catalog)
    schema.add(StructField(SPECIAL_COLUMN, MapType(StringType(), StringType(), True), True))
    schema.add(StructField(COMMIT_LSN_COLUMN, LongType(), False))
    schema.add(StructField(TX_ORDINAL_COLUMN, LongType(), False))
    return schema


class _Range(InputPartition):
    def __init__(self, index: int, lo_block: int, hi_block: int | None):
        super().__init__((index, lo_block, hi_block))
        self.index, self.lo_block, self.hi_block = index, lo_block, hi_block


def _ranges_of(table: pgsnap.PublishedTable, options: dict) -> list[pgsnap.TableRange]:
    if "ranges" in options:  # the driver's plan (a rerun: only the ranges not written yet)
        return [pgsnap.TableRange(table, i, lo, hi) for i, lo, hi in json.loads(options["ranges"])]
    bpr = options.get("blocks_per_range")
    rb = options.get("range_bytes")
    return pgsnap.plan_ranges(
        [table],
        blocks_per_range=int(bpr) if bpr else None,
        range_bytes=int(rb) if rb else None,
    )


class SnapshotDataSource(DataSource):
    """``spark.read.format("pgcdc_snapshot")`` over one table at an exported snapshot.

    Options: ``dsn``, ``snapshot`` (the exported snapshot's name), ``table`` (JSON of
    :meth:`pgcdc.snapshot.server.PublishedTable.to_dict`), ``commit_lsn`` (the consistent point, an
    integer), ``range_bytes`` or ``blocks_per_range`` (how ranges are sized), ``reader``
    (``arrow``: binary COPY typed into Arrow by the ADBC driver, the default when it is
    installed; ``text``: text COPY through :class:`pgcdc.values.RowLoader`), ``batch_rows``
    (text reader, default 10000) and ``batch_bytes`` (arrow reader, default 16 MiB)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _table(self) -> pgsnap.PublishedTable:
        return pgsnap.PublishedTable.from_dict(json.loads(self.options["table"]))

    def schema(self):
        catalog = pgsnap.make_catalog(json.loads(self.options.get("catalog") or "[]"))
        return table_schema(self._table(), catalog)

    def reader(self, schema) -> DataSourceReader:
        return _SnapshotReader(self._table(), dict(self.options))


class _SnapshotReader(DataSourceReader):
    def __init__(self, table: pgsnap.PublishedTable, options: dict):
        self.table = table
        self.options = options
        self.dsn = options["dsn"]
        self.snapshot = options["snapshot"]
        self.commit_lsn = int(options["commit_lsn"])
        self.batch_rows = int(options.get("batch_rows", 10_000))
        self.batch_bytes = int(options.get("batch_bytes", 16 << 20))
        self.reader = options.get("reader") or _default_reader()
        self.catalog = pgsnap.make_catalog(json.loads(options.get("catalog") or "[]"))

    def partitions(self) -> Sequence[InputPartition]:
        return [
            _Range(r.index, r.lo_block, r.hi_block) for r in _ranges_of(self.table, self.options)
        ]

    def read(self, partition: _Range) -> Iterator:
        from pyspark.sql.pandas.types import to_arrow_schema

        t = self.table
        rng = pgsnap.TableRange(t, partition.index, partition.lo_block, partition.hi_block)
        arrow_schema = to_arrow_schema(table_schema(t, self.catalog), timezone="UTC")
        if self.reader == "arrow":
            reader = RangeReader(t, arrow_schema, self.commit_lsn, catalog=self.catalog)
            yield from reader.read(self.dsn, self.snapshot, rng, batch_bytes=self.batch_bytes)
            return
        yield from _read_text(t, rng, self.dsn, self.snapshot, arrow_schema, self.commit_lsn,
                              self.batch_rows, self.catalog)  # fmt: skip


def _default_reader() -> str:
    return "arrow" if adbc_available() else "text"


def _read_text(t, rng, dsn, snapshot, arrow_schema, commit_lsn, batch_rows, catalog) -> Iterator:
    """The text COPY path: rows loaded by RowLoader, converted by RowConverter."""
    import pyarrow as pa

    converter = RowConverter(t.names, t.type_oids, [c.type_modifier for c in t.columns], catalog)
    fixes = xid_fixes(t.type_oids)
    conn = pgsnap.open_snapshot_connection(dsn, snapshot)
    try:
        for rows in pgsnap.read_range(conn, rng, batch_rows=batch_rows, catalog=catalog):
            if fixes:
                rows = [_fix(row, fixes) for row in rows]
            yield _to_batch(pa, rows, converter, arrow_schema, commit_lsn)
    finally:
        conn.close()


def _fix(row: tuple, fixes) -> tuple:
    row = list(row)
    for i, fix in fixes:
        if row[i] is not None:
            row[i] = fix(row[i])
    return tuple(row)


class SnapshotFilesDataSource(SnapshotDataSource):
    """``pgcdc_snapshot_files``: each task reads its range (as ``pgcdc_snapshot`` does) and
    writes it itself as one Parquet file ``OUT/<table>/part-<range>.parquet`` with pyarrow;
    its one row says (range, rows, bytes). No row crosses into the JVM. Options: those of
    ``pgcdc_snapshot`` plus ``path`` (the table's directory, local or mounted)."""

    @classmethod
    def name(cls) -> str:
        return FILES_FORMAT

    def schema(self):
        return "range INT, rows BIGINT, bytes BIGINT, peak_rss BIGINT"

    def reader(self, schema) -> DataSourceReader:
        return _FilesReader(self._table(), dict(self.options))


class _FilesReader(_SnapshotReader):
    def read(self, partition: _Range) -> Iterator:
        from pyspark.sql.pandas.types import to_arrow_schema

        t = self.table
        rng = pgsnap.TableRange(t, partition.index, partition.lo_block, partition.hi_block)
        arrow_schema = to_arrow_schema(table_schema(t, self.catalog), timezone="UTC")
        path = os.path.join(self.options["path"], part_name(partition.index))
        _injected_fault(self.options["path"], t.qualified_name, partition.index)
        plain = [c.name for c in t.columns if c.type_oid == UUID_OID]  # stored uncompressed
        if self.reader == "arrow":
            # dates and timestamps checked in Arrow; a range that holds one out of Spark's
            # range is written again with the server's predicate for that column (its text)
            reader = RangeReader(t, arrow_schema, self.commit_lsn, catalog=self.catalog, checked=())
            while True:
                batches = reader.read(self.dsn, self.snapshot, rng, batch_bytes=self.batch_bytes)
                try:
                    rows, size = _write_batches(batches, arrow_schema, path, plain)
                    break
                except Recheck as r:
                    reader = reader.checking(r.columns)
        else:
            rows, size = _write_batches(
                _read_text(t, rng, self.dsn, self.snapshot, arrow_schema, self.commit_lsn,
                           self.batch_rows, self.catalog), arrow_schema, path, plain,
            )  # fmt: skip
        import resource

        # the Python worker's peak resident memory (it may have run earlier ranges too)
        yield (
            partition.index,
            rows,
            size,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        )


def _injected_fault(table_dir: str, table: str, index: int) -> None:
    """Fault injection for tests: ``OUT/_snapshot.faults.json`` (``{"schema.table": [range,
    ...]}``) makes each listed range's task fail once (it is taken off the list)."""
    import fcntl

    path = os.path.join(os.path.dirname(table_dir), FAULTS)
    if not os.path.exists(path):
        return
    # the ranges' tasks run at once: each takes its range off the list under a lock, in
    # place (two writers of one temporary file raced: one's rename found it gone)
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        faults = json.load(f)
        if index not in faults.get(table, ()):
            return
        faults[table].remove(index)
        f.seek(0)
        f.truncate()
        json.dump(faults, f, indent=1, sort_keys=True)
    raise RuntimeError(f"injected failure: {table} range {index}")


def part_name(index: int) -> str:
    return f"part-{index:05d}-pgcdc.snappy.parquet"


UUID_OID = 2950


def _compression(schema, plain) -> dict:
    """Snappy for every Parquet column but those of ``plain`` (top-level names), stored
    uncompressed: a uuid's text (32 random hex digits) shrinks by a tenth at a quarter of the
    whole file's writing time (wide_t: 0.05 of 0.2 CPU-s per 500k rows)."""
    import io

    import pyarrow.parquet as pq

    empty = io.BytesIO()
    pq.write_table(schema.empty_table(), empty)
    paths = [c.path for c in pq.ParquetFile(io.BytesIO(empty.getvalue())).schema]
    return {p: "none" if p.split(".")[0] in plain else "snappy" for p in paths}


def _ahead(batches, depth: int = 2):
    """``batches`` made in a thread, up to ``depth`` ahead of their consumer: the driver's
    fetch and the conversion of the next batches overlap the Parquet write of this one (all
    three release the GIL for most of their work). An exception reaches the consumer; a
    consumer that stops stops the thread, which closes ``batches``."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    end = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def run() -> None:
        it = iter(batches)
        try:
            for batch in it:
                if not put(batch):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(e)
            return
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        put(end)

    thread = threading.Thread(target=run, daemon=True, name="pgcdc-snapshot-read")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _write_batches(batches, schema, path: str, plain=()) -> tuple[int, int]:
    import pyarrow.parquet as pq

    batches = _ahead(batches)  # the next batches read while this one is written

    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    rows = 0
    codec = _compression(schema, set(plain)) if plain else "snappy"
    try:
        # no dictionary pages: a third less time writing, about a tenth more bytes
        with pq.ParquetWriter(tmp, schema, compression=codec, use_dictionary=False) as w:
            for batch in batches:
                w.write_batch(batch)
                rows += batch.num_rows
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return rows, os.path.getsize(path)


def _to_batch(pa, rows: list[tuple], converter: RowConverter, schema, commit_lsn: int):
    """Loaded rows -> one RecordBatch of ``schema`` (columns, _pg_text, _commit_lsn, ...)."""
    convert = converter.convert
    typed, special = [], []
    for row in rows:
        values, sp = convert(row)
        typed.append(values)
        special.append(sp)
    n = len(rows)
    ncols = len(converter.names)
    columns = list(zip(*typed)) if typed else [()] * ncols
    arrays = [pa.array(columns[i], type=schema.field(i).type) for i in range(ncols)]
    arrays.append(pa.array(special, type=schema.field(ncols).type))
    arrays.append(pa.array([commit_lsn] * n, type=pa.int64()))
    arrays.append(pa.array([0] * n, type=pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass
class SnapshotResult:
    """What :func:`take_snapshot` wrote."""

    slot: str
    consistent_point: int
    snapshot_name: str
    out_dir: str
    tables: dict[str, int] = field(default_factory=dict)  # "<schema>.<table>" -> rows
    keys: dict[str, list[str]] = field(default_factory=dict)
    # "<schema>.<table>" -> its pg_class OID at the snapshot: a table of that name with
    # another OID later was dropped and created again (pgcdc sync snapshots it again)
    oids: dict[str, int] = field(default_factory=dict)
    # "<schema>.<table>" -> the catalog rows that put it in the publications and its
    # partitions, at the snapshot (pgcdc.snapshot.server.table_memberships); None: not known
    members: dict[str, list[str]] | None = None
    # "<schema>.<table>" -> its columns (with their numbers) and storage at the snapshot
    # (pgcdc.snapshot.server.table_shapes): pgcdc sync compares the server's with them
    shapes: dict[str, dict] | None = None
    ranges: int = 0
    peak_task_rss: int = 0  # bytes: the largest peak RSS a task's Python worker reported

    @property
    def rows(self) -> int:
        return sum(self.tables.values())

    def manifest(self) -> dict:
        doc = {
            "slot": self.slot,
            "consistent_point": format_lsn(self.consistent_point),
            "keys": self.keys,
            "oids": self.oids,
            "tables": self.tables,
        }
        if self.members is not None:
            doc["members"] = self.members
        if self.shapes is not None:
            doc["shapes"] = self.shapes
        return doc


def take_snapshot(
    spark,
    dsn: str,
    slot: str,
    publications: Sequence[str],
    out_dir: str | os.PathLike,
    *,
    blocks_per_range: int | None = None,
    range_bytes: int | None = None,
    batch_rows: int = 10_000,
    batch_bytes: int = 16 << 20,
    reader: str | None = None,
    writer: str = "tasks",
    table_attempts: int = 2,
    min_ranges: int | None = None,
    progress=None,
    two_phase: bool = False,
    on_exported=None,
    driver_bytes: int | None = None,
) -> SnapshotResult:
    """Create ``slot`` with an exported snapshot and write its published tables under
    ``out_dir`` (a local or mounted path). The slot must not exist yet. Returns the consistent
    point from which the slot's changes continue (``pgcdc capture --slot slot``).

    Ranges: about ``range_bytes`` of heap and TOAST each (default 128 MiB), or
    ``blocks_per_range`` heap blocks when given; a table gets at least ``min_ranges`` ranges
    (default: the session's default parallelism) when it has that many blocks. ``reader``: ``"arrow"`` (binary COPY typed
    into Arrow by the ADBC PostgreSQL driver; the default when ``adbc-driver-postgresql`` is
    installed) or ``"text"`` (text COPY, a Python value per value). ``writer``: ``"tasks"``
    (each task writes its range's Parquet file itself, with pyarrow: the fast path; ``out_dir``
    must be reachable by every executor) or ``"spark"`` (Spark's Parquet writer). With
    ``"tasks"``, a table of at most ``driver_bytes`` (default :data:`DRIVER_TABLE_BYTES`; 0:
    none) is read by the driver itself, range by range, as a task would: no Spark job.

    Resumable within the run: a table whose job fails is run again, up to
    ``table_attempts`` times, for the ranges not yet written, while the exported snapshot is
    alive. A run that dies leaves no ``_snapshot.json``; the next run on the same ``out_dir``
    says why it starts over (the exported snapshot ended with the run that made it) and does.

    ``progress``: a callable taking a dict (table, ranges done/total, rows, bytes, rate,
    ETA), ``False`` for none, or None: a line on stderr when it is a terminal, else JSON
    lines on the ``pgcdc.snapshot.server`` logger.

    ``on_exported(ExportedSnapshot)``, when given, is called once the snapshot is exported and
    before any table is read (the snapshot is importable during the call: e.g. a check that
    reads it too, or a log line)."""
    import psycopg

    out = os.fspath(out_dir)
    reader = reader or _default_reader()
    if reader not in ("arrow", "text") or writer not in ("tasks", "spark"):
        raise ValueError(f"reader must be arrow or text, writer tasks or spark: {reader} {writer}")
    _start_over(dsn, out, slot)
    holder = pgsnap.SlotSnapshot(dsn, slot, two_phase=two_phase).open()
    done = False
    report = _Progress.make(progress)
    try:
        exp = holder.exported
        os.makedirs(out, exist_ok=True)
        started = {"slot": slot, "snapshot": exp.snapshot_name,
                   "consistent_point": exp.consistent_point_text}  # fmt: skip
        write_json(os.path.join(out, PROGRESS), started)
        if on_exported is not None:
            on_exported(exp)
        with psycopg.connect(dsn, autocommit=True, application_name="pgcdc snapshot") as conn:
            tables = pgsnap.list_published_tables(conn, publications)
            catalog = pgsnap.catalog_docs(conn, tables)
            members = pgsnap.memberships_or_none(conn, publications, tables)
            shapes = pgsnap.table_shapes(conn, tables)
        # the tables planned: a rerun after a kill says how far this one got (of them all, not
        # only of the tables begun)
        write_json(os.path.join(out, PROGRESS),
                   dict(started, tables=[t.qualified_name for t in tables]))  # fmt: skip
        result = SnapshotResult(slot, exp.consistent_point, exp.snapshot_name, out,
                                members=members, shapes=shapes)  # fmt: skip
        spark.dataSource.register(SnapshotDataSource)
        spark.dataSource.register(SnapshotFilesDataSource)
        options = {
            "dsn": dsn,
            "snapshot": exp.snapshot_name,
            "commit_lsn": str(exp.consistent_point),
            "batch_rows": str(batch_rows),
            "batch_bytes": str(batch_bytes),
            "reader": reader,
            "catalog": json.dumps(catalog),
            "driver_bytes": str(DRIVER_TABLE_BYTES if driver_bytes is None else driver_bytes),
        }
        for t in tables:
            ranges = pgsnap.plan_ranges(
                [t],
                blocks_per_range=blocks_per_range,
                range_bytes=range_bytes,
                min_ranges=min_ranges or _parallelism(spark),
            )
            path = os.path.join(out, t.qualified_name)
            opts = dict(options, table=json.dumps(t.to_dict()))
            if writer == "spark":
                _spark_write(spark, opts, ranges, path)
            else:
                rss = _write_table(spark, opts, t, ranges, path, table_attempts, report)
                result.peak_task_rss = max(result.peak_task_rss, rss)
            result.tables[t.qualified_name] = _count_rows(path)
            write_json(os.path.join(path, TABLE_DONE), {
                "slot": slot, "snapshot": exp.snapshot_name,
                "consistent_point": exp.consistent_point_text,
                "rows": result.tables[t.qualified_name], "ranges": len(ranges),
            })  # fmt: skip
            result.ranges += len(ranges)
            result.oids[t.qualified_name] = t.oid
            if t.key:
                result.keys[t.qualified_name] = list(t.key)
        holder.close()  # every task has read its range: the snapshot may go
        write_json(os.path.join(out, MANIFEST), result.manifest())
        os.unlink(os.path.join(out, PROGRESS))
        done = True
        return result
    finally:
        report.close()
        holder.close()
        if not done:
            _drop_slot(dsn, slot)


def _parallelism(spark) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect: no SparkContext
        return 1


def _start_over(dsn: str, out: str, slot: str) -> None:
    """Clear what an earlier run left in ``out``: a complete snapshot's manifest (this run
    replaces it, and must not leave it over a half-written one), or an unfinished run's
    tables. An unfinished run cannot be continued in another process: its exported snapshot
    ended with the replication connection that made it, and tables read at another snapshot
    would not line up with the slot's consistent point. Its slot, when named the same and not
    in use, is dropped (a run killed before its own clean-up leaves it)."""
    import shutil

    if not os.path.isdir(out):
        return
    manifest = os.path.join(out, MANIFEST)
    if os.path.exists(manifest):
        os.unlink(manifest)
    progress = os.path.join(out, PROGRESS)
    if not os.path.exists(progress):
        return
    with open(progress) as f:
        old = json.load(f)
    tables = [
        e.name for e in os.scandir(out)
        if e.is_dir() and not e.name.startswith(("_", "."))
    ]  # fmt: skip
    finished = [n for n in tables if os.path.exists(os.path.join(out, n, TABLE_DONE))]
    planned = old.get("tables") or tables  # (a run killed before it listed them: those begun)
    _log.warning(
        "%s holds an unfinished snapshot of slot %s (consistent point %s; %d of %d tables "
        "finished): its exported snapshot ended with the run that made it, so the tables "
        "left cannot be read at it any more; starting over",
        out, old.get("slot"), old.get("consistent_point"), len(finished), len(planned),
    )  # fmt: skip
    if old.get("slot") == slot:
        _drop_dead_slot(dsn, slot)
    for n in tables:
        shutil.rmtree(os.path.join(out, n), ignore_errors=True)
    os.unlink(progress)


def _drop_dead_slot(dsn: str, slot: str, wait: float = 10.0) -> None:
    """Drop the slot an unfinished run left, once no process uses it: the server ends the
    dead run's replication connection when it sees the socket closed, which may take a
    moment. Still in use after ``wait`` seconds: a run may be going on, so say so and stop."""
    import time

    import psycopg

    deadline = time.monotonic() + wait
    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc snapshot") as conn:
        while True:
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", [slot]
            ).fetchone()
            if row is None:
                return
            if row[0] is None:
                conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
                return
            if time.monotonic() >= deadline:
                raise pgsnap.SnapshotError(
                    f"slot {slot} of the unfinished snapshot is still in use by server process"
                    f" {row[0]}: is that run still going? Stop it, or use another slot"
                )
            time.sleep(0.2)


def _spark_write(spark, options: dict, ranges, path: str) -> None:
    df = spark.read.format(FORMAT).options(**options)
    df = df.option("ranges", json.dumps([[r.index, r.lo_block, r.hi_block] for r in ranges]))
    with _int64_timestamps(spark):
        df.load().write.mode("overwrite").parquet(path)


# a table of at most this many bytes (heap and TOAST) is read by the driver itself: a Spark
# job's fixed cost (about 0.25 s) was most of a small table's time, and a publication of a
# thousand small tables spent minutes on it
DRIVER_TABLE_BYTES = 8 << 20


def _run_ranges(spark, options, table, ranges, path: str) -> list[tuple]:
    """One Spark job, a task per range, each writing its range's file: (range, rows, bytes,
    peak RSS) per range. Through an RDD of the ranges where the session has a SparkContext
    (a Python data source costs a Python planning round and more per job: about 0.15 s of a
    warm local[2] session, every table), else (Spark Connect) through ``pgcdc_snapshot_files``."""
    if table.bytes <= int(options.get("driver_bytes") or 0):  # read here, as a task would
        reader = _FilesReader(table, dict(options, path=path))
        return [row for r in ranges for row in reader.read(_Range(r.index, r.lo_block, r.hi_block))]
    sc = _spark_context(spark)
    if sc is None:
        plan = json.dumps([[r.index, r.lo_block, r.hi_block] for r in ranges])
        df = spark.read.format(FILES_FORMAT).options(**options).option("path", path)
        return [tuple(row) for row in df.option("ranges", plan).load().collect()]
    reader = _FilesReader(table, dict(options, path=path))
    parts = [_Range(r.index, r.lo_block, r.hi_block) for r in ranges]
    return sc.parallelize(parts, len(parts)).flatMap(reader.read).collect()


def _spark_context(spark):
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext
        return None


def _write_table(spark, options, table, ranges, path: str, attempts: int, report) -> int:
    """One Spark job over the ranges not written yet; again while some fail and attempts
    are left (the exported snapshot is still alive: the same rows are read)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    report.table(table, ranges, path)
    peak = 0
    for attempt in range(1, max(1, attempts) + 1):
        pending = [r for r in ranges if not os.path.exists(os.path.join(path, part_name(r.index)))]
        if not pending:
            break
        try:
            for row in _run_ranges(spark, options, table, pending, path):
                peak = max(peak, row[3])
        except Exception as e:
            if attempt >= attempts:
                raise
            _log.warning(
                "%s: %d of %d ranges failed (%s); reading them again at the same snapshot",
                table.qualified_name, len(pending), len(ranges), str(e).strip().splitlines()[0],
            )  # fmt: skip
    report.table_done()
    return peak


class _Progress:
    """Rows, bytes, rate and ETA of the table being written, from its finished range files
    (a thread polls the table's directory)."""

    def __init__(self, sink):
        import threading

        self.sink = sink
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.current = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="pgcdc-progress")
        self.thread.start()

    @classmethod
    def make(cls, progress):
        import sys

        if progress is False:
            return _NoProgress()
        if callable(progress):
            return cls(progress)
        if sys.stderr.isatty():
            return cls(_tty_line)
        return cls(lambda d: _log.info(json.dumps(d, sort_keys=True)))

    def table(self, table, ranges, path) -> None:
        import time

        with self.lock:
            self.current = (table, len(ranges), path, time.monotonic(), {})

    def table_done(self) -> None:
        self._emit(final=True)
        with self.lock:
            self.current = None

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self._emit()

    def _emit(self, final: bool = False) -> None:
        import time

        import pyarrow.parquet as pq

        with self.lock:
            if self.current is None:
                return
            table, nranges, path, started, seen = self.current
            try:
                for e in os.scandir(path):
                    if e.name.startswith("part-") and e.name not in seen:
                        seen[e.name] = pq.read_metadata(e.path).num_rows
            except OSError:
                return
        done = len(seen)
        rows = sum(seen.values())
        src = int(table.bytes * done / nranges) if nranges else 0
        secs = max(time.monotonic() - started, 1e-6)
        left = nranges - done
        eta = secs / done * left if done else None
        self.sink({
            "event": "snapshot_progress", "table": table.qualified_name, "ranges": nranges,
            "ranges_done": done, "rows": rows, "rows_estimate": table.rows_estimate,
            "bytes": src, "bytes_total": table.bytes, "seconds": round(secs, 1),
            "rows_per_s": round(rows / secs), "mb_per_s": round(src / secs / 1e6, 1),
            "eta_s": None if eta is None else round(eta, 1), "done": final,
        })  # fmt: skip

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


class _NoProgress:
    def table(self, *a) -> None:
        pass

    def table_done(self) -> None:
        pass

    def close(self) -> None:
        pass


def _mb(n: float) -> str:
    """Megabytes for the progress line: a tenth below 10 MB (a small table is not 0/0 MB)."""
    return f"{n / 1e6:,.1f}" if n < 10e6 else f"{n / 1e6:,.0f}"


def _tty_line(d: dict) -> None:
    import sys

    eta = "" if d["eta_s"] is None else f", ETA {d['eta_s']:.0f}s"
    line = (
        f"\r{d['table']}: {d['ranges_done']}/{d['ranges']} ranges, {d['rows']:,} rows, "
        f"{_mb(d['bytes'])}/{_mb(d['bytes_total'])} MB, "
        f"{d['rows_per_s']:,} rows/s, {d['mb_per_s']} MB/s{eta}\x1b[K"
    )
    sys.stderr.write(line + ("\n" if d["done"] else ""))
    sys.stderr.flush()


@contextlib.contextmanager
def _int64_timestamps(spark):
    """Parquet timestamps as INT64 microseconds (not Spark's default, the deprecated INT96)
    for this write, whatever session the caller passed."""
    key = "spark.sql.parquet.outputTimestampType"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def _count_rows(path: str) -> int:
    import pyarrow.dataset as ds

    return ds.dataset(path, format="parquet").count_rows()


def _drop_slot(dsn: str, slot: str) -> None:
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                [slot],
            )
    except psycopg.Error:
        pass  # the original error matters more; the slot may be dropped by hand
