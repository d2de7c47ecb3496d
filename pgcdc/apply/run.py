"""Apply change events to tables: the current state of each table (SCD1), or its history
(SCD2), as a Delta Lake table at ``OUT/<key>/`` (the default; the key is ``schema.table``
with odd characters escaped: :mod:`pgcdc.tablekey`), or in the older
parquet layout (``format="parquet"``, local file systems only).

Snapshot contract (what ``--snapshot DIR`` / ``apply_changes(snapshot=DIR)`` reads; the initial
snapshot writer follows it):

- ``DIR/<schema>.<table>/`` is a Delta table (Parquet files Spark wrote into it, committed
  by :func:`pgcdc.apply.delta.commit_parquet_dir`) or a plain Parquet dataset
  (``spark.read.parquet`` of it works): the table's columns under their own names (a Delta
  table's may be stored names: :mod:`pgcdc.spark.names`), typed by
  :func:`pgcdc.spark.types.spark_type` (values converted by
  :func:`pgcdc.spark.types.value_converter`), plus
- ``_pg_text`` (``map<string,string>``, :data:`pgcdc.spark.types.SPECIAL_COLUMN`, optional):
  column name -> PostgreSQL text of values the typed column holds as null (infinity, NaN, ...);
- ``_commit_lsn`` (LongType): the slot's consistent point, the same on every row;
- ``_tx_ordinal`` (LongType): 0 on every row (a snapshot row is op 'r').
- ``DIR/_snapshot.json`` (optional): ``{"consistent_point": "16/B374D848", "keys":
  {"<schema>.<table>": ["id", ...]}}``; keys are needed only for tables that have snapshot
  rows but whose Relation messages never appear in the captures.

Change events at or before (``_commit_lsn``, 0) of a table's snapshot are not applied to it:
the snapshot already contains them.

Delta Lake (``OUT`` a local path or ``s3://bucket/prefix``; see :mod:`pgcdc.apply.delta`):

- ``OUT/<schema>.<table>/``: a Delta table; its data files are under ``pgcdc-<run>/``
  directories (one per run that wrote it), its log under ``_delta_log/``. Spark's tasks write
  the files; the driver commits each table with delta-rs: one version per table per run
  that changed it, adding the new files and removing the ones they replace. Each commit
  carries the table's applied position: the application transaction ``pgcdc-apply`` whose
  version is the last applied commit LSN, and the commit metadata ``pgcdc.commit_lsn``,
  ``pgcdc.tx_ordinal``, ``pgcdc.run``, ``pgcdc.source`` (the PostgreSQL table's schema,
  name and OID, also the table's description). A column whose name Delta does not take as
  it is (a space, ``,;{}()=``, a tab or newline, ``%``, or equal but for case to another) is
  stored under its name percent-encoded, recorded in its schema field's metadata
  (``pgcdc.name``; see :mod:`pgcdc.spark.names`).
- ``OUT/_pgcdc_state.json``: a summary written after every table of a run committed:
  ``layout: "delta"``, the run's applied position (``applied_lsn``: every table is applied
  at least that far), each table's Delta version, key, columns, rows and what its last
  commit removed and added (``files_removed``/``files_added``/``bytes_*``), the last run.

A run reads the captures from the summary's position and applies to each table only the
transactions after its own (its log's ``pgcdc-apply`` version, or the summary's when higher).
A run killed at any point leaves every table at a consistent version (its last commit; the
files of a version never committed are in no version). Killed between two tables' commits,
the tables committed are ahead and the summary behind: the next run skips, for the ones
ahead, what they already hold, and applies to the others what they miss, so they converge.
Keyed tables rewrite only the data files that hold a changed key (``rewrite="files"``, the
default; ``"table"`` rewrites every file); a truncate, a keyless table or a changed column
type rewrites the whole table. SCD2 adds the new versions and rewrites the files holding the
current rows it closes. Timestamps are INT64 microseconds.

The parquet layout (``format="parquet"``, ``--format parquet``; local only: its commit is a
rename on a POSIX file system):

- ``OUT/<schema>.<table>``: a symbolic link to the table's current version directory
  ``OUT/_versions/<schema>.<table>/v<NNNNNN>/`` (Parquet files, no ``_SUCCESS`` or ``.crc``):
  ``spark.read.parquet`` and ``pyarrow.parquet.read_table`` read it as a plain dataset.
- ``OUT/_pgcdc_state.json``: the applied position (the last applied ``commit_lsn``; whole
  transactions are applied), each table's version, key, columns and rows, and what the last
  run that changed it read (``last_run``: units read and skipped, the capture files read,
  when it finished). A run that applies nothing writes nothing.

A run writes every changed table to a new version directory, then replaces the state file
(written aside, fsynced, renamed: the commit point), then switches each link (a new link
renamed over the old one), then removes versions nothing names. A run killed at any point
leaves the previous state readable; the next run first points the links at the versions the
state file names and removes unnamed versions, then goes on.

In both, events at or before the applied position are skipped, so re-running over the same
captures changes nothing, and a run over new captures (of the same slot) applies only what
they add; a capture file whose transactions were all applied is scanned for its transaction
boundaries only (no values are loaded).

Current state (SCD1), per table, in ``(commit_lsn, tx_ordinal)`` order:

- tables with a key (REPLICA IDENTITY DEFAULT with a primary key, or USING INDEX; the key is
  that of the latest such Relation message): the latest change per key wins; a delete
  removes the row; an update whose old key differs from its new key (``before``) removes the
  old row and writes the new one; unchanged TOAST columns ('u') keep the value of the key's
  previous version (the existing state, or an earlier change in the run); with REPLICA
  IDENTITY FULL the old row already supplies them. A 'u' column whose previous value is not
  known (the row came under this key by a key change in the same run) is an error naming the
  table, column and LSN, never a silent NULL;
- tables without a key (REPLICA IDENTITY FULL without a key in any version, or NOTHING):
  rows are a multiset: an insert adds its row, a delete removes one row equal to its old
  image, an update does both. The server refuses UPDATE/DELETE on a published table with
  REPLICA IDENTITY NOTHING, so such tables are insert-only; a delete or update without an
  old image, or one removing a row the state does not have, is an error;
- a truncate removes every row ordered before it (the existing state and earlier changes).

History (SCD2): every version of a row with ``_valid_from_lsn``/``_valid_from_time`` (its
change's commit LSN and time), ``_valid_to_lsn``/``_valid_to_time`` (the change that replaced
or deleted it, or the truncate; null while current) and ``_is_current``. Keyed tables only.

Columns of the state: the table's columns as of its latest Relation message (a dropped column
is dropped; an added one is null in rows written before it existed), typed by
:mod:`pgcdc.spark.types`, then ``_pg_text``, ``_commit_lsn`` and ``_tx_ordinal`` (the change
that wrote the row). Parquet timestamps are INT64 microseconds.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

from pgcdc.errors import DataError, SetupError
from pgcdc.durable import write_json
from pgcdc.events.jsonlines import table_matches
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.tablekey import split_key
from pgcdc.apply import driver as driver_apply
from pgcdc.spark import types as pgtypes
from pgcdc.spark.changes import change_events
from pgcdc.spark.later import resolve, started
from pgcdc.spark.names import quoted, stored_names
from pgcdc.apply.ops import change_ops, special_column, value_column
from pgcdc.spark.units import record_from_json, record_to_json

__all__ = ["ApplyError", "ApplyReport", "apply_changes", "STATE_FILE", "quiet_spark"]

STATE_FILE = "_pgcdc_state.json"
STATE_FORMAT = "pgcdc-apply-state"
VERSIONS = "_versions"
META = ("_commit_lsn", "_tx_ordinal")
SPECIAL = pgtypes.SPECIAL_COLUMN
SCD2_META = ("_valid_from_lsn", "_valid_from_time", "_valid_to_lsn", "_valid_to_time")


class ApplyError(DataError, ValueError):
    """The changes cannot be applied as they are (says which table, row and LSN)."""


class SourceMismatch(SetupError, ApplyError):
    """Captures of another server, database or slot than the state (or than each other)."""


class ApplyReport(dict):
    """{table: rows written} of one run; ``run`` says what it read (``units_read``,
    ``units_skipped``: units whose transactions were all applied before, ``files_read``);
    ``errors`` (lenient runs): {table: [(LSN, message)...]} of the values kept raw (their
    text in ``_pg_text``), the first ERRORS_KEPT of each table."""

    run: dict = {}
    errors: dict = {}


# --- the output directory -----------------------------------------------------------------------


def _read_state(out: Path) -> dict:
    path = out / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {"format": STATE_FORMAT, "version": 1, "applied_lsn": None, "tables": {}}
    if doc.get("format") != STATE_FORMAT:
        raise ApplyError(f"{path}: not a pgcdc apply state file")
    if doc.get("layout") == "delta":
        raise ApplyError(f"{out} holds Delta Lake tables: apply to it with --format delta")
    return doc


_SOURCE_KEYS = ("system_id", "database", "slot")


def _one_source(captures, applied: dict | None, out: Path) -> dict | None:
    """The source (server, database, slot) of the capture directories among ``captures``,
    checked to be one, and the one the state was applied from; None when none records it
    (capture files, directories made before pgcdc recorded it). Changes of two sources
    cannot be ordered by LSN: mixing them would skip or corrupt rows."""
    from pgcdc.capture.segments import source_identity

    def key(doc):
        return tuple(doc.get(k) for k in _SOURCE_KEYS)

    found = applied
    where = f"{out} (the applied state)" if applied else None
    for c in captures:
        if not Path(c).is_dir():
            continue
        doc = source_identity(c)
        if doc is None:
            continue
        if found is not None and key(doc) != key(found):
            raise SourceMismatch(
                f"{c} comes from system {doc['system_id']} database {doc['database']} slot "
                f"{doc['slot']}, but {where} from system {found['system_id']} database "
                f"{found['database']} slot {found['slot']}: apply one source per --out "
                "directory (use a new --out for this one)"
            )
        if found is None:
            found, where = {k: doc.get(k) for k in _SOURCE_KEYS}, str(c)
    return None if found is None else {k: found.get(k) for k in _SOURCE_KEYS}


def _now_iso() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _close_run(report, ce, captures, doc: dict, new_doc: dict, *, changed: bool, stats: dict
               ) -> bool:  # fmt: skip
    """Say in ``report.run`` what this run read (incremental runs skip the units of applied
    transactions); when it wrote a table or moved the applied position, record that and the
    captures in ``new_doc`` and return True: the state is to be written."""
    report.run = {
        "units_read": len(ce.units),
        "units_skipped": ce.skipped_units,
        "files_read": ce.files_read(),
    }
    report.errors = {n: [(format_lsn(lsn), m) for lsn, m in st["errors"]]
                     for n, st in stats.items() if st["errors"]}  # fmt: skip
    if report.errors:
        report.run["errors"] = {n: len(e) for n, e in report.errors.items()}
    if not changed and new_doc.get("applied_lsn") == doc.get("applied_lsn"):
        return False
    new_doc["captures"] = [str(c) for c in captures]
    new_doc["last_run"] = {**report.run, "finished_at": _now_iso()}
    # what a later run needs to read newer captures alone (older ones pruned): each table's
    # latest Relation message, and the catalog of the types that are not built in
    new_doc["relations"] = [record_to_json(ts.record) for ts in ce.tables.values() if ts.record]
    if ce.catalog is not None:
        new_doc["catalog"] = ce.catalog.to_doc()
    return True


def _learnt(doc: dict) -> dict:
    """change_events' ``known`` and ``catalog`` from what earlier runs recorded in the state."""
    from pgcdc.values import Catalog

    known = [record_from_json(r) for r in doc.get("relations", ())]
    catalog = Catalog.from_doc(doc["catalog"]) if doc.get("catalog") else None
    return {"known": known, "catalog": catalog}


