"""A small run of apply in the driver, without a Spark job: what ``pgcdc sync`` does every
trigger, where Spark's fixed cost per job (a few tenths of a second each, six of them) was
most of a cycle.

The same operations as the tasks make (:func:`pgcdc.apply.ops.ops_to_batches`, reduced to
each key's last change), the same statistics, the same commit (:func:`pgcdc.apply.delta.commit`
with the table's position): only the new version's files are computed with pyarrow here
instead of Spark's window over the table. That is done only where it is plainly the same
result, per table:

- SCD1, a table with a key, already a Delta table, rewriting by files;
- no truncate and no unchanged TOAST column among its changes (both look back at rows a
  window orders; Spark does those);
- every changed key is a value (no key the type cannot hold, whose text is in ``_pg_text``);
- the rows have exactly the table's columns and types (no column added or retyped).

A table that is not such is written by Spark in the same run (:func:`table_files` returns
None), and so is every table of a run over more than :data:`DRIVER_BYTES` of records, and a
table whose files to rewrite hold more than :data:`REWRITE_BYTES` (they are read whole here).

Files: the new version removes the files that hold a changed key (found by the key's
statistics, then by reading the key columns) and, in a run of fewer than :data:`SMALL_ROWS`
upserts, the files under that many rows (else a cycle a second would add a file a second;
a run of more writes a file large enough, and leaves them to the next small one), and adds
their other rows and the upserts, sorted by the key, in files of up to :data:`FILE_ROWS`
rows (tight key ranges: the next cycle's changed keys name few files).

``pgcdc sync`` imports this module at its start (:func:`warm_up`, :data:`DRIVER_BYTES`),
while its capture starts: the modules a cycle needs (the operations, the types: psycopg and
the codec, 0.3 s that hold the GIL) are imported where they are used, or by the warm-up's
thread (the imports marked ``# lazy: sync's start``).
"""

from __future__ import annotations

from types import SimpleNamespace

from pgcdc.apply import delta

DRIVER_BYTES = 64 << 20  # records a run reads at most to be applied in the driver
# Parquet bytes of a table's files a run may rewrite in the driver: they are read whole into
# memory here (changed keys all over a large table would hold all of it); past that, Spark's
REWRITE_BYTES = 128 << 20
FILE_ROWS = 250_000  # rows per file written here
SMALL_ROWS = 50_000  # a file with fewer rows is merged into the next version's files


