"""``pgcdc sync``: tables added to the publication after the initial snapshot (or published
again after they were out of it), snapshotted and joined while the other tables go on.

After a cycle (at most every ``--tables-check``, 30 s) :func:`check` compares the
publication's tables with those the directory's snapshots hold. A table none holds is
snapshotted by :func:`take` in a thread of its own (:class:`Adding`): a temporary slot with an
exported snapshot, the table read at it by Spark tasks into
``DIR/_snapshot_added/<consistent point>/``. The cycles go on meanwhile, every table's, the new
one's too (its Delta directory holds what its changes alone build). Between two cycles,
:func:`finish` has :func:`load` replace the new table's Delta directory by the snapshot plus the
captured changes committed after its point (apply reads the captures from there for a table it
loads, though the others are past it; they skip what they hold), and ``_loaded`` marks it done.

Exact for the reasons the initial snapshot is: the point is past everything applied when the
slot is created, the capture holds every change after it (``Upkeep.prune`` deletes no segment
while a snapshot of added tables is under way or not loaded), and apply skips a table's
changes at or before its snapshot position. Killed before ``_loaded``, a rerun takes it again.

A loaded table whose columns changed, since its last snapshot, in a way no change carries
(:func:`unfollowable`: a column renamed, or retyped other than wider or narrower within its
kind) is snapshotted again the same way (SCD1; with ``--scd 2`` it is said once): the rows
not changed since would hold null (a rename) or the values the server has rewritten (a
retype). Columns changed with no change of the table since (no Relation message yet) are
seen in the catalog by :mod:`pgcdc.sync.drift` at the same checks.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

from pgcdc.apply import delta
from pgcdc.apply.run import apply_changes
from pgcdc.apply.state import STATE_FILE, STATE_FORMAT, applied_lsn
from pgcdc.capture.catalog import RELATIONS_FILE, read_catalog_lines, renamed_columns
from pgcdc.capture.walsender import WalsenderConnection
from pgcdc.durable import write_json
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.snapshot import server as pgsnap
from pgcdc.snapshot.server import list_published_tables, table_memberships
from pgcdc.spark.later import resolve
from pgcdc.spark.types import pg_arrow_type, widens
from pgcdc.sync import drift as columns
from pgcdc.tablekey import table_key

__all__ = [
    "ADDED", "LOADED", "UNPUBLISHED", "Adding", "Mark", "check", "finish", "snapshot_marks",
]  # fmt: skip

ADDED = "_snapshot_added"  # snapshots of tables published later: <consistent point>/<table>/
LOADED = "_loaded"  # in such a snapshot: apply loaded it
UNPUBLISHED = "_unpublished.json"  # loaded tables seen out of the publication: {table: when}
STAGE = "_stage_added"  # load(): the added tables built before each is swapped in
MEMBERSHIP = "_published.json"  # {table: the catalog rows that put it in the publication}


class Taken(NamedTuple):
    """What :func:`take` gives :func:`load`: the snapshot's directory, its tables, its
    consistent point, the rows of each table, and when it began (time.monotonic)."""

    target: Path
    names: list
    point: int
    rows: dict
    t0: float


class Adding:
    """A snapshot of tables added to the publication (:func:`take`), taken in a
    thread of its own so that the other tables' cycles go on while it runs."""

    def __init__(self, tables, again, unpublished: dict, take):
        self.tables, self.again, self.unpublished = tables, again, unpublished
        self.result: Taken | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(take,), daemon=True,
                                       name="pgcdc-snapshot-added")  # fmt: skip
        self.thread.start()

    def _run(self, take) -> None:
        try:
            self.result = take(self.tables, self.again)
        except BaseException as e:  # noqa: BLE001 - said by finish
            self.error = e

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