def _write_state(out: Path, doc: dict) -> None:
    write_json(out / STATE_FILE, doc)


def _link(out: Path, table: str, version: str) -> None:
    """Point OUT/<table> at its version directory (atomic: a new link renamed over it)."""
    link = out / table
    target = os.path.join(VERSIONS, table, version)
    if link.is_symlink() and os.readlink(link) == target:
        return
    if link.exists() and not link.is_symlink():
        raise ApplyError(f"{link} exists and is not a link apply made: not touching it")
    tmp = out / f".{table}.link.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _repair(out: Path, doc: dict) -> None:
    """Make the links and version directories match the state file (after a crash)."""
    tables = doc.get("tables", {})
    for table, info in tables.items():
        _link(out, table, info["version"])
    root = out / VERSIONS
    if root.is_dir():
        for tdir in root.iterdir():
            keep = tables.get(tdir.name, {}).get("version")
            for vdir in tdir.iterdir():
                if vdir.name != keep:
                    shutil.rmtree(vdir, ignore_errors=True)
            if not any(tdir.iterdir()):
                tdir.rmdir()
    for p in out.glob(".*.link.tmp"):
        p.unlink()
    for p in out.iterdir():  # links of tables the state does not name (a crash before it)
        if p.is_symlink() and p.name not in tables:
            p.unlink()


def _next_version(out: Path, table: str, current: str | None) -> str:
    n = int(current[1:]) + 1 if current else 1
    while (out / VERSIONS / table / f"v{n:06d}").exists():
        n += 1
    return f"v{n:06d}"


def _tidy(path: Path) -> None:
    """Remove Hadoop's checksum and marker files from a written version directory."""
    for p in path.iterdir():
        if p.name == "_SUCCESS" or p.name.endswith(".crc"):
            p.unlink()


# --- spark settings -----------------------------------------------------------------------------


def quiet_spark(spark) -> None:
    """Settings apply needs on any session: INT64 microsecond timestamps in Parquet, no
    _SUCCESS files, UTC, column names that differ in case told apart (:mod:`.names`), and
    only errors in the log."""
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.caseSensitive", "true")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    hconf.set("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
    hconf.set("parquet.enable.summary-metadata", "false")


# --- the apply ------------------------------------------------------------------------------------


def _matches(patterns, name: str) -> bool:
    names = split_key(name)
    if names is None:  # a cut key: its own name only
        return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)
    return not patterns or table_matches(patterns, *names)


def _seq_after(F, lsn_col, ord_col, lsn, ordinal):
    return (F.col(lsn_col) > F.lit(lsn)) | (
        (F.col(lsn_col) == F.lit(lsn)) & (F.col(ord_col) > F.lit(ordinal))
    )