class _NoPandas:
    """A finder that refuses ``pandas`` to the threads in ``threads`` (the warm-up's: pyarrow's
    probe for it); any other thread (Spark's start, say) imports it as usual.

    Installed once and never removed: another thread may be walking ``sys.meta_path`` in an
    import at that moment, and a finder taken out of the list before the one it is at shifts
    the rest under it, so it skips the next (the path finder) and reports a module that is
    there as not found (CI saw Spark's start fail so, "No module named
    'pyspark.sql.streaming.listener'"). Put in at the front, it can make such a walk ask a
    finder twice, which is harmless."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def find_spec(self, name, path=None, target=None):
        import threading

        if name == "pandas" and threading.get_ident() in self.threads:
            raise ModuleNotFoundError("not while sync warms up", name=name)
        return None


_NO_PANDAS = _NoPandas()


def _refuse_pandas() -> _NoPandas:
    """The finder of :class:`_NoPandas`, in ``sys.meta_path`` (put there the first time)."""
    import sys

    if _NO_PANDAS not in sys.meta_path:
        sys.meta_path.insert(0, _NO_PANDAS)
    return _NO_PANDAS


def warm_up():
    """Import, in a thread of its own, what a cycle in the driver uses: pyarrow's compute,
    Parquet, file systems and Acero, and delta-rs. A new process's first cycle paid them,
    half a second, while sync waited idle for its capture's first durable records.

    Without pandas: pyarrow probes for it on its first Python scalar (``pyarrow.dataset``'s
    import makes one) and would import it, 0.24 s of a core that the capture and the
    walsender need while a rerun's backlog comes in, for nothing the driver uses. The probe
    only decides how pyarrow reads Python sequences; what needs pandas (``to_pandas``,
    Spark's Arrow conversions) imports it again when asked (pyarrow's ``_check_import``)."""
    import sys
    import threading

    finder = _refuse_pandas() if "pandas" not in sys.modules else None

    def imports() -> None:
        if finder is not None:
            finder.threads.add(threading.get_ident())
        try:
            import deltalake  # noqa: F401
            import numpy.ma  # noqa: F401 - pyarrow looks for it at its first numpy array (15 ms)
            import pyarrow as pa
            import pyarrow.acero  # noqa: F401
            import pyarrow.compute  # noqa: F401
            import pyarrow.fs  # noqa: F401
            import pyarrow.parquet  # noqa: F401

            # and a cycle's own modules
            from pgcdc.capture import segments  # lazy: the warm-up's  # noqa: F401
            from pgcdc.spark import ship, text_arrow  # lazy: the warm-up's  # noqa: F401

            pa.array([0])
        except ImportError:
            pass  # the cycle that needs it says so
        finally:
            if finder is not None:
                finder.threads.discard(threading.get_ident())

    thread = threading.Thread(target=imports, name="pgcdc-warm-up", daemon=True)
    thread.start()
    return thread


def run_bytes(ce) -> int:
    """Bytes of records the run's units read (about: from each part's start offset)."""
    import os

    total = 0
    for unit in ce.units:
        for _no, path, fend, _i, start, _j, end, *_rest in unit.files:
            if end is None:
                end = fend if fend is not None else os.path.getsize(path)
            total += end - (start or 0)
    return total


def driver_ops(ce, keys: dict):
    """(an Arrow table of the run's operations, an accumulator-like ``.value`` of their
    statistics), computed here as the tasks would (reduced: SCD1)."""
    import pyarrow as pa

    from pgcdc.apply.ops import ops_arrow_schema, ops_to_batches  # lazy: sync's start
    from pgcdc.spark.table_batches import EventStats  # lazy: sync's start

    schema = ops_arrow_schema(ce.tables)  # without Spark, which may not have started yet
    found: dict = {}
    parts = []
    for unit in ce.units:
        stats = {"after": ce.min_commit_lsn}
        parts.extend(ops_to_batches(unit, ce.tables, schema, keys, reduce=True,
                                    lenient=ce.lenient, stats=stats))  # fmt: skip
        EventStats.addInPlace(found, stats["tables"])
    return pa.Table.from_batches(parts, schema=schema), SimpleNamespace(value=found)


def table_files(uri, name, ce, ops, keys, columns, st, position, run, dt=None):
    """Write the new files of table ``name`` (a Delta table at ``uri``, ``dt`` when the
    caller has it open) from the run's operations ``ops``: (the files, commit() arguments,
    its summary entry) as :func:`pgcdc.apply.run._spark_files` returns them, or None
    when this table is for Spark (see the module docstring; nothing is left written then)."""
    import pyarrow as pa

    if not keys or st is None or st["unchanged"]:
        return None
    if st["truncate"] is not None and (position is None or st["truncate"]["commit_lsn"] > position):
        return None
    ts = ce.tables[name]
    dt = dt or delta.open_table(uri)
    stored = delta.column_names(uri, dt)  # the files' names of the columns (pgcdc.spark.names)
    if any(c not in stored for c in columns):
        return None  # a column added: Spark writes every row anew
    rows = _rows(ops, list(ce.tables).index(name), ts, keys, columns, position, stored)
    if rows is None:
        return None
    pg_keys, keys = keys, [stored[k] for k in keys]
    schema = delta._arrow(dt.schema())
    if not delta.same_schema(uri, rows.select(rows.column_names[:-2]).schema, dt):
        return None  # a column added or retyped: Spark writes every row anew
    written = []
    try:
        reduced = _last_per_key(rows, keys)
        upserts = _where(reduced, reduced.column("_upsert")).select(schema.names).cast(schema)
        changed = reduced.select(keys)
        current = delta.current_files(uri, dt)
        remove = _files_holding(uri, keys, changed, current, dt)
        if upserts.num_rows < SMALL_ROWS:  # a run of many rows writes a file large enough;
            # the small ones are merged by the next small run (a burst rewrote them each time)
            remove |= {p for p, _s, r in current if r is not None and r < SMALL_ROWS}
        gone = [(p, s) for p, s, _r in current if p in remove]
        if sum(s for _p, s in gone) > REWRITE_BYTES:
            return None
        kept = [_without(_read(uri, p, schema), keys, changed) for p in sorted(remove)]
        state = pa.concat_tables([*kept, upserts])
        written = write(uri, delta.attempt_dir(run), by_key(state, keys))
    except (pa.ArrowException, OSError):
        if written:
            delta.delete_files(uri, written)
        return None
    entry = {
        "keys": list(pg_keys),
        "columns": list(columns),
        "files_removed": len(gone),
        "files_added": len(written),
        "bytes_removed": sum(s for _p, s in gone),
        "bytes_added": sum(f.size for f in written),
        "applied_by": "driver",
    }
    return written, {"schema": schema, "remove": gone, "overwrite": False}, entry


def _rows(ops, number: int, ts, keys, columns, position, stored):
    """The table's operations as rows of its columns (under their ``stored`` names), then
    ``_pg_text``, ``_commit_lsn``, ``_tx_ordinal``, ``_sub``, ``_upsert``; None when a key
    column is missing or null (a value the type cannot hold: Spark keys it by its text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from pgcdc.apply.ops import special_column, value_column  # lazy: sync's start
    from pgcdc.spark import types as pgtypes  # lazy: sync's start

    mine = _where(ops, pc.equal(ops.column("_t"), number))
    if position is not None:
        mine = _where(mine, pc.greater(mine.column("_commit_lsn"), position))
    if any(k not in ts.names for k in keys) or any(c not in ts.names for c in columns):
        return None
    cols = {stored[c]: mine.column(value_column(number, ts.names.index(c))) for c in columns}
    if any(cols[stored[k]].null_count for k in keys):
        return None
    cols[pgtypes.SPECIAL_COLUMN] = mine.column(special_column(number))
    for c in ("_commit_lsn", "_tx_ordinal", "_sub", "_upsert"):
        cols[c] = mine.column(c)
    return pa.table(cols)


def _where(table, mask):
    """``table``'s rows where ``mask`` holds: ``table`` itself when it holds for every row
    (one table's run after the tables' position, the usual cycle), which a filter would copy
    column by column (20-35 ms per 100,000 rows of the bench's five columns)."""
    import pyarrow.compute as pc

    if not mask.null_count and pc.all(mask).as_py():
        return table
    return table.filter(mask)


def _last_per_key(rows, keys):
    """Each key's last operation by (commit LSN, ordinal, sub): an upsert writes the row, a
    delete removes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) == 1 and (
        _ascending(rows, keys) or pc.count_distinct(rows.column(keys[0])).as_py() == rows.num_rows
    ):  # (the order checked first: 0.3 ms where counting takes 45 ms per 200,000 rows)
        return rows  # one operation per key already (a unit's are reduced): nothing to pick
    rows = rows.sort_by(
        [("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending"), ("_sub", "ascending")]
    )
    rows = rows.append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    last = (
        rows.select([*keys, "_row"]).group_by(keys, use_threads=False).aggregate([("_row", "max")])
    )
    return rows.take(last.column("_row_max").combine_chunks().sort()).drop_columns(["_row"])


def by_key(table, keys):
    """``table`` sorted by ``keys`` (files of tight key ranges: a later run's changed keys name
    few of them); as it is when Arrow cannot order a key (still right, only looser files)."""
    import pyarrow as pa

    try:
        if not _ascending(table, keys):
            table = table.sort_by([(k, "ascending") for k in keys])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    return table


def _ascending(table, keys) -> bool:
    """Whether ``table`` is in ascending order of its one integer key already: inserts of
    growing keys, the usual burst, come that way (their sort cost 15-60 ms per 200,000 rows)."""
    import numpy as np
    import pyarrow.types as pt

    if len(keys) != 1 or not pt.is_integer(table.schema.field(keys[0]).type):
        return False
    k = table.column(keys[0]).to_numpy()  # no nulls: checked before
    return bool(np.all(k[1:] > k[:-1]))


def _files_holding(uri, keys, changed, current, dt) -> set:
    """The current files (of ``dt``, the table open) that hold one of the ``changed`` keys:
    those whose statistics may (one integer key), then among them those whose key columns
    do."""
    import numpy as np
    import pyarrow.types as pt

    paths = [p for p, _s, _r in current]
    if len(keys) == 1 and pt.is_integer(changed.schema.field(keys[0]).type):
        ranges = delta.key_ranges(uri, keys[0], dt)
        if ranges is not None:
            values = np.sort(changed.column(keys[0]).to_numpy())  # no nulls: checked before
            paths = []
            for path, (lo, hi, _nulls) in ranges.items():
                if lo is None:
                    continue
                i = int(np.searchsorted(values, lo))
                if i < len(values) and values[i] <= hi:
                    paths.append(path)
    return {p for p in paths if _hits(_read(uri, p, None, keys), keys, changed).any()}


def _hits(table, keys, changed):
    """numpy bools: the rows of ``table`` whose key is among ``changed``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) == 1:
        hit = pc.is_in(table.column(keys[0]), value_set=changed.column(keys[0]).combine_chunks())
        return hit.to_numpy(zero_copy_only=False).astype(bool)
    index = table.select(keys).append_column("_i", pa.array(np.arange(table.num_rows)))
    found = index.join(changed.select(keys), keys, join_type="left semi")
    out = np.zeros(table.num_rows, bool)
    out[found.column("_i").to_numpy()] = True
    return out


