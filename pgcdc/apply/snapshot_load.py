"""A snapshot table loaded as its Delta table's first version in the driver, without a Spark
job: what the first cycle of ``pgcdc sync`` does for every table of its initial snapshot,
where Spark's fixed cost per table (its window, its range sampling and its write: about 0.6 s
a table on 2 cores) made a publication of 70 small tables take 44 s before the first change.

The same rows and the same schema as Spark's path writes (:func:`pgcdc.apply.run._spark_files`
over the snapshot's rows): the Spark types Spark gives the snapshot's Parquet files, back in
Arrow as Spark's tasks write them, the columns under their stored names
(:mod:`pgcdc.spark.names`), in key order. Only where that is plainly the same result:

- SCD1, no change of the table to apply on top (none in the captures, or all before the
  snapshot's point);
- a plain Parquet snapshot (what :mod:`pgcdc.snapshot.job` writes) with pgcdc's columns and
  exactly the columns the run names, of at most :data:`SNAPSHOT_BYTES`.

Any other table is loaded by Spark as before (:func:`load_files` returns None).
"""

from __future__ import annotations

from pathlib import Path

from pgcdc.apply import delta
from pgcdc.apply.scd import META, SCD2_META, SPECIAL, state_columns
from pgcdc.spark.names import stored_names

__all__ = ["SNAPSHOT_BYTES", "load_files"]

SNAPSHOT_BYTES = 64 << 20  # a snapshot table's Parquet bytes loaded here at most (read whole)


def load_files(uri: str, path: str, keys, columns, run: str):
    """Write the first version's files of the table at ``uri`` from the snapshot table at
    ``path``: (the files, commit() arguments, its summary entry) as
    :func:`pgcdc.apply.run._spark_files` returns them, or None when Spark is to load it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema  # lazy: pyspark (no JVM)
    from pyspark.sql.types import StructField, StructType  # lazy: pyspark (no JVM)

    from pgcdc.apply.driver import by_key, write  # lazy: pyarrow

    root = Path(path)
    if not root.is_dir() or delta.is_delta_table(path):
        return None  # a Delta snapshot may store its columns under other names
    files = sorted(p for p in root.rglob("*.parquet") if not p.name.startswith((".", "_")))
    if sum(p.stat().st_size for p in files) > SNAPSHOT_BYTES:
        return None
    if not files:
        return None  # (no schema to read: Spark's path says what it says of it)
    table = pa.concat_tables([pq.read_table(p) for p in files], promote_options="none")
    skip = {SPECIAL, *META, *SCD2_META, "_is_current"}
    have = [c for c in table.column_names if c not in skip]
    if columns is not None and list(columns) != have:
        return None  # columns added or dropped since: Spark's path makes them so
    if SPECIAL not in table.column_names or any(m not in table.column_names for m in META):
        return None
    stored = stored_names(have, None, reserved=state_columns((), 1))
    table = table.select(state_columns(have, 1))
    # the Spark schema Spark reads these files with, under the stored names, and the Arrow
    # schema its tasks write from that: the table's schema is the same whoever loads it
    spark_schema = from_arrow_schema(table.schema)
    spark_schema = StructType(
        [StructField(stored.get(f.name, f.name), f.dataType, f.nullable) for f in spark_schema]
    )
    schema = delta.arrow_schema(spark_schema, {s: c for c, s in stored.items()})
    table = table.rename_columns(schema.names).cast(schema)
    if keys:
        table = by_key(table, [stored[k] for k in keys])
    written = write(uri, delta.attempt_dir(run), table)
    entry = {
        "keys": list(keys) if keys else None,
        "columns": have,
        **(
            {"names": {s: c for c, s in stored.items() if s != c}}
            if stored != {c: c for c in have}
            else {}
        ),
        "files_removed": 0,
        "files_added": len(written),
        "bytes_removed": 0,
        "bytes_added": sum(f.size for f in written),
    }
    return written, {"schema": schema, "remove": None, "overwrite": False}, entry