def apply_changes(
    spark,
    captures,
    out,
    *,
    scd: int = 1,
    tables=None,
    snapshot=None,
    split_records: int | None = None,
    lenient: bool = False,
    ship: bool | None = None,
    format: str = "delta",
    rewrite: str = "files",
    driver_bytes: int = 0,
    log_cleanup: bool = True,
    until=None,
    aside=frozenset(),
    hold: bool = False,
) -> ApplyReport:
    """Apply the change events of ``captures`` (capture files or directories of one slot, in
    order) to the tables under ``out``; returns a report {table: rows in its new version}.
    ``tables``: shell patterns on schema.table or table. ``snapshot``: a directory following
    the snapshot contract above, loaded as the initial state of tables not yet in ``out``.
    ``ship``: see :func:`pgcdc.spark.changes.change_events` (on a cluster, the packages are
    zipped and added to the executors). ``format``: ``"delta"`` (Delta Lake tables, ``out`` a
    local path or ``s3://bucket/prefix``; see :mod:`pgcdc.apply.delta`) or
    ``"parquet"`` (the version directories and links described above, local only).
    ``rewrite`` (Delta): ``"files"`` rewrites only the data files that hold a changed key,
    ``"table"`` every file. ``driver_bytes`` (Delta): a run reading at most this many bytes
    of records is applied in the driver where it can be (:mod:`pgcdc.apply.driver`:
    no Spark job for a small run; the same tables). ``log_cleanup`` (Delta): False when the
    caller cleans the tables' logs itself (see :func:`pgcdc.apply.delta.commit`). ``until``:
    the capture directory's durable position to read to rather than its ``state.json``'s
    (:class:`pgcdc.capture.segments.State`; a Structured Streaming batch's end).

    The values of the tables a run does not apply (``tables`` matches them not) are not
    loaded: a value of theirs that does not load stops nothing. ``aside`` (Delta): tables
    set aside (:mod:`pgcdc.sync.aside`): not applied, not loaded, and the summary's applied
    position does not wait for them (their changes are passed over: such a table comes back
    by a snapshot). ``hold`` (Delta): the summary's applied position stays where it is, so
    that a run that applies some tables only (``tables``, ``aside``) leaves the changes of
    the others to a later run; each table's commits carry its own position as always."""
    if scd not in (1, 2):
        raise ValueError(f"scd must be 1 or 2, not {scd!r}")
    if format not in ("delta", "parquet"):
        raise ValueError(f"format must be 'delta' or 'parquet', not {format!r}")
    if rewrite not in ("files", "table"):
        raise ValueError(f"rewrite must be 'files' or 'table', not {rewrite!r}")
    if format != "delta" and (aside or hold):
        raise ValueError("aside and hold are for Delta tables")
    if started(spark):  # a session still starting (pgcdc sync) is made quiet as it starts
        quiet_spark(spark)
    if format == "delta":
        return _apply_delta(
            spark, captures, out, scd=scd, tables=tables, snapshot=snapshot,
            split_records=split_records, lenient=lenient, ship=ship, rewrite=rewrite,
            driver_bytes=driver_bytes, log_cleanup=log_cleanup, until=until, aside=aside,
            hold=hold,
        )  # fmt: skip
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spark = resolve(spark)
    if "://" in str(out) and not str(out).startswith("file://"):
        raise ApplyError(f"{out}: the parquet format writes to a local file system only")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = _read_state(out)
    if doc.get("scd", scd) != scd:
        raise ApplyError(f"{out} holds SCD{doc['scd']} state; this run asks for SCD{scd}")
    _repair(out, doc)
    source = _one_source(captures, doc.get("source"), out)
    applied = parse_lsn(doc["applied_lsn"]) if doc.get("applied_lsn") else None
    kwargs = {} if split_records is None else {"split_records": split_records}
    ce = change_events(
        spark, captures, lenient=lenient, min_commit_lsn=applied, ship=ship, until=until,
        load=lambda n: _matches(tables, n), **kwargs, **_learnt(doc),
    )  # fmt: skip
    snap = _read_snapshot(snapshot) if snapshot else None
    keys_of = {name: _keys(name, ts, doc, snap) for name, ts in ce.tables.items()}
    # one pass decodes the captures into the cache of operations (flat rows: an upsert or a
    # delete per key), and the tasks gather each table's last change, last truncate and
    # unchanged TOAST columns on the way
    ops, acc = change_ops(spark, ce, keys_of, reduce=scd == 1)
    changed = [n for n in ce.tables if _matches(tables, n)]
    # one table with a key: its state is written in the same pass, planned on a guess (no
    # truncate, no unchanged TOAST columns) that the stats gathered on the way then confirm,
    # or not (the version is then written again from what they say); else one pass fills a
    # cache the tables are written from
    guessing = ce.seeds is not None and len(ce.tables) == 1 and changed and keys_of[changed[0]]
    cached = ce.seeds is not None and not guessing
    if cached:
        from pyspark import StorageLevel  # here: a run the driver applies needs no Spark

        ops = ops.persist(StorageLevel.MEMORY_AND_DISK)
        ops.count()
    stats = _stats(acc)
    names = set(ce.tables) | set(doc["tables"]) | (set(snap["tables"]) if snap else set())
    report = ApplyReport()
    new_doc = {**doc, "scd": scd, "tables": dict(doc["tables"])}
    if source is not None:
        new_doc["source"] = source
    written = []
    try:
        for name in sorted(names):
            if not _matches(tables, name):
                continue
            info = doc["tables"].get(name)
            base_snapshot = snap is not None and info is None and name in snap["tables"]
            st = _GUESS if guessing and name in ce.tables else stats.get(name)
            if st is None and not base_snapshot:
                continue
            while True:
                vdir, entry = _write_table(
                    spark, F, out, name, ce, ops, info, snap, base_snapshot, st, scd, doc
                )
                if st is not _GUESS:
                    break
                stats = _stats(acc)
                st = stats.get(name)
                if st is not None and not st["truncate"] and not st["unchanged"]:
                    break  # the guess held
                shutil.rmtree(vdir)
                if st is None and not base_snapshot:
                    vdir = None  # no change of it after all: nothing to write
                    break
            if vdir is None:
                continue
            written.append(vdir)
            report[name] = _rows_in(vdir)
            new_doc["tables"][name] = {**entry, "rows": report[name]}
        last = max((st["last"]["commit_lsn"] for st in stats.values()), default=None)
        if last is not None and (applied is None or last > applied):
            new_doc["applied_lsn"] = format_lsn(last)
        if _close_run(report, ce, captures, doc, new_doc, changed=bool(written), stats=stats):
            _write_state(out, new_doc)  # the commit point
    except BaseException:
        for vdir in written:
            shutil.rmtree(vdir, ignore_errors=True)
        raise
    finally:
        if cached:
            ops.unpersist()
    _repair(out, new_doc)
    return report


_GUESS = {"last": None, "truncate": None, "unchanged": []}


def _stats(acc) -> dict:
    """{table: {"last", "truncate", "unchanged"}} of the accumulator so far."""
    return {
        name: {
            "last": _seq(s["last"]),
            "truncate": _seq(s["truncate"]) if s["truncate"] is not None else None,
            "unchanged": sorted(s["unchanged"]),
            "errors": sorted(s.get("errors", ())),
        }
        for name, s in acc.value.items()
    }


def _write_table(spark, F, out, name, ce, ops, info, snap, base_snapshot, st, scd, doc):
    """Write a table's new state to a new version directory: (it, its state file entry)."""
    ts = ce.tables.get(name)
    keys = _keys(name, ts, doc, snap)
    columns = list(ts.latest) if ts else (info or {}).get("columns")
    base = None
    floor = None
    kept = None  # {PostgreSQL name: stored name} of the state's columns
    if info is not None:
        base = spark.read.parquet(str(out / name))
        pg = info.get("names", {})
        kept = {pg.get(c, c): c for c in base.columns}
        base = base.toDF(*[pg.get(c, c) for c in base.columns])
    elif base_snapshot:
        base = _snapshot_rows(spark, snap["tables"][name])
        floor = (snap["lsn"], 0)
    if columns is None:
        columns = [c for c in base.columns if c not in (SPECIAL, *META, *SCD2_META)]
        columns = [c for c in columns if c != "_is_current"]
    changes = None
    if st is not None:
        changes = _table_ops(F, ops, list(ce.tables).index(name), ts, keys, columns)
    if changes is not None and floor is not None and floor[0] is not None:
        changes = changes.where(_seq_after(F, "_commit_lsn", "_tx_ordinal", *floor))
    truncate = st["truncate"] if st is not None else None
    unchanged = list(st["unchanged"] or []) if st is not None else []
    state = _state(F, scd, ce, name, base, changes, keys, columns, truncate, unchanged, ts)
    stored = stored_names(columns, kept, reserved=_state_columns((), scd))
    state = state.toDF(*[stored.get(c, c) for c in state.columns])
    version = _next_version(out, name, (info or {}).get("version"))
    vdir = out / VERSIONS / name / version
    vdir.parent.mkdir(parents=True, exist_ok=True)
    state.write.mode("error").parquet(str(vdir))
    _tidy(vdir)
    entry = {"version": version, "keys": list(keys) if keys else None, "columns": columns,
             **_renamed(stored)}  # fmt: skip
    return vdir, entry


