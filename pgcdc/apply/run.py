"""Apply change events to Delta Lake tables: :func:`apply_changes`, the one entry point.

A run goes through five steps, each once: **plan** (:func:`_plan`: the summary, the snapshot,
the change events of the captures, each table's key and applied position), **operations**
(:class:`_Operations`: the flat per-key operations of :mod:`pgcdc.apply.ops`, computed in the
driver for a small run or by Spark's tasks), **write** (per table, its new data files: by the
driver where :mod:`pgcdc.apply.driver` can, else by Spark from the SCD frames of
:mod:`pgcdc.apply.scd`), **commit** (per table, one Delta version carrying its position:
:func:`pgcdc.apply.delta.commit`), and **state** (the run summary, after every table
committed: :mod:`pgcdc.apply.state`). The design, the layout of ``OUT`` and the guarantees
are in :mod:`pgcdc.apply`.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from pgcdc.apply import delta
from pgcdc.apply import driver as driver_apply
from pgcdc.apply import snapshot_load
from pgcdc.apply.ops import change_ops
from pgcdc.apply.scd import (
    META,
    SCD2_META,
    SPECIAL,
    key_parts,
    seq_after,
    state_columns,
    table_ops,
    table_state,
)
from pgcdc.apply.state import (
    ApplyError,
    ApplyReport,
    applied_before,
    close_run,
    learnt,
    one_source,
    read_snapshot,
    read_state,
    snapshot_row_count,
    snapshot_rows,
    table_keys,
    write_state,
)
from pgcdc.events.jsonlines import table_matches
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.spark.changes import change_events
from pgcdc.spark.later import resolve, started
from pgcdc.spark.names import quoted, stored_names
from pgcdc.spark.session import quiet_spark
from pgcdc.tablekey import split_key

__all__ = ["apply_changes"]

TARGET_FILE_ROWS = 500_000  # rows per data file a keyed table is range-partitioned into
BROADCAST_KEYS = 2_000_000  # changed keys up to this many: joined by broadcast, pruned by stats


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
    order) to the Delta Lake tables under ``out`` (a local path or ``s3://bucket/prefix``; see
    :mod:`pgcdc.apply.delta`); returns a report {table: rows in its new version}.
    ``tables``: shell patterns on schema.table or table. ``snapshot``: a directory following
    the snapshot contract (:mod:`pgcdc.apply.state`), loaded as the initial state of tables
    not yet in ``out``. ``ship``: see :func:`pgcdc.spark.changes.change_events` (on a cluster,
    the packages are zipped and added to the executors). ``format``: ``"delta"``, the one
    layout (the parquet layout of pgcdc 0.2 was removed). ``rewrite``: ``"files"`` rewrites
    only the data files that hold a changed key, ``"table"`` every file. ``driver_bytes``: a
    run reading at most this many bytes of records is applied in the driver where it can be
    (:mod:`pgcdc.apply.driver`: no Spark job for a small run; the same tables).
    ``log_cleanup``: False when the caller cleans the tables' logs itself (see
    :func:`pgcdc.apply.delta.commit`). ``until``: the capture directory's durable position to
    read to rather than its ``state.json``'s (:class:`pgcdc.capture.segments.State`; a
    Structured Streaming batch's end).

    The values of the tables a run does not apply (``tables`` matches them not) are not
    loaded: a value of theirs that does not load stops nothing. ``aside``: tables set aside
    (:mod:`pgcdc.sync.aside`): not applied, not loaded, and the summary's applied position
    does not wait for them (their changes are passed over: such a table comes back by a
    snapshot). ``hold``: the summary's applied position stays where it is, so that a run that
    applies some tables only (``tables``, ``aside``) leaves the changes of the others to a
    later run; each table's commits carry its own position as always."""
    if scd not in (1, 2):
        raise ValueError(f"scd must be 1 or 2, not {scd!r}")
    if format != "delta":
        raise ValueError(
            f"format {format!r}: the parquet layout was removed; apply writes Delta Lake tables"
        )
    if rewrite not in ("files", "table"):
        raise ValueError(f"rewrite must be 'files' or 'table', not {rewrite!r}")
    if started(spark):  # a session still starting (pgcdc sync) is made quiet as it starts
        quiet_spark(spark)
    plan = _plan(spark, captures, out, scd=scd, tables=tables, snapshot=snapshot,
                 split_records=split_records, lenient=lenient, ship=ship, until=until,
                 aside=aside)  # fmt: skip
    ops = _Operations(spark, plan, scd=scd, rewrite=rewrite, driver_bytes=driver_bytes)
    report = ApplyReport()
    new_doc = {**plan.doc, "scd": scd, "layout": "delta", "tables": dict(plan.doc["tables"])}
    if plan.source is not None:
        new_doc["source"] = plan.source
    current = None  # the table being written: an error says which (state.table_of)
    try:
        for name in plan.names:
            current = name
            got = _write(spark, plan, ops, name, scd=scd, rewrite=rewrite)
            if got is None:
                continue
            written, commit_args, entry = got
            version = _commit(plan, ops.stats, name, written, commit_args, log_cleanup)
            rows = sum(r or 0 for _p, _s, r in delta.current_files(plan.uris[name],
                                                                    plan.opened.get(name)))  # fmt: skip
            report[name] = rows
            new_doc["tables"][name] = {**entry, "version": version, "rows": rows}
        current = None
        last = _run_end(ops.stats, plan.floor)
        if last is not None and (plan.floor is None or last > plan.floor) and not hold:
            new_doc["applied_lsn"] = format_lsn(last)
        if close_run(report, plan.ce, captures, plan.doc, new_doc, changed=bool(report),
                     stats=ops.stats):  # fmt: skip
            write_state(plan.root, new_doc)  # a summary: the tables' commits are the truth
    except Exception as e:
        if current is not None:
            e.pgcdc_table = current  # (an attribute, not a note: the message stays the last line)
        raise
    finally:
        ops.release()
    return report