def _apart(column, changed) -> bool:
    """Whether two integer key columns' ranges do not meet (a small file merged into a
    burst's new keys): no key can be in both, and no hash set of ``changed`` is needed.
    (:func:`_files_holding` reads only files whose statistics meet the changed keys.)"""
    import pyarrow.compute as pc
    import pyarrow.types as pt

    if not (pt.is_integer(column.type) and pt.is_integer(changed.type)):
        return False
    if not len(column) or not len(changed):
        return True
    a, b = pc.min_max(column), pc.min_max(changed)
    lo_a, hi_a, lo_b, hi_b = (x.as_py() for x in (a["min"], a["max"], b["min"], b["max"]))
    if None in (lo_a, lo_b):  # only nulls on a side: looked up key by key
        return False
    return hi_a < lo_b or hi_b < lo_a


def _without(table, keys, changed):
    """``table``'s rows whose key is not among ``changed`` (``table`` itself when their key
    ranges do not meet)."""
    import numpy as np
    import pyarrow as pa

    if len(keys) == 1 and _apart(table.column(keys[0]), changed.column(keys[0])):
        return table
    return table.filter(pa.array(~np.asarray(_hits(table, keys, changed))))


def _read(uri: str, path: str, schema, columns=None):
    """A data file of the table (``columns`` only, or all as ``schema``)."""
    import pyarrow.parquet as pq

    fs, root = delta.filesystem(uri)
    with fs.open_input_file(f"{root}/{path}") as fh:
        table = pq.read_table(fh, columns=columns)
    return table if schema is None else table.select(schema.names).cast(schema)


def write(uri: str, subdir: str, state) -> list:
    """``state`` as Parquet files of up to about FILE_ROWS rows under ``uri/subdir/``."""

    if state.num_rows == 0:
        return []
    write = delta._writer_task(uri, subdir, FILE_ROWS, delta.task_env(uri))
    got = []
    for batch in write(iter(state.to_batches(max_chunksize=min(65_536, FILE_ROWS)))):
        got += batch.to_pylist()
    return [delta.DataFile(r["path"], r["size"], r["rows"], r["stats"]) for r in got]