def _keys(name: str, ts, doc: dict, snap) -> list | None:
    """A table's key: its latest Relation message's, else the state's, else the snapshot's."""
    keys = (ts.key_names if ts else None) or doc["tables"].get(name, {}).get("keys")
    if keys is None and snap is not None:
        keys = snap["keys"].get(name)
    return list(keys) if keys else None


def _key_parts(keys) -> list[str]:
    """The columns a key is compared by: each key column's typed value (_k0, ...) and its
    PostgreSQL text where the type cannot hold it (_kt0, ...: 'infinity', NaN), so keys that
    are all null typed stay apart."""
    n = len(keys or ())
    return [f"_k{i}" for i in range(n)] + [f"_kt{i}" for i in range(n)]


def _table_ops(F, ops, number: int, ts, keys, columns):
    """One table's operations (see :mod:`pgcdc.apply.ops`) under the table's column names:
    key columns _k0... and _kt0... (see :func:`_key_parts`), ``columns`` (null where the
    table never had one), then _pg_text, _commit_lsn, _tx_ordinal, _sub, _upsert, _bad,
    _moved, _unchanged and _commit_time."""
    names = ts.names

    def col(name):
        if name not in names:
            return F.lit(None).cast("string")
        return F.col(value_column(number, names.index(name)))

    return ops.where(F.col("_t") == number).select(
        *[col(k).alias(f"_k{i}") for i, k in enumerate(keys or ())],
        *[
            F.col(special_column(number))[k].alias(f"_kt{i}")  # a key the type cannot hold
            for i, k in enumerate(keys or ())
        ],
        *[col(c).alias(c) for c in columns],
        F.col(special_column(number)).alias(SPECIAL),
        *META,
        "_sub",
        "_upsert",
        "_bad",
        "_moved",
        "_unchanged",
        "_commit_time",
    )


def _lsn_finder(F, ce, name: str):
    """(op, LSN text) of a table's change, by (commit_lsn, tx_ordinal), for an error
    message: the operations do not hold them, so this decodes the captures again."""

    def lsn_of(commit_lsn: int, tx_ordinal: int) -> tuple[str, str]:
        row = (
            ce.table(name)
            .where((F.col("commit_lsn") == commit_lsn) & (F.col("tx_ordinal") == tx_ordinal))
            .select("op", "source.lsn")
            .head()
        )
        return row["op"], row["lsn"]

    return lsn_of


def _seq(seq: tuple) -> dict:
    return {"commit_lsn": seq[0], "tx_ordinal": seq[1]}


def _rows_in(vdir: Path) -> int:
    """Rows of a written version, from the Parquet footers (no Spark job)."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in vdir.glob("*.parquet"))


def _read_snapshot(snapshot) -> dict:
    root = Path(snapshot)
    meta = {}
    if (root / "_snapshot.json").exists():
        meta = json.loads((root / "_snapshot.json").read_text())
    tables = {
        p.name: str(p)
        for p in sorted(root.iterdir())
        if p.is_dir() and not p.name.startswith(("_", "."))
    }
    lsn = parse_lsn(meta["consistent_point"]) if meta.get("consistent_point") else None
    return {"tables": tables, "keys": meta.get("keys", {}), "oids": meta.get("oids", {}),
            "lsn": lsn}  # fmt: skip


def _base_rows(F, base, columns, ts, keep=()):
    """The existing state as rows of the new shape (new columns null, types of the events);
    ``keep``: more columns of ``base`` to carry along."""
    from pyspark.sql.types import MapType, StringType

    cols = []
    defaults = ts.default_values() if ts is not None else {}
    texts = []  # (column, text) of defaults a typed column cannot hold
    for c in columns:
        if c in base.columns:
            col = F.col(quoted(c))
            if ts is not None and c in ts.names:
                col = col.cast(ts.spark_type(c))
            cols.append(col.alias(c))
        else:
            # a column new to the state: rows from before it hold its DEFAULT, if it had one
            typ = ts.spark_type(c) if ts is not None and c in ts.names else StringType()
            value, text = defaults.get(c, (None, None))
            cols.append(_literal(F, value, typ).alias(c))
            if text is not None:
                texts.append((c, text))
    special = (
        F.col(SPECIAL)
        if SPECIAL in base.columns
        else F.lit(None).cast(MapType(StringType(), StringType()))
    )
    if texts:
        added = F.create_map(*[F.lit(x) for pair in texts for x in pair])
        special = F.when(special.isNull(), added).otherwise(F.map_concat(special, added))
    return base.select(
        *cols,
        special.alias(SPECIAL),
        F.col("_commit_lsn").cast("long").alias("_commit_lsn"),
        F.col("_tx_ordinal").cast("long").alias("_tx_ordinal"),
        *keep,
    )


def _literal(F, value, typ):
    """A Spark column holding ``value`` (a converted value: pgcdc.spark.types) as ``typ``."""
    from pyspark.sql.types import ArrayType, StructType

    if value is None:
        return F.lit(None).cast(typ)
    if isinstance(typ, StructType):
        return F.struct(
            *[_literal(F, value.get(f.name), f.dataType).alias(f.name) for f in typ.fields]
        )
    if isinstance(typ, ArrayType):
        return F.array(*[_literal(F, v, typ.elementType) for v in value]).cast(typ)
    return F.lit(value).cast(typ)


def _cols(F, columns) -> list:
    """Spark columns of the table's columns by name (PostgreSQL's: quoted, see :mod:`.names`)."""
    return [F.col(quoted(c)) for c in columns]


def _cast_like(F, like) -> list:
    """Columns of a DataFrame with ``like``'s columns, cast to ``like``'s types (for a union)."""
    return [F.col(quoted(f.name)).cast(f.dataType).alias(f.name) for f in like.schema.fields]


def _ops(F, changes, keys, columns, truncate):
    """Per-key operations of a table's changes after its last truncate (upserts with _sub
    1, deletes 0), in the rows _history unions with the existing state."""
    if truncate is not None:
        changes = changes.where(
            _seq_after(
                F, "_commit_lsn", "_tx_ordinal", truncate["commit_lsn"], truncate["tx_ordinal"]
            )
        )
    return changes.select(
        *_key_parts(keys),
        "_sub",
        "_upsert",
        *_cols(F, columns),
        SPECIAL,
        *META,
        "_unchanged",
        "_commit_time",
        "_moved",
    )


def _history(F, name, base, changes, keys, columns, truncate, unchanged, ts):
    """All per-key operations (existing state as upserts first), 'u' columns filled."""
    from pyspark.sql import Window

    ops = _ops(F, changes, keys, columns, truncate) if changes is not None else None
    part = _key_parts(keys)
    if base is not None and truncate is None:
        # SCD2's current rows keep their start time (their change is not in this run)
        timed = "_valid_from_time" in base.columns
        b = _base_rows(F, base, columns, ts, ("_valid_from_time",) if timed else ()).select(
            *[F.col(quoted(k)).alias(f"_k{i}") for i, k in enumerate(keys)],
            *[F.col(SPECIAL)[k].alias(f"_kt{i}") for i, k in enumerate(keys)],
            F.lit(1).alias("_sub"),
            F.lit(True).alias("_upsert"),
            *_cols(F, columns),
            SPECIAL,
            *META,
            F.array().cast("array<string>").alias("_unchanged"),
            (F.col("_valid_from_time") if timed else F.lit(None).cast("timestamp")).alias(
                "_commit_time"
            ),
            F.lit(False).alias("_moved"),
        )
        if ops is None:
            ops = b
        else:
            ops = b.unionByName(ops.select(*_cast_like(F, b)))
    if ops is None:
        return None
    fill = [c for c in unchanged if c in columns]
    if fill:
        w = (
            Window.partitionBy(*part)
            .orderBy("_commit_lsn", "_tx_ordinal", "_sub")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        sel = []
        missing = []
        for c in columns:
            if c not in fill:
                sel.append(F.col(quoted(c)))
                continue
            is_u = F.array_contains("_unchanged", c)
            typ = ops.schema[c].dataType
            # what the key's history knows of c: a value, or that a delete ended the row;
            # an upsert with c unchanged says nothing (null: skipped by last(ignorenulls))
            known = F.when(
                ~F.col("_upsert"),
                F.struct(F.lit(None).cast(typ).alias("v"), F.lit(True).alias("gone")),
            ).when(~is_u, F.struct(F.col(quoted(c)).alias("v"), F.lit(False).alias("gone")))
            prev = F.last(known, ignorenulls=True).over(w)
            ok = prev.isNotNull() & ~prev["gone"]
            now = F.col(quoted(c))
            sel.append(F.when(F.col("_upsert") & is_u, prev["v"]).otherwise(now).alias(c))
            missing.append(F.when(F.col("_upsert") & is_u & ~ok, F.lit(c)))
        rest = [c for c in ops.columns if c not in columns]  # pgcdc's own names: no quotes
        ops = ops.select(*sel, *rest, F.array_compact(F.array(*missing)).alias("_unresolved"))
    else:
        ops = ops.withColumn("_unresolved", F.array().cast("array<string>"))
    return ops


def _check_resolved(F, name, rows, keys):
    part = [F.col(f"_k{i}").alias(k) for i, k in enumerate(keys)]
    bad = (
        rows.where(F.size("_unresolved") > 0)
        .select(F.struct(*part).alias("_key"), "_unresolved", "_commit_lsn")
        .head()
    )
    if bad is not None:
        raise ApplyError(
            f"{name}: the change at commit LSN {format_lsn(bad['_commit_lsn'])} to key "
            f"{bad['_key'].asDict()} leaves column(s) {bad['_unresolved']} unchanged (TOAST), and "
            "no earlier value of the row is known under this key (it moved here by a key "
            "change, or the state was built without it): use REPLICA IDENTITY FULL, or apply "
            "from a snapshot that holds the row"
        )


def _state(F, scd, ce, name, base, changes, keys, columns, truncate, unchanged, ts):
    """The table's new state: ``base`` with ``changes`` applied as SCD ``scd`` (1 or 2)."""
    if scd == 1:
        lsn_of = _lsn_finder(F, ce, name)
        return _scd1(F, name, base, changes, keys, columns, truncate, unchanged, ts, lsn_of)
    if not keys:
        raise ApplyError(f"{name}: SCD2 needs a key; the table has none")
    return _scd2(F, name, base, changes, keys, columns, truncate, unchanged, ts)