# --- plan -----------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What a run reads before it writes: the summary (``doc``) and its applied position
    (``floor``), the snapshot (``snap``), the change events (``ce``), and per table to apply
    (``names``): its URI, whether it is a Delta table yet, the table opened, its own applied
    position and its key."""

    root: str
    doc: dict
    source: dict | None
    floor: int | None
    snap: dict | None
    ce: object
    names: list
    uris: dict
    exists: dict
    opened: dict
    position: dict
    keys_of: dict
    run: str


def _plan(spark, captures, out, *, scd, tables, snapshot, split_records, lenient, ship, until,
          aside) -> _Plan:  # fmt: skip
    """The applied position is each table's own: the ``APP_ID`` transaction its last pgcdc
    commit carries (every change committed at or before it is in the table). The summary's
    ``applied_lsn`` says that every table is applied at least that far, so a run reads the
    captures from there, and applies to each table only what is after its own position."""
    root = str(out)
    if not delta.is_remote(root):
        root = delta._local(root)
        Path(root).mkdir(parents=True, exist_ok=True)
    doc = read_state(root)
    if doc.get("scd", scd) != scd:
        raise ApplyError(f"{out} holds SCD{doc['scd']} state; this run asks for SCD{scd}")
    source = one_source(captures, doc.get("source"), root)
    floor = parse_lsn(doc["applied_lsn"]) if doc.get("applied_lsn") else None
    snap = read_snapshot(snapshot) if snapshot else None

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
                       until=until, load=applies, **kwargs, **learnt(doc))  # fmt: skip
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
            known = []  # the snapshot's point is its floor (_spark_files)
        position[n] = max(known) if known else None
    keys_of = {name: table_keys(name, ts, doc, snap) for name, ts in ce.tables.items()}
    return _Plan(root=root, doc=doc, source=source, floor=floor, snap=snap, ce=ce, names=names,
                 uris=uris, exists=exists, opened=opened, position=position,
                 keys_of=keys_of, run=delta.run_id())  # fmt: skip


def _matches(patterns, name: str) -> bool:
    names = split_key(name)
    if names is None:  # a cut key: its own name only
        return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)
    return not patterns or table_matches(patterns, *names)


# --- operations -----------------------------------------------------------------------------------

_GUESS = {"last": None, "truncate": None, "unchanged": []}


class _Operations:
    """The run's operations and their statistics (``stats``: {table: {"last", "truncate",
    "unchanged", "errors"}}). A small run of current state computes them here (``small``:
    each table the driver can write is written without a Spark job; Spark's are made only
    for a table that is for Spark after all); else Spark's tasks do. One table with a key
    and no table yet is written in the same pass (``guessing``), planned on a guess (no
    truncate, no unchanged TOAST columns) that the statistics gathered on the way then
    confirm, or not; else one pass fills a cache the tables are written from."""

    def __init__(self, spark, plan: _Plan, *, scd: int, rewrite: str, driver_bytes: int):
        ce, keys_of = plan.ce, plan.keys_of
        self._spark, self._ce, self._keys_of = spark, ce, keys_of
        self.small = bool(driver_bytes and scd == 1 and plan.snap is None and rewrite == "files"
                          and driver_apply.run_bytes(ce) <= driver_bytes)  # fmt: skip
        self.driver = None  # the driver's (an Arrow table), for a small run
        self.load_in_driver = bool(driver_bytes)  # a small snapshot table: snapshot_load
        self.spark = None  # Spark's (a DataFrame)
        if self.small:
            self.driver, self._acc = driver_apply.driver_ops(ce, keys_of)
        else:
            self.spark, self._acc = change_ops(resolve(spark), ce, keys_of, reduce=scd == 1)
        changed = [n for n in ce.tables if n in plan.position]
        self.guessing = bool(
            not self.small
            and ce.seeds is not None
            and len(ce.tables) == 1
            and changed
            and keys_of[changed[0]]
            and not plan.exists.get(changed[0])
        )
        self.cached = not self.small and ce.seeds is not None and not self.guessing
        self.rows = None  # how many, when the cache counted them
        if self.cached:
            from pyspark import StorageLevel  # lazy: pyspark (a small run needs no Spark)

            self.spark = self.spark.persist(StorageLevel.MEMORY_AND_DISK)
            self.rows = self.spark.count()
        self.stats = self.refresh()

    def refresh(self) -> dict:
        """The statistics gathered so far (a guessed write's pass adds to them)."""
        self.stats = {
            name: {
                "last": _seq(s["last"]),
                "truncate": _seq(s["truncate"]) if s["truncate"] is not None else None,
                "unchanged": sorted(s["unchanged"]),
                "errors": sorted(s.get("errors", ())),
            }
            for name, s in self._acc.value.items()
        }
        return self.stats

    def for_spark(self):
        """Spark's operations (made now for a small run that has a table for Spark)."""
        if self.spark is None:
            self.spark = change_ops(resolve(self._spark), self._ce, self._keys_of, reduce=True)[0]
        return self.spark

    def release(self) -> None:
        if self.cached:
            self.spark.unpersist()


def _seq(seq: tuple) -> dict:
    return {"commit_lsn": seq[0], "tx_ordinal": seq[1]}


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


# --- write ----------------------------------------------------------------------------------------


def _write(spark, plan: _Plan, ops: _Operations, name: str, *, scd: int, rewrite: str):
    """A table's new data files, written by the driver or by Spark: (the files, commit()
    arguments, its summary entry), or None when the run has nothing for it."""
    ce, snap = plan.ce, plan.snap
    base_snapshot = snap is not None and not plan.exists[name] and name in snap["tables"]
    st = _GUESS if ops.guessing and name in ce.tables else ops.stats.get(name)
    if st is not _GUESS and st is not None and plan.position[name] is not None:
        if st["last"]["commit_lsn"] <= plan.position[name]:
            st = None  # everything of it in the captures is in the table already
    if st is None and not base_snapshot:
        return None
    if base_snapshot and scd == 1 and st is not _GUESS and ops.load_in_driver:
        got = _load_snapshot(plan, name, st)
        if got is not None:
            return got
    while True:
        got = None
        if ops.small and plan.exists[name] and name in ce.tables:
            got = driver_apply.table_files(
                plan.uris[name], name, ce, ops.driver, plan.keys_of[name],
                list(ce.tables[name].latest), st, plan.position[name], plan.run,
                plan.opened[name],
            )  # fmt: skip
        if got is None:
            got = _spark_files(resolve(spark), plan, ops, name, base_snapshot, st, scd,
                               rewrite)  # fmt: skip
        if st is not _GUESS:
            return got
        st = ops.refresh().get(name)
        if (st is not None and not st["truncate"] and not st["unchanged"]
                and not (base_snapshot and _snapshot_is_newer(st, snap))):  # fmt: skip
            return got  # the guess held
        delta.delete_files(plan.uris[name], got[0])
        if st is None and not base_snapshot:
            return None


def _load_snapshot(plan: _Plan, name: str, st):
    """A snapshot table with no change to apply on top, loaded in the driver
    (:mod:`pgcdc.apply.snapshot_load`), or None."""
    snap = plan.snap
    newer = _snapshot_is_newer(st, snap)
    if st is not None and not newer:
        return None  # changes after its point: Spark applies them on top
    ts = None if newer else plan.ce.tables.get(name)
    keys = snap["keys"].get(name) if newer else table_keys(name, ts, plan.doc, snap)
    columns = None if newer else (
        list(ts.latest) if ts else (plan.doc["tables"].get(name) or {}).get("columns")
    )  # fmt: skip
    return snapshot_load.load_files(plan.uris[name], snap["tables"][name], keys, columns,
                                    plan.run)  # fmt: skip


def _spark_files(spark, plan: _Plan, ops: _Operations, name, base_snapshot, st, scd, rewrite):
    """Write a table's new files: (the files, commit() arguments, its summary entry). With
    ``rewrite="files"``, a keyed table without a truncate in the run rewrites only the files
    that hold a (current) row of a changed key, and adds the rest as new files.

    Files of keyed tables hold key ranges (``repartitionByRange``, about TARGET_FILE_ROWS
    rows each), so that a run changing a range of keys (recent rows, say) rewrites few. Not
    in a table's first write from the captures alone (the single pass: the range sampling
    would decode the captures a second time): its files are the window's hash partitions,
    and the first later run that rewrites them writes key ranges."""
    from pyspark.sql import functions as F  # lazy: pyspark

    ce, snap, doc, run = plan.ce, plan.snap, plan.doc, plan.run
    uri, exists, position = plan.uris[name], plan.exists[name], plan.position[name]
    ops_rows = ops.rows
    ts = ce.tables.get(name)
    newer = base_snapshot and _snapshot_is_newer(st, snap)
    if newer:  # its columns and key are the snapshot's, not those of a Relation message before
        ts, st = None, None  # (and no change of it to apply)
    keys = snap["keys"].get(name) if newer else table_keys(name, ts, doc, snap)
    columns = list(ts.latest) if ts else (doc["tables"].get(name) or {}).get("columns")
    columns = None if newer else columns  # (then the snapshot's, below)
    base_all = base = None
    floor = None
    current = []
    if exists:
        base_all = delta.read_rows(spark, uri, with_file=True)
        current = delta.current_files(uri)
    elif base_snapshot:
        base = snapshot_rows(spark, snap["tables"][name])
        floor = (snap["lsn"], 0)
    if columns is None:
        have = (base_all if base_all is not None else base).columns
        skip = {SPECIAL, *META, *SCD2_META, "_is_current", "_file"}
        columns = [c for c in have if c not in skip]
    # the names its files store the columns under: those the table has kept
    stored = stored_names(columns, delta.column_names(uri) if exists else None,
                          reserved=state_columns((), scd))  # fmt: skip
    changes = None
    if st is not None:
        changes = table_ops(F, ops.for_spark(), list(ce.tables).index(name), ts, keys, columns)
    if changes is not None and floor is not None and floor[0] is not None:
        changes = changes.where(seq_after(F, "_commit_lsn", "_tx_ordinal", *floor))
    if changes is not None and position is not None:
        changes = changes.where(F.col("_commit_lsn") > F.lit(position))
    truncate = st["truncate"] if st is not None else None
    if truncate is not None and position is not None and truncate["commit_lsn"] <= position:
        truncate = None
    unchanged = list(st["unchanged"] or []) if st is not None else []
    remove, overwrite = None, False
    rewritten_rows = None
    if base_all is not None:
        same_columns = [c for c in base_all.columns if c != "_file"] == state_columns(columns, scd)
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
            ck = changes.select(*[F.col(c).alias(f"_c{c}") for c in key_parts(keys)]).distinct()
            if ops_rows is not None and ops_rows <= BROADCAST_KEYS:
                ck = F.broadcast(ck)  # no shuffle of the table's keys
            cond = reduce(
                lambda a, b: a & b, [bk[c].eqNullSafe(ck[f"_c{c}"]) for c in key_parts(keys)]
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
        rewritten_rows = snapshot_row_count(snap["tables"][name])
    state = table_state(F, scd, ce, name, base, changes, keys, columns, truncate, unchanged, ts)
    state = state.toDF(*[stored.get(c, c) for c in state.columns])
    if remove is not None and not delta.same_schema(uri, delta.arrow_schema(state.schema)):
        # the table's types change (a column's type was altered): rewrite all of it
        return _spark_files(spark, plan, ops, name, base_snapshot, st, scd, "table")
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


def _candidate_files(F, spark, uri, keys, ts, changes, ops_rows, stored) -> list | None:
    """Paths of the table's files whose statistics say they may hold one of the changed keys
    (a single integer key), or None (every file may); ``stored``: the columns' stored names."""
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType  # lazy: pyspark

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


def _renamed(stored: dict) -> dict:
    """A table's summary entry's ``names``: {stored name: PostgreSQL name} of the columns its
    files store under another name (:mod:`.names`), when there are any."""
    renamed = {s: c for c, s in stored.items() if s != c}
    return {"names": renamed} if renamed else {}


# --- commit ---------------------------------------------------------------------------------------


def _commit(plan: _Plan, stats: dict, name: str, written, commit_args: dict, log_cleanup: bool
            ) -> int:  # fmt: skip
    """Commit a table's new files as one Delta version carrying its applied position (the
    ``pgcdc-apply`` transaction) and the run's metadata; returns the version."""
    snap = plan.snap
    base_snapshot = snap is not None and not plan.exists[name] and name in snap["tables"]
    last = _run_end(stats, plan.floor)
    end = last if last is not None else (applied_before(snap["lsn"]) if base_snapshot else None)
    ordinal = _last_ordinal(stats, end)
    source = _source(name, plan.ce.tables.get(name), snap)
    meta = {"pgcdc.run": plan.run, "pgcdc.table": name, "pgcdc.source": source}
    if end is not None:
        meta.update({"pgcdc.commit_lsn": format_lsn(end), "pgcdc.tx_ordinal": ordinal})
    return delta.commit(plan.uris[name], written, app_version=end, metadata=meta,
                        dt=plan.opened.get(name), log_cleanup=log_cleanup,
                        description=json.dumps({"pgcdc.source": source}),
                        **commit_args)  # fmt: skip


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


def _source(name: str, ts, snap) -> dict:
    """The PostgreSQL table a Delta table holds: its schema, name and OID (the latest
    Relation message's, else the snapshot's; None when neither says)."""
    if ts is not None:
        return {"schema": ts.schema, "table": ts.table, "oid": ts.relation_oid or None}
    schema, table = split_key(name) or ("", name)  # (a cut key: the Relation says)
    oid = (snap or {}).get("oids", {}).get(name)
    return {"schema": schema, "table": table, "oid": oid}
