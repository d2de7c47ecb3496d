"""Delta Lake tables written by Spark tasks and committed by the driver with delta-rs.

No Delta jars are needed: Spark's tasks write Parquet data files (``mapInArrow``, pyarrow,
INT64 microsecond timestamps, the Spark types of the DataFrame) straight into the table's
directory, on a local file system or on object storage, and return each file's name, size,
rows and statistics; the driver then commits them as one Delta version with delta-rs
(``deltalake``), adding those files and removing the ones they replace. A version nobody
committed is invisible: its files are not in the log (``VACUUM`` removes them).

Each commit by ``pgcdc apply`` carries the applied position in two places: an application
transaction (``txn`` action) ``APP_ID`` whose version is the commit LSN of the last
transaction applied (whole transactions are applied, so every change at or before that
commit LSN is in the table, none after it), and the commit's metadata (``pgcdc.commit_lsn``
as PostgreSQL prints it, ``pgcdc.tx_ordinal``: the last change's ordinal in that
transaction, ``pgcdc.run``). Both are written in the same atomic commit as the data.

Locations: a local path (or ``file://``), or ``s3://bucket/prefix``. For S3, delta-rs and
the tasks' pyarrow read the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, and ``AWS_ENDPOINT_URL`` for
an S3-compatible server, ``AWS_ALLOW_HTTP=true`` for plain http). Nothing here puts them in
a commit, a file or a message: :func:`redact` removes their values from any error text.

For the snapshot writer: :func:`commit_parquet_dir` commits a directory of Parquet files that
Spark wrote inside a table's directory as that table's first (or next, replacing) version.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass

from pgcdc.errors import DataError
from pgcdc.spark import names

__all__ = [
    "APP_ID",
    "DataFile",
    "column_names",
    "commit",
    "commit_parquet_dir",
    "is_delta_table",
    "position",
    "read_rows",
    "redact",
    "replace_with_table",
    "table_uri",
    "write_files",
]

APP_ID = "pgcdc-apply"
ROWS_PER_FILE = 1_000_000
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


# --- locations ----------------------------------------------------------------------------------


def is_remote(uri: str) -> bool:
    """True for an object-store URI (``s3://``, ``gs://``, ``az://``...), not a local path."""
    scheme, sep, _ = str(uri).partition("://")
    return bool(sep) and scheme != "file"


def _local(uri: str) -> str:
    uri = str(uri)
    return uri[len("file://") :] if uri.startswith("file://") else uri


def table_uri(root, name: str) -> str:
    """The URI of table ``name`` (``schema.table``) under ``root``."""
    root = str(root)
    return f"{root.rstrip('/')}/{name}" if is_remote(root) else os.path.join(_local(root), name)


_AWS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ALLOW_HTTP",
)


def task_env(uri: str) -> dict:
    """The AWS variables of the driver's environment that the tasks writing or reading under
    ``uri`` need (object storage only). They travel inside the task's closure, not in Spark's
    configuration, so they show in no Spark UI, event log or ``spark.conf``."""
    if not is_remote(uri):
        return {}
    return {k: os.environ[k] for k in _AWS_VARS if os.environ.get(k)}