def check(sync) -> None:
    """A published table no snapshot of this directory holds (added to the publication
    later), or one seen out of the publication since it was loaded (its changes meanwhile
    never came): its snapshot is started in a thread (:func:`take`), and :func:`finish` loads
    it, or warns once with what to do."""
    if not (sync.snapshot_dir / "_snapshot.json").exists() or sync.snapshot_pending():
        return  # the initial snapshot first
    if sync.adding is not None:
        return  # one snapshot of added tables at a time: loaded before the next check
    try:
        published = list_published_tables(sync.connection(), sync.pubs)
    except Exception:  # the server is away: the next check asks again
        sync.disconnect()
        return
    try:
        now_members = table_memberships(sync.connection(), sync.pubs, published)
    except Exception:  # (away now, or a server before 12: no pg_partition_ancestors)
        sync.disconnect()
        now_members = None
    marks = snapshot_marks(sync)
    loaded = set(marks)
    names = {t.qualified_name for t in published}
    by_oid = {t.oid: t.qualified_name for t in published}
    # loaded tables out of the publication: recorded (their changes stop coming), and
    # snapshotted again if they come back
    path = sync.out / UNPUBLISHED
    try:
        was_out = json.loads(path.read_text())
    except (OSError, ValueError):
        was_out = {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # loaded tables removed from the publication and added back since the last check (none
    # of the catalog rows that put them there is left): their changes meanwhile never came
    try:
        recorded = json.loads((sync.out / MEMBERSHIP).read_text())
    except (OSError, ValueError):
        recorded = {}
    # a table no check has seen since its snapshot: compared with what the snapshot recorded
    # (a partition dropped, or the table removed and added back, between the two is said)
    had = {n: list(m.members) for n, m in marks.items() if m.members is not None}
    had.update(recorded)
    members = recorded if now_members is None else now_members  # (None: compared next time)
    gap = sorted(n for n in names & loaded if _rows_of(had.get(n)) and n in members
                 and not _rows_of(had[n]) & _rows_of(members[n]) and n not in was_out)  # fmt: skip
    if gap:
        sync.log.event("warning", "table_republished", f"{', '.join(gap)}: removed from "
                       f"{','.join(sync.pubs)} and added back since the last check: its "
                       "changes meanwhile never came; it is snapshotted again",
                       tables=gap)  # fmt: skip
        was_out = {**was_out, **dict.fromkeys(gap, now)}  # (recorded below: a rerun retakes)
    for name in sorted(names & loaded & set(had) & set(members)):
        gone = _leaves_of(had[name]) - _leaves_of(members[name])
        if gone and name not in gap:
            oids = ", ".join(sorted(x.split()[1] for x in gone))
            sync.log.event("warning", "partition_removed", f"{name}: partition(s) {oids} "
                           "detached or dropped: published through the partitioned table, "
                           "their rows left it with no change in the stream, and "
                           f"{sync.out / name} keeps them; to drop them, take its snapshot "
                           f"again: ALTER PUBLICATION {sync.pubs[0]} DROP TABLE {name}; "
                           f"ALTER PUBLICATION {sync.pubs[0]} ADD TABLE {name}",
                           table=name, partitions=sorted(gone))  # fmt: skip
    out = {n: was_out.get(n, now) for n in sorted(loaded | set(was_out)) if n not in names}
    left = sorted(set(out) - set(was_out))
    # (a loaded table whose OID is published under another name: renamed)
    renamed = {n: by_oid[marks[n].oid] for n in left if n in marks and marks[n].oid in by_oid}
    for name, to in sorted(renamed.items()):
        sync.log.event("warning", "table_renamed", f"{name}: renamed to {to} (the same "
                       f"table, OID {marks[name].oid}): {to} is snapshotted as a table "
                       f"added; {sync.out / name} is left as it is (its changes do not "
                       "come)", table=name, to=to, oid=marks[name].oid)  # fmt: skip
    left = [n for n in left if n not in renamed]
    if left:
        sync.log.event("warning", "table_unpublished", f"{', '.join(left)}: no longer in "
                       f"{','.join(sync.pubs)}: left as it is (its changes do not come); "
                       "published again, it is snapshotted again", tables=left)  # fmt: skip
    back = [n for n in names if n in was_out]
    if out.keys() | set(back) != was_out.keys() or gap:
        write_json(path, {**out, **{n: was_out[n] for n in back}})
    if members != recorded:  # after the gap is recorded as out: a rerun snapshots it
        write_json(sync.out / MEMBERSHIP, members)
    _full_identity_keys(sync, [t for t in published if t.qualified_name in loaded])
    changed = {**unfollowable(sync, marks), **replaced(published, marks)}
    # columns changed with no change of the table since: seen in the catalog
    changed.update(columns.look(sync, published, marks, skip=set(changed) | set(back)))
    if sync.config.scd != 1:  # a snapshot replaces a table's Delta directory: its history
        for name, what in sorted(changed.items()):
            if name not in sync.columns_warned:
                sync.columns_warned.add(name)
                sync.log.event("warning", "columns_changed", f"{name}: {what} after its "
                               "last snapshot, which no change carries to the rows not "
                               "changed since; with --scd 2 its snapshot is not taken again "
                               "(it would replace the history)", table=name)  # fmt: skip
        changed = {}
    new = [t for t in published if t.qualified_name not in loaded or t.qualified_name in back
           or t.qualified_name in changed]  # fmt: skip
    new = [t for t in new if t.qualified_name not in sync.warned_tables]
    if new:  # taken in a thread while the cycles go on; loaded between two of them
        sync.adding = Adding(new, back, out,
                             lambda tables, again: take(sync, tables, again, changed))  # fmt: skip
    _follow_columns(sync)


def _follow_columns(sync) -> None:
    """The tables whose columns changed with no change of them since, applied far enough:
    brought to their columns in place, or (:func:`pgcdc.sync.drift.settle` says which)
    snapshotted again in a thread, as an added table is."""
    again = columns.settle(sync, lambda: snapshot_marks(sync))
    if again and sync.adding is None:
        changed = {t.qualified_name: why for t, why in again}
        sync.adding = Adding([t for t, _w in again], (), {},
                             lambda tables, back: take(sync, tables, back, changed))  # fmt: skip


_PRIMARY_KEYS_SQL = """
SELECT i.indrelid::int8, array_agg(a.attname::text ORDER BY k.n)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indisprimary AND i.indrelid = ANY(%s::oid[])
GROUP BY i.indrelid
"""


def _full_identity_keys(sync, published) -> None:
    """Say once a run (``key_changed``) when a table published with REPLICA IDENTITY FULL
    has no longer the primary key apply merges its rows by: its Relation messages name every
    column, so apply keeps the key it had, and rows the server now tells apart by other
    columns (or, without a key, holds twice) are one row in the Delta table. No change says
    so; a snapshot taken again (DROP and ADD the table in the publication) mends it."""
    full = [t for t in published if t.replica_identity == "full"]
    doc = sync.applied_doc() if full else None
    if not doc:
        return
    merged_by = {t.oid: (doc.get("tables", {}).get(t.qualified_name) or {}).get("keys")
                 for t in full}  # fmt: skip
    full = [t for t in full if merged_by[t.oid] and t.qualified_name not in sync.keys_warned]
    if not full:
        return
    try:
        rows = sync.connection().execute(_PRIMARY_KEYS_SQL, [[t.oid for t in full]]).fetchall()
    except Exception:  # the server away: the next check asks again
        sync.disconnect()
        return
    primary = {oid: list(cols) for oid, cols in rows}
    for t in full:
        now = primary.get(t.oid)
        if now == list(merged_by[t.oid]):
            continue
        name = t.qualified_name
        sync.keys_warned.add(name)
        key = "no primary key" if now is None else f"primary key ({', '.join(now)})"
        sync.log.event("warning", "key_changed", f"{name}: published with REPLICA IDENTITY FULL "
                       f"and now with {key}, while {sync.out / name} merges its rows by "
                       f"({', '.join(merged_by[t.oid])}): rows the server tells apart by "
                       "other columns are one row there; to rebuild it, take its snapshot "
                       f"again: ALTER PUBLICATION {sync.pubs[0]} DROP TABLE {name}; "
                       f"ALTER PUBLICATION {sync.pubs[0]} ADD TABLE {name}",
                       table=name, keys=merged_by[t.oid], primary_key=now)  # fmt: skip


def finish(sync) -> None:
    """Once the thread has the snapshot of the added tables, load them (between cycles:
    the load replaces their Delta directories), and take those set aside up again
    (:meth:`pgcdc.sync.aside.SetAside.taken_up`). A table whose snapshot cannot be taken or
    loaded is set aside, with the way out (tables loaded together that fail are loaded
    one at a time, to tell whose the failure is)."""
    _follow_columns(sync)  # (a snapshot it starts is loaded by a later call)
    adding = sync.adding
    if adding is None or adding.running:
        return
    sync.adding = None
    names = [t.qualified_name for t in adding.tables]
    failed = dict.fromkeys(names, adding.error) if adding.error is not None else {}
    doing = "taking its snapshot"
    if not failed:
        try:
            load(sync, *adding.result)
        except Exception as e:  # noqa: BLE001 - whose: one table at a time
            if sync.stopper.requested:
                return  # cancelled: a rerun takes the snapshot again
            failed, doing = _load_each(sync, adding.result, e), "loading its snapshot"
        if adding.again and not failed:
            write_json(sync.out / UNPUBLISHED, adding.unpublished)  # loaded again
        sync.aside.taken_up(sync, [n for n in names if n not in failed])
    if not failed or sync.stopper.requested:
        return  # (cancelled: a rerun takes the snapshot again)
    if not isinstance(adding.error, (Exception, type(None))):
        raise adding.error
    sync.aside.answered(failed)  # (asked for again once the cause is fixed)
    for name, error in sorted(failed.items()):
        sync.warned_tables.add(name)  # not taken again by check() this run
        sync.aside.put(sync, name, error, doing=doing)


def _load_each(sync, taken: Taken, error: Exception) -> dict:
    """{table: its error} of the tables of ``taken`` that fail to load alone."""
    if len(taken.names) == 1:
        return {taken.names[0]: error}
    failed = {}
    for name in taken.names:
        try:
            load(sync, taken.target, [name], taken.point, {name: taken.rows.get(name, 0)},
                 taken.t0)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - set aside by the caller
            failed[name] = e
    return failed


def take(sync, tables, again=(), changed=None, why=None) -> Taken:
    """Snapshot ``tables`` (published after the initial snapshot) at the exported snapshot
    of a temporary slot, into ``DIR/_snapshot_added/<its consistent point>/``; runs in a
    thread (:class:`Adding`) while the cycles go on; :func:`load` loads it. ``why``: what
    the log line says it is taken for, when another caller than :func:`check` asks
    (:func:`pgcdc.sync.aside.serve`).

    Sound because that point is past everything applied when the slot is created, the
    capture holds every change after it (segments are not pruned meanwhile), and apply
    reads a table it loads from its snapshot's point (the other tables skip what they
    hold), skipping the changes at or before it."""
    import shutil

    from pgcdc.snapshot.job import SnapshotDataSource  # lazy: pyspark

    names = [t.qualified_name for t in tables]
    added = sync.out / ADDED
    for d in sorted(added.iterdir()) if added.is_dir() else ():
        if not (d / LOADED).exists():  # a load that never finished: taken again
            shutil.rmtree(d)
    changed = {n: w for n, w in (changed or {}).items() if n in names}
    if why is not None:
        pass
    elif changed:  # (said per table: the tables taken together may differ in why)
        why = "; ".join(w if len(names) == 1 else f"{n}: {w}" for n, w in sorted(changed.items()))
        why += ": no change in the stream says what that did to the rows not changed since"
    elif set(names) <= set(again):
        why = "published again after it was out of the publication"
    else:
        why = "added to the publication after the initial snapshot"
    sync.log.event("info", "table_added", f"{', '.join(names)}: {why}: taking a snapshot "
                   "of it", tables=names)  # fmt: skip
    t0 = time.monotonic()
    tmp_slot = f"{sync.config.slot}_add_{os.getpid()}"[:63]
    floor = applied_lsn(sync.out)  # read before the slot: the cycles go on meanwhile
    # the changes of columns the snapshot holds: those recorded before it (unfollowable)
    seen = len(read_catalog_lines(sync.capture_dir, name=RELATIONS_FILE))
    conn = WalsenderConnection.connect(sync.config.dsn, application_name="pgcdc sync")
    try:
        info = conn.create_slot(tmp_slot, temporary=True, snapshot="export")
        point = info.consistent_point
        if floor and parse_lsn(floor) > point:
            raise RuntimeError(f"the applied position {floor} is past the new snapshot's "
                             f"{format_lsn(point)}")  # fmt: skip
        with _snapshot_conn(sync) as c:
            catalog = pgsnap.catalog_docs(c, tables)
            members = pgsnap.memberships_or_none(c, sync.pubs, tables)
            shapes = pgsnap.table_shapes(c, tables)  # (the columns read: the tables')
        target = added / f"{point:016X}"
        spark = resolve(sync.spark)
        spark.dataSource.register(SnapshotDataSource)
        rows, keys = {}, {}
        oids = {t.qualified_name: t.oid for t in tables}
        for t in tables:
            df = (
                spark.read.format(SnapshotDataSource.name())
                .option("dsn", sync.config.dsn)
                .option("snapshot", info.snapshot_name)
                .option("commit_lsn", str(point))
                .option("table", json.dumps(t.to_dict()))
                .option("catalog", json.dumps(catalog))
                .load()
            )
            df.write.mode("overwrite").parquet(str(target / t.qualified_name))
            rows[t.qualified_name] = spark.read.parquet(str(target / t.qualified_name)).count()
            if t.key:
                keys[t.qualified_name] = list(t.key)
    finally:
        conn.close()  # the temporary slot goes with it
    doc = {"slot": tmp_slot, "consistent_point": format_lsn(point), "keys": keys,
           "oids": oids, "tables": rows, "relations_lines": seen}  # fmt: skip
    if members is not None:
        doc["members"] = members
    if shapes is not None:
        doc["shapes"] = shapes
    (target / "_snapshot.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    return Taken(target, names, point, rows, t0)


def load(sync, target: Path, names, point: int, rows: dict, t0: float) -> None:
    """Replace each added table's Delta table (what its changes alone built while it was
    snapshotted, or the table before a snapshot taken again) by its snapshot plus the changes
    committed after its point, in ONE commit per table: apply builds them in ``DIR/_stage_added``
    and :func:`pgcdc.apply.delta.replace_with_table` swaps each in, as the resync does. A
    reader sees the old version or the new one, never a table missing or half loaded, and the
    old versions stay readable by time travel. Killed before ``_loaded``, a rerun takes the
    snapshot again and replaces the table once more."""
    import glob
    import shutil

    stage = sync.out / STAGE
    shutil.rmtree(stage, ignore_errors=True)
    # the stage holds only tables loaded from the snapshot: each is applied from its point,
    # so it says so, and the captures are read from there rather than from their start
    scd = sync.config.scd
    stage.mkdir(parents=True)
    write_json(stage / STATE_FILE, {"format": STATE_FORMAT, "layout": "delta", "version": 1,
                                    "scd": scd, "tables": {},
                                    "applied_lsn": format_lsn(max(0, point - 1))})  # fmt: skip
    captures = [str(sync.capture_dir)] if (sync.capture_dir / "state.json").exists() else []
    patterns = [glob.escape(n) for n in names]  # (apply's tables are fnmatch patterns)
    apply_changes(sync.spark, captures, str(stage), scd=scd, snapshot=str(target),
                  tables=patterns)  # fmt: skip
    staged = json.loads((stage / STATE_FILE).read_text()).get("tables") or {}
    doc = sync.applied_doc()
    if doc is None:  # (nothing applied yet: the first cycle writes the rest)
        doc = {"format": STATE_FORMAT, "layout": "delta", "version": 1, "scd": scd,
               "applied_lsn": None, "tables": {}}  # fmt: skip
    doc["tables"] = dict(doc.get("tables") or {})
    run = f"pgcdc-load-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    report = {}
    for name in names:
        if name not in staged:
            continue
        uri, from_ = str(sync.out / name), str(stage / name)
        position = delta.position(from_)
        meta = {"pgcdc.run": run, "pgcdc.table": name, "pgcdc.commit_lsn":
                format_lsn(position or point), "pgcdc.snapshot.server": format_lsn(point)}  # fmt: skip
        version = delta.replace_with_table(uri, from_, app_version=position or point,
                                           metadata=meta)  # fmt: skip
        report[name] = sum(r or 0 for _p, _s, r in delta.current_files(uri))
        doc["tables"][name] = {**staged[name], "version": version, "rows": report[name]}
    write_json(sync.out / STATE_FILE, doc)
    (target / LOADED).write_text("")
    shutil.rmtree(stage, ignore_errors=True)
    took = time.monotonic() - t0
    sync.log.event("info", "table_added_done", f"{', '.join(names)}: snapshot of "
                   f"{sum(rows.values()):,} rows at {format_lsn(point)} loaded with the "
                   f"changes after it in {took:.1f}s", tables=report,
                   consistent_point=format_lsn(point), took_s=round(took, 2))  # fmt: skip


class Mark(NamedTuple):
    """A loaded table's last snapshot, as :func:`check` compares the table with it: how many
    lines the capture's relations.jsonl had when it was taken, the table's OID then (None
    in snapshots written before 2026-11-28), and its publication memberships and partitions
    then (:func:`pgcdc.snapshot.server.table_memberships`; None before 2026-11-29); the columns
    its Delta table holds (:class:`pgcdc.sync.drift.Col`) and its storage then
    (:func:`pgcdc.snapshot.server.table_shapes`; None before 2026-12-03), and the snapshot's
    consistent point. A look of :mod:`pgcdc.sync.drift` since (``DIR/_columns.json``)
    moves ``lines``, ``columns`` and ``storage`` on."""

    lines: int
    oid: int | None
    members: tuple | None = None
    columns: tuple | None = None
    storage: tuple | None = None
    point: str | None = None


def snapshot_marks(sync) -> dict[str, Mark]:
    """{table: its :class:`Mark`} for the tables a snapshot of this directory holds and apply
    has loaded: the initial snapshot's (no line before it: the capture starts at its point),
    and those of the snapshots of tables added later (``_snapshot_added/``) whose load
    finished. A relations.jsonl line past a table's mark is of a change of its columns after
    its last snapshot, or (its Relation message comes with the table's next change) shortly
    before it."""
    marks: dict[str, Mark] = {}
    try:  # (no initial snapshot yet: none)
        doc = json.loads((sync.snapshot_dir / "_snapshot.json").read_text())
        marks = {n: _mark(doc, n, 0) for n in doc["tables"]}
    except (OSError, ValueError, KeyError):
        pass
    added = sync.out / ADDED
    for d in sorted(added.iterdir()) if added.is_dir() else ():  # (oldest first)
        if (d / LOADED).exists():
            doc = json.loads((d / "_snapshot.json").read_text())
            lines = int(doc.get("relations_lines", 0))
            for name in doc["tables"]:
                had = marks.get(name, Mark(0, None))
                marks[name] = _mark(doc, name, max(had.lines, lines))
    for name, rec in columns.records(sync.out).items():  # the looks since the snapshot
        m = marks.get(name)
        if m is not None and (rec.get("point"), rec.get("oid")) == (m.point, m.oid):
            marks[name] = m._replace(lines=max(m.lines, rec["lines"]),
                                     columns=columns.cols(rec["columns"]),
                                     storage=tuple(rec["storage"]))  # fmt: skip
    return marks


def _mark(doc: dict, name: str, lines: int) -> Mark:
    """Table ``name``'s :class:`Mark` in a snapshot's ``_snapshot.json`` ``doc``."""
    shape = (doc.get("shapes") or {}).get(name) or {}
    storage = shape.get("storage")
    members = _tokens((doc.get("members") or {}).get(name))
    return Mark(lines, (doc.get("oids") or {}).get(name), members,
                columns.cols(shape.get("columns")), None if storage is None else tuple(storage),
                doc.get("consistent_point"))  # fmt: skip


def _tokens(members) -> tuple | None:
    return None if members is None else tuple(members)


def unfollowable(sync, marks: dict[str, Mark]) -> dict[str, str]:
    """{table: what changed} for the loaded tables that changed after their last snapshot in
    a way no change carries to the rows not changed since: the table dropped and another
    created under its name (a new OID: the old rows are gone with no change that says so;
    here for snapshots that recorded no OID, :func:`replaced` for the others), a column renamed
    (pgoutput sends names only: it reads as dropped and another added; see
    :func:`pgcdc.capture.catalog.renamed_columns`), or retyped other than wider or narrower
    within its kind (:func:`pgcdc.spark.types.widens`; the server rewrote its values). Read
    from the capture's ``relations.jsonl`` (each table's Relation messages, as they changed),
    past ``marks`` (:func:`snapshot_marks`)."""
    last: dict[int, dict] = {}
    oid_of: dict[str, int] = {}  # table name -> the OID of its last line
    found: dict[str, str] = {}
    past: set[str] = set()  # tables whose first line past their mark was seen
    for i, line in enumerate(read_catalog_lines(sync.capture_dir, name=RELATIONS_FILE)):
        doc = line["relation"]
        before, last[doc["oid"]] = last.get(doc["oid"]), doc
        name = table_key(doc["namespace"], doc["name"])
        was, oid_of[name] = oid_of.get(name), doc["oid"]
        if name not in marks or i < marks[name].lines:
            continue
        # a snapshot that recorded its OIDs is compared by replaced(); one from before
        # 2026-11-28 only here, against the name's earlier line
        if marks[name].oid is None and was not in (None, doc["oid"]):
            found[name] = _replaced_text(was, doc["oid"])
            continue
        if name not in past:  # the columns its Delta table held then, where recorded
            past.add(name)
            if marks[name].columns is not None:
                before = {"columns": [[0, *c[1:]] for c in marks[name].columns]}
        if before is None:
            continue
        pairs = renamed_columns(before["columns"], doc["columns"])
        if pairs:
            found[name] = ", ".join(f"column {a} renamed to {b}" for a, b in pairs)
            continue
        had = {c[1]: pg_arrow_type(c[2], c[3]) for c in before["columns"]}
        for c in doc["columns"]:
            old, now = had.get(c[1]), pg_arrow_type(c[2], c[3])
            # wider, or narrower within its kind (the server checked that every value fits;
            # not a numeric's scale reduced, which it rounds): the values are the same; any
            # other change rewrote them
            if old is None or widens(old, now):
                continue
            if not widens(now, old) or columns.rounds(old, now):
                found[name] = f"column {c[1]} retyped"
    return found


def _rows_of(tokens) -> set:
    """The publication catalog rows among a table's recorded tokens (not its partitions)."""
    return {x for x in tokens or () if not x.startswith("leaf ")}


def _leaves_of(tokens) -> set:
    return {x for x in tokens or () if x.startswith("leaf ")}


def replaced(published, marks: dict[str, Mark]) -> dict[str, str]:
    """{table: what changed} for the published tables whose OID is not the one their last
    snapshot recorded: dropped and created again (or another table renamed to the name)."""
    return {t.qualified_name: _replaced_text(marks[t.qualified_name].oid, t.oid)
            for t in published if t.qualified_name in marks
            and marks[t.qualified_name].oid not in (None, t.oid)}  # fmt: skip


def _replaced_text(was: int, now: int) -> str:
    return f"the table was dropped and another created under its name (OID {was}, now {now})"


def _snapshot_conn(sync):
    import psycopg

    return psycopg.connect(sync.config.dsn, autocommit=True, application_name="pgcdc sync")
