"""A Python streaming source of a few Arrow batches, for :mod:`.cds`'s workload: the classes
of a Python data source's micro-batches (its offsets process, its tasks' Arrow) go into the
archive as the ``pgcdc`` sources load them."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

ROWS, BATCHES = 10_000, 2


class TinySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pgcdc_cds_tiny"

    def schema(self) -> str:
        return "id long, s string, ts timestamp, tags array<string>"

    def streamReader(self, schema) -> DataSourceStreamReader:
        return _Reader()


class _Reader(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self) -> dict:
        return {"batch": BATCHES}

    def partitions(self, start: dict, end: dict):
        return [InputPartition(b) for b in range(start["batch"], end["batch"])]

    def read(self, partition):
        import pyarrow as pa

        first = partition.value * ROWS
        ids = pa.array(range(first, first + ROWS), type=pa.int64())
        yield pa.RecordBatch.from_arrays(
            [
                ids,
                pa.array([f"row {i}" for i in range(first, first + ROWS)]),
                pa.array(range(first, first + ROWS), type=pa.timestamp("us", tz="UTC")),
                pa.array([None] * ROWS, type=pa.list_(pa.string())),
            ],
            names=["id", "s", "ts", "tags"],
        )

    def commit(self, end: dict) -> None:
        pass