def filesystem(uri: str, env: dict | None = None):
    """(pyarrow file system, path inside it) of a URI or local path. For S3 the endpoint comes
    from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, credentials from ``AWS_ACCESS_KEY_ID``
    and ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), of ``env`` (default: this
    process's environment; without them, the AWS SDK's own chain)."""
    from pyarrow import fs as pafs

    env = os.environ if env is None else env
    uri = str(uri)
    if not is_remote(uri):
        return pafs.LocalFileSystem(), os.path.abspath(_local(uri))
    scheme, _, path = uri.partition("://")
    if scheme in ("s3", "s3a"):
        kw = {}
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if endpoint:
            proto, _, host = endpoint.partition("://")
            kw.update(endpoint_override=host or proto, scheme=proto if host else "https")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            kw["region"] = region
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            kw.update(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"])
            if env.get("AWS_SESSION_TOKEN"):
                kw["session_token"] = env["AWS_SESSION_TOKEN"]
        return pafs.S3FileSystem(**kw), path.rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def redact(text: str) -> str:
    """``text`` without the values of the AWS credential variables of this environment."""
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


class DeltaError(DataError, RuntimeError):
    """A Delta Lake read or commit failed (the message holds no credential)."""


def _guard(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # delta-rs and pyarrow errors: one redacted message
        raise DeltaError(redact(f"{what}: {type(e).__name__}: {e}")) from None


def is_delta_table(uri: str) -> bool:
    from deltalake import DeltaTable

    return _guard(f"checking {uri}", DeltaTable.is_deltatable, str(uri))


def open_table(uri: str, version: int | None = None):
    from deltalake import DeltaTable

    return _guard(f"opening {uri}", DeltaTable, str(uri), version=version)


def position(uri: str, dt=None) -> int | None:
    """The commit LSN a pgcdc table is applied up to (its ``APP_ID`` transaction), or None
    when it is not a Delta table or no pgcdc commit made it (``dt``: the table already
    open)."""
    if dt is None and not is_delta_table(uri):
        return None
    return (dt or open_table(uri)).transaction_version(APP_ID)


# --- the tasks write ----------------------------------------------------------------------------


@dataclass
class DataFile:
    """A data file written into a table directory (``path`` relative to it)."""

    path: str
    size: int
    rows: int
    stats: str


_WRITTEN = "path string, size long, rows long, stats string"


def _stats(meta, rows: int) -> str:
    """Delta file statistics from a Parquet footer: numRecords, and nullCount/minValues/
    maxValues of top-level integer, boolean and date columns (types whose Parquet statistics
    are exact; other columns get none, so readers never skip a file wrongly)."""
    import datetime as dt

    out: dict = {"numRecords": rows}
    if meta is None or meta.num_row_groups == 0:
        return json.dumps(out)
    schema = meta.schema.to_arrow_schema()
    mins, maxs, nulls = {}, {}, {}
    for j, field in enumerate(schema):
        t = field.type
        import pyarrow.types as pt

        exact = pt.is_integer(t) or pt.is_date32(t)
        if meta.row_group(0).num_columns <= j:
            break
        col_path = meta.row_group(0).column(j).path_in_schema
        if col_path != field.name:  # nested: its leaves are not one column
            continue
        lo = hi = None
        n = 0
        ok = True
        for g in range(meta.num_row_groups):
            s = meta.row_group(g).column(j).statistics
            if s is None or not s.has_null_count:
                ok = False
                break
            n += s.null_count
            if exact and s.has_min_max:
                lo = s.min if lo is None else min(lo, s.min)
                hi = s.max if hi is None else max(hi, s.max)
            elif exact and s.null_count != meta.row_group(g).num_rows:
                exact = False
        if not ok:
            continue
        nulls[field.name] = n
        if exact and lo is not None:
            if isinstance(lo, dt.date):
                lo, hi = lo.isoformat(), hi.isoformat()
            mins[field.name], maxs[field.name] = lo, hi
    out.update(minValues=mins, maxValues=maxs, nullCount=nulls)
    return json.dumps(out)


DICTIONARY_SAMPLE = 8192  # rows of a file's first batch that say which columns repeat


def repeating_columns(batch) -> list[str]:
    """The columns worth Parquet's dictionary encoding: those whose values repeat (at most
    half distinct) in the first DICTIONARY_SAMPLE rows of ``batch``. Encoding a column of
    distinct values (keys, names, times) builds a dictionary only to give it up: it took
    47 of 77 ms writing 200,000 rows of five such columns, and the files were larger."""
    import pyarrow.compute as pc
    import pyarrow.types as pt

    sample = batch.slice(0, DICTIONARY_SAMPLE)
    out = []
    for field, column in zip(sample.schema, sample.columns):
        if pt.is_nested(field.type) or not len(column):
            continue
        try:
            distinct = pc.count_distinct(column, mode="all").as_py()
        except Exception:  # noqa: BLE001 - a type Arrow cannot count: no dictionary
            continue
        if distinct * 2 <= len(column):
            out.append(field.name)
    return out


def _writer_task(uri: str, subdir: str, rows_per_file: int, env: dict):
    """The function each task runs: its Arrow batches into Parquet files under
    ``uri/subdir/``, one row per file written (path, size, rows, stats)."""

    def write(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq

        fs, root = filesystem(uri, env or None)
        # a task's worker has pyspark; the driver writing a sync cycle itself may not
        pyspark = sys.modules.get("pyspark")
        ctx = pyspark.TaskContext.get() if pyspark is not None else None
        part = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        state = {"writer": None, "rows": 0, "name": None, "meta": []}

        def close():
            if state["writer"] is None:
                return None
            state["writer"].close()
            name = state["name"]
            size = fs.get_file_info(f"{root}/{name}").size
            meta = state["meta"][-1] if state["meta"] else None
            row = (name, size, state["rows"], _stats(meta, state["rows"]))
            state.update(writer=None, rows=0, name=None)
            return pa.RecordBatch.from_pylist(
                [dict(zip(("path", "size", "rows", "stats"), row))],
                schema=pa.schema(
                    [("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64()),
                     ("stats", pa.string())]
                ),
            )  # fmt: skip

        for batch in batches:
            if batch.num_rows == 0:
                continue
            if state["writer"] is None:
                name = f"{subdir}/part-{part:05d}-{attempt}-{uuid.uuid4().hex}.parquet"
                state["name"] = name
                fs.create_dir(f"{root}/{subdir}", recursive=True)
                state["meta"] = []
                state["writer"] = pq.ParquetWriter(
                    f"{root}/{name}",
                    batch.schema,
                    filesystem=fs,
                    compression="snappy",
                    coerce_timestamps="us",
                    use_dictionary=repeating_columns(batch),
                    metadata_collector=state["meta"],
                )
            state["writer"].write_batch(batch)
            state["rows"] += batch.num_rows
            if state["rows"] >= rows_per_file:
                yield close()
        done = close()
        if done is not None:
            yield done

    return write


def write_files(df, uri: str, subdir: str, rows_per_file: int = ROWS_PER_FILE) -> list[DataFile]:
    """Write ``df`` as Parquet files under ``uri/subdir/`` from Spark's tasks (one file per
    partition, or more past ``rows_per_file``); returns what they wrote. On a local file
    system Spark's own Parquet writer writes them (its output metrics count the rows, and
    ``spark.sql.parquet.outputTimestampType`` makes timestamps INT64 microseconds); on
    object storage, which Spark cannot reach without Hadoop's connector jars, the tasks
    write them with pyarrow."""
    if not is_remote(str(uri)):
        root = _local(str(uri))
        df.write.mode("error").option("maxRecordsPerFile", rows_per_file).parquet(
            os.path.join(root, subdir)
        )
        files, _schema = parquet_dir(root, subdir)
        return files
    task = _writer_task(str(uri), subdir, rows_per_file, task_env(str(uri)))
    try:
        got = df.mapInArrow(task, _WRITTEN).collect()
    except Exception as e:
        if not is_remote(str(uri)):
            raise
        raise DeltaError(redact(f"writing data files under {uri}: {e}")) from None
    return [DataFile(r["path"], r["size"], r["rows"], r["stats"]) for r in got]


def delete_files(uri: str, files: list[DataFile]) -> None:
    """Remove written files nobody committed (a run that writes a table again)."""
    fs, root = filesystem(uri)
    dirs = set()
    for f in files:
        dirs.add(f.path.rpartition("/")[0])
        try:
            fs.delete_file(f"{root}/{f.path}")
        except OSError:
            pass
    if not is_remote(str(uri)):
        for d in dirs - {""}:
            try:
                fs.delete_dir(f"{root}/{d}")
            except OSError:
                pass


# --- the driver commits -------------------------------------------------------------------------


def arrow_schema(spark_schema, pg_names: dict | None = None):
    """The Arrow schema the tasks write for a Spark schema (timestamps UTC microseconds).
    ``pg_names`` ({stored name: PostgreSQL name}, :mod:`.names`): the field of each column
    stored under another name records its PostgreSQL name in its metadata."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(spark_schema, timezone="UTC")
    renamed = {s: pg for s, pg in (pg_names or {}).items() if s != pg}
    if not renamed:
        return schema
    return pa.schema(
        f.with_metadata({names.FIELD_KEY: renamed[f.name]}) if f.name in renamed else f
        for f in schema
    )


def column_names(uri: str, dt=None) -> dict:
    """{PostgreSQL name: stored name} of the table's columns (``dt``: the table already
    open): what :func:`pgcdc.spark.names.stored_names` keeps."""
    fields = (dt or open_table(uri)).schema().fields
    return {pg: stored for stored, pg in names.pg_names(fields).items()}


def _delta_schema(schema):
    """A Delta schema of an Arrow schema, every top-level field nullable (so plans that differ
    only in what Spark proves non-null do not change the table's schema)."""
    import pyarrow as pa
    from deltalake import Schema

    schema = pa.schema([f.with_nullable(True) for f in schema])
    return Schema.from_arrow(schema)


def commit(
    uri: str,
    files: list[DataFile],
    schema,
    *,
    remove: list[tuple[str, int]] | None = None,
    overwrite: bool = False,
    app_version: int | None = None,
    metadata: dict | None = None,
    dt=None,
    log_cleanup: bool = True,
    description: str | None = None,
) -> int:
    """Commit ``files`` (written under ``uri``) as one new version of the Delta table at
    ``uri`` (created when missing): added, with ``remove`` ((path, size) of the files they
    replace) removed, or with ``overwrite`` every current file removed. ``schema``: the
    files' Arrow schema. ``app_version``: the ``APP_ID`` transaction version to record.
    ``dt``: the table as the caller opened it, brought to the new version here (delta-rs
    lists ``_delta_log`` at each open and update: a day of commits makes that 50-75 ms).
    ``log_cleanup``: False when the caller cleans the log itself (``pgcdc sync``): delta-rs's
    own cleanup, after every commit, lists and reads the whole log to find commits older than
    the table's log retention (30 days by default): 0.45 s a commit with 86,400 commits.
    ``description``: the table's, when this commit creates it (delta-rs takes no table
    property of another writer's at creation: "Error parsing property"; the description is
    kept by later versions). Returns the new version."""
    from deltalake import CommitProperties, PostCommitHookProperties, Transaction
    from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

    now = int(time.time() * 1000)
    adds = [AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
    props = CommitProperties(
        custom_metadata=dict(metadata or {}),
        app_transactions=[Transaction(APP_ID, app_version)] if app_version is not None else None,
    )
    hooks = None if log_cleanup else PostCommitHookProperties(cleanup_expired_logs=False)
    dschema = _delta_schema(schema)
    if dt is None and not is_delta_table(uri):
        _guard(
            f"creating the Delta table {uri}",
            create_table_with_add_actions,
            str(uri),
            dschema,
            adds,
            mode="error",
            description=description,
            commit_properties=props,
        )
        return 0
    dt = dt or open_table(uri)
    same = same_schema(uri, schema, dt)
    if remove and not same:
        raise DeltaError(f"{uri}: the files to add have another schema than the table")
    if overwrite or not same:
        # a new schema replaces the table's files (overwrite writes the new schema)
        _guard(
            f"committing to {uri}",
            dt.create_write_transaction,
            adds,
            "overwrite",
            dschema,
            commit_properties=props,
            post_commithook_properties=hooks,
        )
    else:
        removes = [RemoveAction(p, True, now, size) for p, size in (remove or [])]
        _guard(
            f"committing to {uri}",
            dt.create_write_transaction,
            [*adds, *removes],
            "append",
            dt.schema(),
            commit_properties=props,
            post_commithook_properties=hooks,
        )
    _guard(f"reading {uri} after its commit", dt.update_incremental)
    return dt.version()


def _arrow(delta_schema):
    import pyarrow as pa

    return pa.schema(delta_schema.to_arrow())


def same_schema(uri: str, schema, dt=None) -> bool:
    """Whether files of Arrow ``schema`` can be added to the table as they are (same names
    and types, nullability aside)."""
    dt = dt or open_table(uri)
    current = _arrow(dt.schema())
    new = _arrow(_delta_schema(schema))
    return [(f.name, f.type) for f in current] == [(f.name, f.type) for f in new]


def current_files(uri: str, dt=None) -> list[tuple[str, int, int | None]]:
    """(path relative to the table, size, rows or None) of the table's current files
    (``dt``: the table already open)."""
    import pyarrow as pa

    dt = dt or open_table(uri)
    actions = pa.table(dt.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    rows = (
        actions.column("num_records").to_pylist()
        if "num_records" in actions.column_names
        else [None] * len(paths)
    )
    return list(zip(paths, sizes, rows))


def key_ranges(uri: str, column: str, dt=None) -> dict | None:
    """{path: (min, max)} of ``column`` (its stored name) in each current file's statistics,
    or None when a file has none (then every file may hold any value); ``dt``: the table
    already open."""
    import pyarrow as pa

    actions = pa.table((dt or open_table(uri)).get_add_actions(flatten=True))
    lo, hi = f"min.{column}", f"max.{column}"
    if lo not in actions.column_names or hi not in actions.column_names:
        return None
    out = {}
    for path, a, b, n in zip(
        actions.column("path").to_pylist(),
        actions.column(lo).to_pylist(),
        actions.column(hi).to_pylist(),
        actions.column(f"null_count.{column}").to_pylist()
        if f"null_count.{column}" in actions.column_names
        else [None] * actions.num_rows,
    ):
        if a is None or b is None:
            if n is None or n == 0:
                return None  # no statistics (a file with only nulls has n > 0)
        out[path] = (a, b, n)
    return out


def commit_parquet_dir(
    uri: str, subdir: str, *, overwrite: bool = True, metadata: dict | None = None
) -> int:
    """Commit the Parquet files Spark wrote into ``uri/subdir/`` (for the snapshot: e.g.
    ``df.write.parquet(f"{table_dir}/snapshot-<id>")`` on a local path) as one version of the
    Delta table at ``uri``: created when missing, else replacing its current files
    (``overwrite``) or adding to them. Hadoop's ``_SUCCESS`` and ``.crc`` files are left out
    (and removed where local); the schema is the files' own. Returns the version."""
    files, schema = parquet_dir(uri, subdir)
    if schema is None:
        raise DeltaError(f"{uri}/{subdir}: no Parquet files to commit")
    return commit(uri, files, schema, overwrite=overwrite, metadata=metadata)


def replace_with_table(uri: str, staged: str, *, app_version: int, metadata: dict) -> int:
    """Replace the Delta table at ``uri`` (created when missing) by the current rows of the
    Delta table ``staged`` in ONE commit: every current file of ``uri`` removed, ``staged``'s
    current files added (moved into ``uri``: their directories renamed, so local paths
    only), the ``APP_ID`` transaction set to ``app_version``. A reader sees the old version
    or the new one, never a table half replaced, empty or missing; the old versions stay
    readable by time travel. ``staged`` is no table any more afterwards. Returns the new
    version."""
    if is_remote(uri) or is_remote(staged):
        raise DeltaError(f"{uri}: replacing a table by a staged one works on local paths only")
    src, dst = _local(staged), _local(uri)
    dt = open_table(src)
    schema = _arrow(dt.schema())
    paths = [p for p, _s, _r in current_files(src)]
    if any("/" not in p for p in paths):
        raise DeltaError(f"{staged}: data files outside a directory of their own")
    tops = sorted({p.split("/", 1)[0] for p in paths})
    os.makedirs(dst, exist_ok=True)
    for top in tops:
        os.rename(os.path.join(src, top), os.path.join(dst, top))
    wanted, files = set(paths), []
    for top in tops:
        files += [f for f in parquet_dir(dst, top)[0] if f.path in wanted]
    # a table it creates takes the staged one's description (the source apply records)
    return commit(dst, files, schema, overwrite=True, app_version=app_version,
                  metadata=metadata, description=dt.metadata().description)  # fmt: skip


def parquet_dir(uri: str, subdir: str) -> tuple[list[DataFile], object]:
    """The Parquet files under ``uri/subdir/`` (sizes, rows and statistics from their
    footers) and their Arrow schema (None when there is none); Hadoop's ``_SUCCESS`` and
    ``.crc`` files are removed where local."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    fs, root = filesystem(uri)
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{subdir}", recursive=True))
    files, schema = [], None
    for info in sorted(infos, key=lambda i: i.path):
        name = info.path.rsplit("/", 1)[-1]
        if info.type != pafs.FileType.File:
            continue
        if name == "_SUCCESS" or name.endswith(".crc"):
            if not is_remote(uri):
                fs.delete_file(info.path)
            continue
        if not name.endswith(".parquet"):
            continue
        with fs.open_input_file(info.path) as fh:
            meta = pq.ParquetFile(fh).metadata
        schema = schema or meta.schema.to_arrow_schema()
        rel = info.path[len(root) + 1 :]
        files.append(DataFile(rel, info.size, meta.num_rows, _stats(meta, meta.num_rows)))
    return files, schema


# --- reading a table in Spark -------------------------------------------------------------------


def _reader_task(uri: str, arrow_schema, env: dict):
    def read(batches):
        import pyarrow as pa
        import pyarrow.parquet as pq

        fs, root = filesystem(uri, env or None)
        for batch in batches:
            for path in batch.column(0).to_pylist():
                with fs.open_input_file(f"{root}/{path}") as fh:
                    pf = pq.ParquetFile(fh)
                    for b in pf.iter_batches(batch_size=65536):
                        t = pa.Table.from_batches([b])
                        cols = []
                        for field in arrow_schema:
                            if field.name == "_file":
                                cols.append(pa.array([path] * t.num_rows, pa.string()))
                            elif field.name in t.column_names:
                                cols.append(t.column(field.name).cast(field.type))
                            else:
                                cols.append(pa.nulls(t.num_rows, field.type))
                        yield pa.Table.from_arrays(cols, schema=arrow_schema).to_batches()[0]

    return read


def read_rows(spark, uri: str, *, with_file: bool = False, files=None):
    """The current rows of the Delta table at ``uri`` as a DataFrame whose columns have
    their PostgreSQL names (:mod:`.names`; ``with_file``: plus ``_file``, the path of the
    data file holding the row). ``files``: only those paths. Local tables are read by Spark's
    Parquet reader, object storage by tasks with pyarrow."""
    dt = open_table(uri)
    df = _stored_rows(spark, uri, dt, with_file=with_file, files=files)
    pg = names.pg_names(dt.schema().fields)
    return df.toDF(*[pg.get(c, c) for c in df.columns])


def _stored_rows(spark, uri: str, dt, *, with_file: bool, files):
    """read_rows' rows under the names the files store."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = _arrow(dt.schema())
    sschema = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    paths = [p for p, _s, _r in current_files(uri, dt)]
    if files is not None:
        keep = set(files)
        paths = [p for p in paths if p in keep]
    if not paths:
        df = spark.createDataFrame([], sschema)
        return df.withColumn("_file", F.lit(None).cast("string")) if with_file else df
    if not is_remote(uri):
        root = _local(uri)
        df = spark.read.schema(sschema).parquet(*[os.path.join(root, p) for p in paths])
        if with_file:
            by_name = {p.rsplit("/", 1)[-1]: p for p in paths}
            base = F.element_at(F.split(F.input_file_name(), "/"), -1)
            mapping = F.create_map(*[x for kv in by_name.items() for x in map(F.lit, kv)])
            df = df.withColumn("_file", mapping[base])
        return df
    full = pa.schema([*schema, pa.field("_file", pa.string())]) if with_file else schema
    out_schema = from_arrow_schema(full, prefer_timestamp_ntz=True)
    names = spark.createDataFrame([(p,) for p in paths], "path string")
    names = names.repartition(min(len(paths), max(1, spark.sparkContext.defaultParallelism)))
    return names.mapInArrow(_reader_task(str(uri), full, task_env(str(uri))), out_schema)


def attempt_dir(run: str) -> str:
    """A directory of its own for one write of a run (a table written again after a failed
    guess does not meet the first write's files)."""
    return f"{run}-{uuid.uuid4().hex[:6]}"


def run_id() -> str:
    return f"pgcdc-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