def _scd1(F, name, base, changes, keys, columns, truncate, unchanged, ts, lsn_of=None):
    from pyspark.sql import Window

    if not keys:
        return _bag(F, name, base, changes, columns, truncate, ts, lsn_of)
    ops = _history(F, name, base, changes, keys, columns, truncate, unchanged, ts)
    if ops is None:
        return _base_rows(F, base, columns, ts).limit(0)
    w = Window.partitionBy(*_key_parts(keys)).orderBy(
        F.col("_commit_lsn").desc(), F.col("_tx_ordinal").desc(), F.col("_sub").desc()
    )
    latest = ops.withColumn("_rn", F.row_number().over(w)).where(
        (F.col("_rn") == 1) & F.col("_upsert")
    )
    if unchanged:
        _check_resolved(F, name, latest, keys)
    return latest.select(*_cols(F, columns), SPECIAL, *META)


def _scd2(F, name, base, changes, keys, columns, truncate, unchanged, ts):
    from pyspark.sql import Window

    history = base
    current = None
    if base is not None and "_is_current" not in base.columns:
        # a snapshot's rows (a table's first version): its state at the snapshot's point,
        # every row current from there (``_valid_from_time`` unknown: null)
        history, current = None, base
    elif base is not None:
        closed = base.where(~F.col("_is_current"))
        current = base.where(F.col("_is_current")).drop(
            "_valid_from_lsn", "_valid_to_lsn", "_valid_to_time", "_is_current"
        )
        history = closed
    ops = _history(F, name, current, changes, keys, columns, None, unchanged, ts)
    w = Window.partitionBy(*_key_parts(keys)).orderBy("_commit_lsn", "_tx_ordinal", "_sub")
    nxt = F.lead(F.struct("_commit_lsn", "_commit_time")).over(w)
    rows = ops.withColumn("_next", nxt).where(F.col("_upsert"))
    if unchanged:
        _check_resolved(F, name, rows, keys)
    valid_to_lsn = F.col("_next._commit_lsn")
    valid_to_time = F.col("_next._commit_time")
    if truncate is not None:
        t_lsn, t_ord = truncate["commit_lsn"], truncate["tx_ordinal"]
        before_t = ~_seq_after(F, "_commit_lsn", "_tx_ordinal", t_lsn, t_ord)
        ends_after_t = valid_to_lsn.isNull() | (valid_to_lsn > F.lit(t_lsn))
        cut = before_t & ends_after_t
        valid_to_lsn = F.when(cut, F.lit(t_lsn)).otherwise(valid_to_lsn)
        valid_to_time = F.when(cut, F.lit(None).cast("timestamp")).otherwise(valid_to_time)
    out = rows.select(
        *_cols(F, columns),
        SPECIAL,
        *META,
        F.col("_commit_lsn").alias("_valid_from_lsn"),
        F.col("_commit_time").alias("_valid_from_time"),
        valid_to_lsn.alias("_valid_to_lsn"),
        valid_to_time.alias("_valid_to_time"),
    ).withColumn("_is_current", F.col("_valid_to_lsn").isNull())
    if history is not None:
        # closed versions in the table's columns now: a column added since is null in them,
        # a dropped one goes, a widened one takes its new type (as the current rows do)
        have = set(history.columns)
        out = history.select(*[
            (F.col(quoted(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in out.schema.fields
        ]).unionByName(out)  # fmt: skip
    return out


def _bag(F, name, base, changes, columns, truncate, ts, lsn_of=None):
    """Tables without a key: rows as a multiset (see the module docstring)."""
    parts = []
    if base is not None and truncate is None:
        parts.append(_base_rows(F, base, columns, ts).withColumn("_n", F.lit(1)))
    if changes is not None:
        ch = changes
        if truncate is not None:
            ch = ch.where(
                _seq_after(
                    F, "_commit_lsn", "_tx_ordinal", truncate["commit_lsn"], truncate["tx_ordinal"]
                )
            )
        bad = ch.where(F.col("_bad")).select(*META).head()
        if bad is not None:
            op, lsn = lsn_of(bad["_commit_lsn"], bad["_tx_ordinal"])
            raise ApplyError(
                f"{name}: {'an update' if op == 'u' else 'a delete'} at LSN {lsn} "
                "has no old row image, and the table has no key to match it by"
            )
        # an insert or update adds its new row, an update or delete removes its old one
        parts.append(
            ch.select(
                *_cols(F, columns),
                SPECIAL,
                *META,
                F.when(F.col("_upsert"), F.lit(1)).otherwise(F.lit(-1)).alias("_n"),
            )
        )
    if not parts:
        return None
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p.select(*_cast_like(F, rows)))
    group = [*_cols(F, columns), F.to_json(F.col(SPECIAL)).alias("_special_key")]
    agg = rows.groupBy(*group).agg(
        F.sum("_n").alias("_n"),
        F.first(SPECIAL).alias(SPECIAL),
        F.max(F.struct("_commit_lsn", "_tx_ordinal")).alias("_seq"),
    )
    bad = agg.where(F.col("_n") < 0).head()
    if bad is not None:
        raise ApplyError(
            f"{name}: {-bad['_n']} delete(s)/update(s) remove a row the state does not hold "
            f"(last at commit LSN {format_lsn(bad['_seq']['_commit_lsn'])})"
        )
    return (
        agg.where(F.col("_n") > 0)
        .withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col("_n").cast("int"))))
        .select(
            *_cols(F, columns),
            SPECIAL,
            F.col("_seq._commit_lsn").alias("_commit_lsn"),
            F.col("_seq._tx_ordinal").alias("_tx_ordinal"),
        )
    )


