"""The initial snapshot on Spark: a slot's published tables, read at the slot's exported
snapshot by Spark tasks, written as Parquet following the snapshot contract of
:mod:`pgcdc.spark.apply`.

::

    from pgcdc.spark.snapshot import take_snapshot
    result = take_snapshot(spark, dsn, "cdc", ["app_pub"], "snapshot/")
    # then: pgcdc capture --slot cdc ... (it starts at result.consistent_point)

The driver creates the slot with an exported snapshot (:class:`pgcdc.snapshot.SlotSnapshot`)
and keeps that replication connection open while the tasks run. Each table is one Spark job
of the ``pgcdc_snapshot`` Python Data Source: one partition per range of heap blocks, and each
task opens its own connection, imports the snapshot (``SET TRANSACTION SNAPSHOT``), reads its
range through ``COPY (SELECT ...) TO STDOUT`` and yields typed Arrow batches (types and values
by :mod:`pgcdc.spark.types`, the same as change events). Nothing goes through the driver.

Output (the contract in :mod:`pgcdc.spark.apply`):

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
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .. import snapshot as pgsnap
from ..lsn import format_lsn
from .types import SPECIAL_COLUMN, RowConverter, columns_schema

__all__ = [
    "COMMIT_LSN_COLUMN",
    "TX_ORDINAL_COLUMN",
    "SnapshotDataSource",
    "SnapshotResult",
    "table_schema",
    "take_snapshot",
]

FORMAT = "pgcdc_snapshot"
COMMIT_LSN_COLUMN = "_commit_lsn"
TX_ORDINAL_COLUMN = "_tx_ordinal"
MANIFEST = "_snapshot.json"


def table_schema(table: pgsnap.PublishedTable):
    """The Spark schema of a table's snapshot: its columns, then the contract's columns."""
    from pyspark.sql.types import LongType, MapType, StringType, StructField

    schema = columns_schema(table.names, table.type_oids, [c.type_modifier for c in table.columns])
    schema.add(StructField(SPECIAL_COLUMN, MapType(StringType(), StringType(), True), True))
    schema.add(StructField(COMMIT_LSN_COLUMN, LongType(), False))
    schema.add(StructField(TX_ORDINAL_COLUMN, LongType(), False))
    return schema


class _Range(InputPartition):
    def __init__(self, index: int, lo_block: int, hi_block: int | None):
        super().__init__((index, lo_block, hi_block))
        self.index, self.lo_block, self.hi_block = index, lo_block, hi_block


class SnapshotDataSource(DataSource):
    """``spark.read.format("pgcdc_snapshot")`` over one table at an exported snapshot.

    Options: ``dsn``, ``snapshot`` (the exported snapshot's name), ``table`` (JSON of
    :meth:`pgcdc.snapshot.PublishedTable.to_dict`), ``commit_lsn`` (the consistent point, an
    integer), ``blocks_per_range`` (default 4096) and ``batch_rows`` (default 10000)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _table(self) -> pgsnap.PublishedTable:
        return pgsnap.PublishedTable.from_dict(json.loads(self.options["table"]))

    def schema(self):
        return table_schema(self._table())

    def reader(self, schema) -> DataSourceReader:
        return _SnapshotReader(self._table(), dict(self.options))


class _SnapshotReader(DataSourceReader):
    def __init__(self, table: pgsnap.PublishedTable, options: dict):
        self.table = table
        self.dsn = options["dsn"]
        self.snapshot = options["snapshot"]
        self.commit_lsn = int(options["commit_lsn"])
        self.blocks_per_range = int(options.get("blocks_per_range", 4096))
        self.batch_rows = int(options.get("batch_rows", 10_000))

    def partitions(self) -> Sequence[InputPartition]:
        ranges = pgsnap.plan_ranges([self.table], blocks_per_range=self.blocks_per_range)
        return [_Range(r.index, r.lo_block, r.hi_block) for r in ranges]

    def read(self, partition: _Range) -> Iterator:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        t = self.table
        rng = pgsnap.TableRange(t, partition.index, partition.lo_block, partition.hi_block)
        arrow_schema = to_arrow_schema(table_schema(t), timezone="UTC")
        converter = RowConverter(t.names, t.type_oids, [c.type_modifier for c in t.columns])
        conn = pgsnap.open_snapshot_connection(self.dsn, self.snapshot)
        try:
            for rows in pgsnap.read_range(conn, rng, batch_rows=self.batch_rows):
                yield _to_batch(pa, rows, converter, arrow_schema, self.commit_lsn)
        finally:
            conn.close()


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
    ranges: int = 0

    @property
    def rows(self) -> int:
        return sum(self.tables.values())

    def manifest(self) -> dict:
        return {
            "slot": self.slot,
            "consistent_point": format_lsn(self.consistent_point),
            "keys": self.keys,
            "tables": self.tables,
        }


def take_snapshot(
    spark,
    dsn: str,
    slot: str,
    publications: Sequence[str],
    out_dir: str | os.PathLike,
    *,
    blocks_per_range: int = 4096,
    batch_rows: int = 10_000,
    two_phase: bool = False,
    on_exported=None,
) -> SnapshotResult:
    """Create ``slot`` with an exported snapshot and write its published tables under
    ``out_dir`` (a local or mounted path). The slot must not exist yet. Returns the consistent
    point from which the slot's changes continue (``pgcdc capture --slot slot``).

    ``on_exported(ExportedSnapshot)``, when given, is called once the snapshot is exported and
    before any table is read (the snapshot is importable during the call: e.g. a check that
    reads it too, or a log line)."""
    import psycopg

    out = os.fspath(out_dir)
    holder = pgsnap.SlotSnapshot(dsn, slot, two_phase=two_phase).open()
    done = False
    try:
        exp = holder.exported
        if on_exported is not None:
            on_exported(exp)
        with psycopg.connect(dsn, autocommit=True, application_name="pgcdc snapshot") as conn:
            tables = pgsnap.list_published_tables(conn, publications)
        result = SnapshotResult(slot, exp.consistent_point, exp.snapshot_name, out)
        spark.dataSource.register(SnapshotDataSource)
        os.makedirs(out, exist_ok=True)
        for t in tables:
            path = os.path.join(out, t.qualified_name)
            df = (
                spark.read.format(FORMAT)
                .option("dsn", dsn)
                .option("snapshot", exp.snapshot_name)
                .option("table", json.dumps(t.to_dict()))
                .option("commit_lsn", str(exp.consistent_point))
                .option("blocks_per_range", str(blocks_per_range))
                .option("batch_rows", str(batch_rows))
                .load()
            )
            with _int64_timestamps(spark):
                df.write.mode("overwrite").parquet(path)
            result.tables[t.qualified_name] = _count_rows(path)
            result.ranges += len(pgsnap.plan_ranges([t], blocks_per_range=blocks_per_range))
            if t.key:
                result.keys[t.qualified_name] = list(t.key)
        holder.close()  # every task has read its range: the snapshot may go
        tmp = os.path.join(out, MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(result.manifest(), f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(out, MANIFEST))
        done = True
        return result
    finally:
        holder.close()
        if not done:
            _drop_slot(dsn, slot)


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