def apply_session(master: str = "local[*]", app_name: str = "pgcdc-apply", jvm_log=None):
    """The SparkSession ``pgcdc apply --master`` and ``pgcdc sync`` run on: what every session
    of pgcdc's sets (:func:`pgcdc.runtime.spark.session.session_conf`: quiet, UTC, INT64
    timestamps, Arrow, the driver JVM's options), with adaptive execution. On a master other
    than local, :func:`apply_changes` ships pgcdc and the codecs to the executors;
    ``PYSPARK_PYTHON`` names their interpreter (default: this one; on a local master its
    ``pgcdc-spark-python``, :mod:`pgcdc.runtime.spark.pyworker`). ``jvm_log``: where the
    JVM's stderr (its log) goes, a callable given its bytes (default: this process's
    stderr)."""
    import sys

    from pgcdc.runtime.spark.pyworker import worker_python

    # Spark's JVM prints start-up notes on stderr before any log level can be set; these
    # options keep a normal run silent (the log level is set again once the session exists)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local = master.startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", worker_python() if local else sys.executable)
    from pyspark.sql import SparkSession

    from pgcdc.runtime.spark.quiet import quiet_jvm_start
    from pgcdc.runtime.spark.session import session_conf, start_forkserver

    if local:
        start_forkserver()
    conf = {
        **session_conf(),
        "spark.sql.shuffle.partitions": str(max(2, 2 * (os.cpu_count() or 1))),
        "spark.sql.adaptive.enabled": "true",
    }
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with quiet_jvm_start(jvm_log):
        return builder.getOrCreate()


def stop_quietly(spark) -> None:
    """Stop a session without the JVM's log of its shutdown (a run that ended, or failed)."""
    try:
        spark.sparkContext.setLogLevel("OFF")
        spark.stop()
    except Exception:
        pass


def applied_lsn(out) -> str | None:
    """The commit LSN (text) a state directory is applied up to, or None."""
    from pgcdc.apply import delta

    try:
        if delta.is_remote(str(out)):
            fs, path = delta.filesystem(str(out))
            with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
                doc = json.loads(f.read())
        else:
            doc = json.loads((Path(out) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("applied_lsn") or None


# --- Delta Lake tables ----------------------------------------------------------------------------

TARGET_FILE_ROWS = 500_000  # rows per data file a keyed table is range-partitioned into


def _delta_state(root: str) -> dict:
    """The run summary of a Delta output (``_pgcdc_state.json``), or an empty one."""
    from pgcdc.apply import delta

    fs, path = delta.filesystem(root)
    try:
        with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
            doc = json.loads(f.read())
    except (FileNotFoundError, OSError) as e:
        if isinstance(e, FileNotFoundError) or "not exist" in str(e) or "NoSuchKey" in str(e):
            return {"format": STATE_FORMAT, "layout": "delta", "version": 1,
                    "applied_lsn": None, "tables": {}}  # fmt: skip
        raise ApplyError(delta.redact(f"{root}: reading {STATE_FILE}: {e}")) from None
    if doc.get("format") != STATE_FORMAT:
        raise ApplyError(f"{root}/{STATE_FILE}: not a pgcdc apply state file")
    if doc.get("layout") != "delta":
        raise ApplyError(f"{root} holds the parquet layout: apply to it with --format parquet")
    return doc


def _write_delta_state(root: str, doc: dict) -> None:
    from pgcdc.apply import delta

    if not delta.is_remote(root):
        _write_state(Path(delta._local(root)), doc)
        return
    fs, path = delta.filesystem(root)
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    try:
        with fs.open_output_stream(f"{path}/{STATE_FILE}") as f:  # one PUT: all or nothing
            f.write(data)
    except OSError as e:
        raise ApplyError(delta.redact(f"{root}: writing {STATE_FILE}: {e}")) from None


def _apply_delta(spark, captures, out, *, scd, tables, snapshot, split_records, lenient, ship,
                 rewrite, driver_bytes=0, log_cleanup=True, until=None, aside=frozenset(),
                 hold=False) -> ApplyReport:  # fmt: skip
    """apply_changes into Delta Lake tables: see the module docstring and
    :mod:`pgcdc.apply.delta`.

    The applied position is each table's own: the ``APP_ID`` transaction its last pgcdc commit
    carries (every change committed at or before it is in the table). ``_pgcdc_state.json``
    is a summary written after every table of a run has committed; its ``applied_lsn`` says
    that every table is applied at least that far, so a run reads the captures from there,
    and applies to each table only what is after its own position. A run killed between two
    tables' commits leaves each table at a consistent version (the old one or the new one);
    the next run skips the tables that committed and applies the rest."""
    from pgcdc.apply import delta

    root = str(out)
    if not delta.is_remote(root):
        root = delta._local(root)
        Path(root).mkdir(parents=True, exist_ok=True)
    doc = _delta_state(root)
    if doc.get("scd", scd) != scd:
        raise ApplyError(f"{out} holds SCD{doc['scd']} state; this run asks for SCD{scd}")
    source = _one_source(captures, doc.get("source"), root)
    floor = parse_lsn(doc["applied_lsn"]) if doc.get("applied_lsn") else None
    snap = _read_snapshot(snapshot) if snapshot else None

    def applies(name: str) -> bool:
        return _matches(tables, name) and name not in aside

    # tables a snapshot loads (no table yet) start from its point, which may be before what
    # the others hold (a table added to a running pgcdc sync, whose cycles went on while it was
    # snapshotted): the captures are read from there, the others skip what they hold
    exists = {n: delta.is_delta_table(delta.table_uri(root, n))
              for n in (snap["tables"] if snap else ()) if applies(n)}  # fmt: skip
    loading = {n for n, there in exists.items() if not there}
    read_from = floor
    if loading and floor is not None and snap["lsn"] is not None and snap["lsn"] <= floor:
        read_from = max(0, snap["lsn"] - 1)  # a change may commit at the point itself
    kwargs = {} if split_records is None else {"split_records": split_records}
    ce = change_events(spark, captures, lenient=lenient, min_commit_lsn=read_from, ship=ship,
                       until=until, load=applies, **kwargs, **_learnt(doc))  # fmt: skip
    names = set(ce.tables) | set(doc["tables"]) | (set(snap["tables"]) if snap else set())
    names = sorted(n for n in names if applies(n))
    uris = {n: delta.table_uri(root, n) for n in names}
    # each table open once a run, brought to its commit (delta-rs lists _delta_log at every
    # open: a cycle opened a table five times, 60 ms each after a day of commits a second)
    opened = {}
    position = {}
    for n in names:
        if n not in exists:
            exists[n] = delta.is_delta_table(uris[n])
        if exists[n]:
            opened[n] = delta.open_table(uris[n])
        own = delta.position(uris[n], opened[n]) if exists[n] else None
        known = [p for p in (own, floor) if p is not None]
        if n in loading:
            known = []  # the snapshot's point is its floor (_write_delta_table)
        position[n] = max(known) if known else None
    keys_of = {name: _keys(name, ts, doc, snap) for name, ts in ce.tables.items()}
    # a small run of current state: its operations computed here, and each table the driver
    # can write (driver_apply) written without a Spark job
    small = (driver_bytes and scd == 1 and snap is None and rewrite == "files"
             and driver_apply.run_bytes(ce) <= driver_bytes)  # fmt: skip
    if small:
        driver_ops, acc = driver_apply.driver_ops(ce, keys_of)
        ops = None  # Spark's, made when a table is for Spark after all
    else:
        ops, acc = change_ops(resolve(spark), ce, keys_of, reduce=scd == 1)
    changed = [n for n in ce.tables if applies(n)]
    guessing = (
        not small
        and ce.seeds is not None
        and len(ce.tables) == 1
        and changed
        and keys_of[changed[0]]
        and not exists.get(changed[0])
    )
    cached = not small and ce.seeds is not None and not guessing
    ops_rows = None
    if cached:
        from pyspark import StorageLevel  # here: a run the driver applies needs no Spark

        ops = ops.persist(StorageLevel.MEMORY_AND_DISK)
        ops_rows = ops.count()
    stats = _stats(acc)
    run = delta.run_id()
    report = ApplyReport()
    new_doc = {**doc, "scd": scd, "layout": "delta", "tables": dict(doc["tables"])}
    if source is not None:
        new_doc["source"] = source
    current = None  # the table being written: an error says which (table_of)
    try:
        for name in names:
            current = name
            base_snapshot = snap is not None and not exists[name] and name in snap["tables"]
            st = _GUESS if guessing and name in ce.tables else stats.get(name)
            if st is not _GUESS and st is not None and position[name] is not None:
                if st["last"]["commit_lsn"] <= position[name]:
                    st = None  # everything of it in the captures is in the table already
            if st is None and not base_snapshot:
                continue
            while True:
                got = None
                if small and exists[name] and name in ce.tables:
                    got = driver_apply.table_files(
                        uris[name], name, ce, driver_ops, keys_of[name], list(ce.tables[name].latest),
                        st, position[name], run, opened[name],
                    )  # fmt: skip
                if got is None and small and ops is None:
                    ops = change_ops(resolve(spark), ce, keys_of, reduce=True)[0]
                written, commit_args, entry = got or _write_delta_table(
                    resolve(spark), uris[name], name, ce, ops, exists[name], snap, base_snapshot, st,
                    scd, doc, position[name], rewrite, run, ops_rows,
                )  # fmt: skip
                if st is not _GUESS:
                    break
                stats = _stats(acc)
                st = stats.get(name)
                if (st is not None and not st["truncate"] and not st["unchanged"]
                        and not (base_snapshot and _snapshot_is_newer(st, snap))):  # fmt: skip
                    break  # the guess held
                delta.delete_files(uris[name], written)
                if st is None and not base_snapshot:
                    written = None
                    break
            if written is None:
                continue
            last = _run_end(stats, floor)
            end = (
                last
                if last is not None
                else (applied_before(snap["lsn"]) if base_snapshot else None)
            )
            ordinal = _last_ordinal(stats, end)
            source = _source(name, ce.tables.get(name), snap)
            meta = {"pgcdc.run": run, "pgcdc.table": name, "pgcdc.source": source}
            if end is not None:
                meta.update({"pgcdc.commit_lsn": format_lsn(end), "pgcdc.tx_ordinal": ordinal})
            dt = opened.get(name)
            version = delta.commit(uris[name], written, app_version=end, metadata=meta,
                                   dt=dt, log_cleanup=log_cleanup,
                                   description=json.dumps({"pgcdc.source": source}),
                                   **commit_args)  # fmt: skip
            rows = sum(r or 0 for _p, _s, r in delta.current_files(uris[name], dt))
            report[name] = rows
            new_doc["tables"][name] = {**entry, "version": version, "rows": rows}
        current = None
        last = _run_end(stats, floor)
        if last is not None and (floor is None or last > floor) and not hold:
            new_doc["applied_lsn"] = format_lsn(last)
        if _close_run(report, ce, captures, doc, new_doc, changed=bool(report), stats=stats):
            _write_delta_state(root, new_doc)  # a summary: the tables' commits are the truth
    except Exception as e:
        if current is not None:
            e.pgcdc_table = current  # (an attribute, not a note: the message stays the last line)
        raise
    finally:
        if cached:
            ops.unpersist()
    return report


def table_of(error: BaseException) -> str | None:
    """The table :func:`apply_changes` was writing when ``error`` was raised, or None."""
    return getattr(error, "pgcdc_table", None)


def _source(name: str, ts, snap) -> dict:
    """The PostgreSQL table a Delta table holds: its schema, name and OID (the latest
    Relation message's, else the snapshot's; None when neither says)."""
    if ts is not None:
        return {"schema": ts.schema, "table": ts.table, "oid": ts.relation_oid or None}
    schema, table = split_key(name) or ("", name)  # (a cut key: the Relation says)
    oid = (snap or {}).get("oids", {}).get(name)
    return {"schema": schema, "table": table, "oid": oid}


def applied_before(point: int | None) -> int | None:
    """The applied position a snapshot taken at ``point`` stands for: the slot sends every
    transaction whose commit record starts at or after its consistent point, the snapshot
    holds those before it, so one committing exactly at the point is still to apply."""
    return None if point is None else point - 1


def _run_end(stats: dict, floor) -> int | None:
    last = max((st["last"]["commit_lsn"] for st in stats.values()), default=None)
    if floor is not None and (last is None or last < floor):
        return floor
    return last


def _last_ordinal(stats: dict, end) -> int:
    return max(
        (st["last"]["tx_ordinal"] for st in stats.values() if st["last"]["commit_lsn"] == end),
        default=0,
    )


def _write_delta_table(spark, uri, name, ce, ops, exists, snap, base_snapshot, st, scd, doc,
                       position, rewrite, run, ops_rows=None):  # fmt: skip
    """Write a table's new files: (the files, commit() arguments, its summary entry). With
    ``rewrite="files"``, a keyed table without a truncate in the run rewrites only the files
    that hold a (current) row of a changed key, and adds the rest as new files.

    Files of keyed tables hold key ranges (``repartitionByRange``, about TARGET_FILE_ROWS
    rows each), so that a run changing a range of keys (recent rows, say) rewrites few. Not
    in a table's first write from the captures alone (the single pass: the range sampling
    would decode the captures a second time): its files are the window's hash partitions,
    and the first later run that rewrites them writes key ranges."""
    from functools import reduce

    from pyspark.sql import functions as F

    from pgcdc.apply import delta

    ts = ce.tables.get(name)
    newer = base_snapshot and _snapshot_is_newer(st, snap)
    if newer:  # its columns and key are the snapshot's, not those of a Relation message before
        ts, st = None, None  # (and no change of it to apply)
    keys = snap["keys"].get(name) if newer else _keys(name, ts, doc, snap)
    columns = list(ts.latest) if ts else (doc["tables"].get(name) or {}).get("columns")
    columns = None if newer else columns  # (then the snapshot's, below)
    base_all = base = None
    floor = None
    current = []
    if exists:
        base_all = delta.read_rows(spark, uri, with_file=True)
        current = delta.current_files(uri)
    elif base_snapshot:
        base = _snapshot_rows(spark, snap["tables"][name])
        floor = (snap["lsn"], 0)
    if columns is None:
        have = (base_all if base_all is not None else base).columns
        skip = {SPECIAL, *META, *SCD2_META, "_is_current", "_file"}
        columns = [c for c in have if c not in skip]
    # the names its files store the columns under: those the table has kept
    stored = stored_names(columns, delta.column_names(uri) if exists else None,
                          reserved=_state_columns((), scd))  # fmt: skip
    changes = None
    if st is not None:
        changes = _table_ops(F, ops, list(ce.tables).index(name), ts, keys, columns)
    if changes is not None and floor is not None and floor[0] is not None:
        changes = changes.where(_seq_after(F, "_commit_lsn", "_tx_ordinal", *floor))
    if changes is not None and position is not None:
        changes = changes.where(F.col("_commit_lsn") > F.lit(position))
    truncate = st["truncate"] if st is not None else None
    if truncate is not None and position is not None and truncate["commit_lsn"] <= position:
        truncate = None
    unchanged = list(st["unchanged"] or []) if st is not None else []
    remove, overwrite = None, False
    rewritten_rows = None
    if base_all is not None:
        same_columns = [c for c in base_all.columns if c != "_file"] == _state_columns(columns, scd)
        by_files = (
            rewrite == "files" and keys and truncate is None and changes is not None
            and same_columns
        )  # fmt: skip
        candidates = None
        if by_files:
            # the files that may hold a changed key: by the key's min/max in each file's
            # statistics (one integer key, changed keys few enough to bring to the driver),
            # else all; then their key columns are joined with the changed keys
            candidates = _candidate_files(F, spark, uri, keys, ts, changes, ops_rows, stored)
            if candidates is not None and len(candidates) == len(current):
                by_files = False  # every file may hold one: the join would find them all
        if by_files:
            held = base_all
            if candidates is not None:
                held = delta.read_rows(spark, uri, with_file=True, files=candidates)
            held = held.where(F.col("_is_current")) if scd == 2 else held

            def typed(k):
                col = F.col(quoted(k))
                return col.cast(ts.spark_type(k)) if ts is not None and k in ts.names else col

            bk = held.select(
                *[typed(k).alias(f"_k{i}") for i, k in enumerate(keys)],
                *[F.col(SPECIAL)[k].alias(f"_kt{i}") for i, k in enumerate(keys)],
                "_file",
            )
            ck = changes.select(*[F.col(c).alias(f"_c{c}") for c in _key_parts(keys)]).distinct()
            if ops_rows is not None and ops_rows <= BROADCAST_KEYS:
                ck = F.broadcast(ck)  # no shuffle of the table's keys
            cond = reduce(
                lambda a, b: a & b, [bk[c].eqNullSafe(ck[f"_c{c}"]) for c in _key_parts(keys)]
            )
            hit = {
                r[0] for r in bk.join(ck, cond, "left_semi").select("_file").distinct().collect()
            }
            # only those files are read again (a filter on _file would read every file)
            base = delta.read_rows(spark, uri, files=sorted(hit))
            remove = [(p, size) for p, size, _r in current if p in hit]
            rewritten_rows = sum(r or 0 for p, _s, r in current if p in hit)
        else:
            base = base_all.drop("_file")
            overwrite = True
            rewritten_rows = sum(r or 0 for _p, _s, r in current)
    elif base_snapshot:
        rewritten_rows = _snapshot_row_count(snap["tables"][name])
    state = _state(F, scd, ce, name, base, changes, keys, columns, truncate, unchanged, ts)
    state = state.toDF(*[stored.get(c, c) for c in state.columns])
    if remove is not None and not delta.same_schema(uri, delta.arrow_schema(state.schema)):
        # the table's types change (a column's type was altered): rewrite all of it
        return _write_delta_table(spark, uri, name, ce, ops, exists, snap, base_snapshot, st,
                                  scd, doc, position, "table", run, ops_rows)  # fmt: skip
    if keys and (rewritten_rows is not None or ops_rows is not None):
        # key ranges, so a later run that changes some keys rewrites few files
        estimate = (rewritten_rows or 0) + (ops_rows or 0)
        by = [F.col(quoted(stored[k])) for k in keys]
        state = state.repartitionByRange(max(1, -(-estimate // TARGET_FILE_ROWS)), *by)
    schema = delta.arrow_schema(state.schema, {s: c for c, s in stored.items()})
    written = delta.write_files(state, uri, delta.attempt_dir(run))
    entry = {
        "keys": list(keys) if keys else None,
        "columns": columns,
        **_renamed(stored),
        "files_removed": len(current) if overwrite else len(remove or []),
        "files_added": len(written),
        "bytes_removed": (
            sum(s for _p, s, _r in current) if overwrite else sum(s for _p, s in remove or [])
        ),
        "bytes_added": sum(f.size for f in written),
    }
    return written, {"schema": schema, "remove": remove, "overwrite": overwrite}, entry


def _snapshot_is_newer(st, snap) -> bool:
    """Whether a table loaded from snapshot ``snap`` has no change after the snapshot's point
    in the run (``st``, its statistics; not a guess): its latest Relation message, if any,
    came before the point, and may describe the table before an ``ALTER TABLE`` the snapshot
    saw (a column added, renamed or retyped with no change of the table since: pgoutput sends
    a Relation message only before a change). A change after the point comes after a Relation
    message of the table as it was then (the ALTER waited for the transactions that wrote it,
    and the server sends the table's Relation message again before its next change)."""
    if st is _GUESS or snap["lsn"] is None:
        return False
    return st is None or st["last"]["commit_lsn"] < snap["lsn"]


BROADCAST_KEYS = 2_000_000  # changed keys up to this many: joined by broadcast, pruned by stats


def _candidate_files(F, spark, uri, keys, ts, changes, ops_rows, stored) -> list | None:
    """Paths of the table's files whose statistics say they may hold one of the changed keys
    (a single integer key), or None (every file may); ``stored``: the columns' stored names."""
    import bisect

    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType

    from pgcdc.apply import delta

    if len(keys) != 1 or ts is None or keys[0] not in ts.names:
        return None
    if not isinstance(ts.spark_type(keys[0]), (ByteType, ShortType, IntegerType, LongType)):
        return None
    if ops_rows is None or ops_rows > BROADCAST_KEYS:
        return None
    ranges = delta.key_ranges(uri, stored[keys[0]])
    if ranges is None:
        return None
    got = changes.select("_k0").distinct().collect()
    values = sorted(r[0] for r in got if r[0] is not None)
    with_null = any(r[0] is None for r in got)
    out = []
    for path, (lo, hi, nulls) in ranges.items():
        if with_null and nulls:
            out.append(path)
            continue
        if lo is None:
            continue
        i = bisect.bisect_left(values, lo)
        if i < len(values) and values[i] <= hi:
            out.append(path)
    return out


def _snapshot_rows(spark, path: str):
    """A snapshot table's rows: a Delta table (committed by
    :func:`pgcdc.apply.delta.commit_parquet_dir`) or a plain Parquet dataset."""
    from pgcdc.apply import delta

    if delta.is_delta_table(path):
        return delta.read_rows(spark, path)
    return spark.read.parquet(path)


def _snapshot_row_count(path: str) -> int:
    import pyarrow.parquet as pq

    from pgcdc.apply import delta

    if delta.is_delta_table(path):
        return sum(r or 0 for _p, _s, r in delta.current_files(path))
    return sum(pq.read_metadata(p).num_rows for p in Path(path).rglob("*.parquet"))


def _renamed(stored: dict) -> dict:
    """A table's summary entry's ``names``: {stored name: PostgreSQL name} of the columns its
    files store under another name (:mod:`.names`), when there are any."""
    renamed = {s: c for c, s in stored.items() if s != c}
    return {"names": renamed} if renamed else {}


def _state_columns(columns, scd: int) -> list[str]:
    cols = [*columns, SPECIAL, *META]
    if scd == 2:
        cols += [*SCD2_META, "_is_current"]
    return cols
