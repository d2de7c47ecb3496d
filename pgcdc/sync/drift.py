"""``pgcdc sync``: a table's columns changed with no change of the table since.

pgoutput sends a table's Relation message (its columns) only before the table's next change:
after ``ALTER TABLE t ADD COLUMN c text DEFAULT 'd'`` and no write to ``t``, every row of the
server's holds ``d`` and the Delta table had no ``c``. So at each check (every
``--tables-check``, :func:`pgcdc.sync.added.check`) :func:`look` compares each loaded table's
published columns, with their numbers (``attnum``: a rename keeps it, a column added takes a
new one; :func:`pgcdc.snapshot.server.table_shapes`), with the columns its Delta table holds
(:func:`lake_columns`: the table's last Relation message in the capture's relations.jsonl
after its last snapshot, else the columns that snapshot recorded, or a change made here).

A table that differs is noted with the server's WAL position then. Once the tables are applied
that far (every change of the table before the ``ALTER TABLE`` is in its Delta table: the
ALTER waited for the transactions that wrote it) and its columns are still those,
:func:`settle` does the cheapest thing that makes the table right (:func:`plan`):

- a column added with a constant DEFAULT (its ``attmissingval``) or with none (null: the
  table was not rewritten since), dropped, or widened (:func:`pgcdc.spark.types.widens`): the
  Delta table is rewritten with it in one commit (:func:`pgcdc.apply.reshape.reshape`), as
  apply would at the table's next change; with ``--scd 2`` as well;
- narrowed within its kind, or retyped to a type of the same Arrow type: the values stand,
  nothing is written;
- renamed, retyped otherwise, added with a value per row (a volatile DEFAULT, an identity:
  the table rewritten since), or a key column dropped: the table's snapshot is taken again
  (:func:`pgcdc.sync.added.take`, then ``load``: one commit, the other tables go on); with
  ``--scd 2`` that would replace its history, so sync says so once (``columns_changed``) and
  leaves the table as it is until its next change.

What was done, and each look that found a table as its Delta table holds it, is recorded in
``DIR/_columns.json`` ({table: its columns, storage, the relations.jsonl lines then, and the
snapshot it follows}); :func:`pgcdc.sync.added.snapshot_marks` reads it, so the table's next
Relation message, with the same columns, is no change of its columns (no second snapshot). A
table with generated columns is left to the stream (pgoutput sends them from PostgreSQL 18
only, when published).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import NamedTuple

from pgcdc.apply import delta
from pgcdc.apply.delta import redact
from pgcdc.apply.reshape import reshape
from pgcdc.apply.state import STATE_FILE
from pgcdc.capture.catalog import RELATIONS_FILE, load_catalog, read_catalog_lines, renamed_columns
from pgcdc.durable import write_json
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.snapshot.server import (
    catalog_docs,
    describe_published_table,
    table_shapes,
    table_storage,
)
from pgcdc.spark.later import resolve
from pgcdc.spark.types import pg_arrow_type, widens
from pgcdc.spark.units import TableSchema
from pgcdc.tablekey import table_key
from pgcdc.values import Catalog

__all__ = [
    "COLUMNS", "Col", "Drift", "Plan", "lake_columns", "look", "plan", "records", "rounds",
    "settle",
]  # fmt: skip

COLUMNS = "_columns.json"  # {table: {oid, point, lines, columns, storage}}: see the docstring
VARIES = object()  # a column's attmissingval differs among the partitions


class Col(NamedTuple):
    """A column as the comparison sees it: its number (None where a Relation message is the
    source: it has none), name, type OID and typmod."""

    attnum: int | None
    name: str
    type_oid: int
    typmod: int


def cols(doc) -> tuple[Col, ...] | None:
    """Columns recorded as ``[attnum, name, type OID, typmod]`` lists (None: none)."""
    return None if doc is None else tuple(Col(*c) for c in doc)


def _same(a, b) -> bool:
    """Whether two versions of a table's columns are the same names and types, in order."""
    return [c[1:] for c in a] == [c[1:] for c in b]


@dataclass
class Drift:
    """A table whose published columns (``server``, listed as ``table``) are not its Delta
    table's, seen when the server's WAL was at ``wal``; ``held``: said, left as it is."""

    table: object  # pgcdc.snapshot.server.PublishedTable
    server: tuple
    wal: int
    held: bool = False


class Plan(NamedTuple):
    """What :func:`settle` does: ``action`` ``"reshape"`` (the Delta table rewritten with the
    new columns), ``"record"`` (its values stand as they are) or ``"snapshot"``; ``what``
    says why, as the log line does."""

    action: str
    what: str


def plan(lake, server, missing: dict, rewritten: bool | None, keys=()) -> Plan:
    """How to bring a Delta table holding columns ``lake`` to the server's ``server`` (both
    :class:`Col` tuples in the table's order), no change of the table having come between.
    ``missing``: {column: the text of its attmissingval, or :data:`VARIES`} for the columns
    that have one; ``rewritten``: whether the table's storage changed since ``lake`` was
    recorded (None: not known); ``keys``: the key apply merges the table by.

    Columns are matched by number where ``lake`` has them (a rename is then told apart from a
    column dropped and another added), else by name, and a column dropped while another is
    added may be a rename: the snapshot is taken."""
    done, redo = [], []
    numbered = all(c.attnum is not None for c in lake)
    if numbered:
        old, new = {c.attnum: c for c in lake}, {c.attnum: c for c in server}
        redo += [f"column {c.name} renamed to {new[n].name}"
                 for n, c in old.items() if n in new and new[n].name != c.name]  # fmt: skip
        pairs = [(c, new[n]) for n, c in old.items() if n in new and new[n].name == c.name]
    else:
        old, new = {c.name: c for c in lake}, {c.name: c for c in server}
        pairs = [(old[c.name], c) for c in server if c.name in old]
    dropped = [c for k, c in old.items() if k not in new]
    added = [c for k, c in new.items() if k not in old]
    if dropped and added and not numbered:  # by name, a rename reads as a drop and an add
        as_lists = [[0, c.name, c.type_oid, c.typmod] for c in (*lake, *server)]
        renamed = renamed_columns(as_lists[: len(lake)], as_lists[len(lake) :])
        redo += [f"column {a} renamed to {b}" for a, b in renamed] or [
            f"column(s) {', '.join(c.name for c in dropped)} dropped and "
            f"{', '.join(c.name for c in added)} added (a rename reads so)"
        ]
    for c in dropped:
        if c.name in keys:
            redo.append(f"key column {c.name} dropped")
        else:
            done.append(f"column {c.name} dropped")
    for c in added:
        value = missing.get(c.name, None)
        if c.name in missing and value is not VARIES:
            text = "NULL" if value is None else repr(value)
            done.append(f"column {c.name} added with DEFAULT {text} (its attmissingval)")
        elif c.name not in missing and rewritten is False:
            done.append(f"column {c.name} added (null in every row)")
        elif value is VARIES:
            redo.append(f"column {c.name} added, its value differing among the partitions")
        else:
            why = "the table was rewritten" if rewritten else "the table may have been rewritten"
            redo.append(f"column {c.name} added with a value per row ({why})")
    reshape = bool(dropped or added)
    for a, b in pairs:
        if (a.type_oid, a.typmod) == (b.type_oid, b.typmod):
            continue
        had, now = pg_arrow_type(a.type_oid, a.typmod), pg_arrow_type(b.type_oid, b.typmod)
        if widens(now, had) and not rounds(had, now):
            # the same type here, or narrower within its kind (the server checked that every
            # value fits): the values stand, the column keeps its type, as apply keeps it
            done.append(f"column {b.name} retyped (its values stand)")
        elif widens(had, now):
            done.append(f"column {b.name} widened")
            reshape = True
        else:
            redo.append(f"column {b.name} retyped")
    if redo:
        return Plan("snapshot", "; ".join(redo))
    return Plan("reshape" if reshape else "record", ", ".join(done))


def rounds(had, now) -> bool:
    """Whether retyping a column of Arrow type ``had`` to ``now`` rounds its values: a
    numeric given fewer digits after the point (the server rounds rather than refuses)."""
    import pyarrow.types as pt

    return pt.is_decimal(had) and pt.is_decimal(now) and now.scale < had.scale


def records(out) -> dict:
    """``DIR/_columns.json`` ({} when there is none)."""
    try:
        return json.loads((out / COLUMNS).read_text())
    except (OSError, ValueError):
        return {}


def lake_columns(marks: dict, lines: list) -> dict[str, tuple]:
    """{table: (the columns its Delta table holds, or None when not known; whether a
    Relation message after its mark says so)}: its last Relation message in the capture's
    relations.jsonl ``lines`` past its mark (:func:`pgcdc.sync.added.snapshot_marks`), else
    the columns the mark recorded."""
    out = {n: (m.columns, False) for n, m in marks.items()}
    for i, line in enumerate(lines):
        doc = line["relation"]
        name = table_key(doc["namespace"], doc["name"])
        m = marks.get(name)
        if m is None or i < m.lines or m.oid not in (None, doc["oid"]):
            continue
        out[name] = (tuple(Col(None, c[1], c[2], c[3]) for c in doc["columns"]), True)
    return out


_WAL_SQL = ("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_insert_lsn() END)::text")  # fmt: skip


def look(sync, published, marks: dict, skip=()) -> dict[str, str]:
    """Compare the loaded tables of ``published`` (but ``skip``, those taken again already)
    with what their Delta tables hold; note those that differ in ``sync.drift`` (then
    :func:`settle`), and record those that do not as they are now (``DIR/_columns.json``).
    Returns {table: why} of those whose snapshot is to be taken again now: a change brought
    a column added with a value per row (:func:`_rewritten_since`)."""
    tables = [t for t in published if t.qualified_name in marks and t.qualified_name not in skip
              and t.qualified_name not in sync.warned_tables]  # fmt: skip
    if not tables:
        sync.drift.clear()
        return {}
    try:
        conn = sync.connection()
        shapes = table_shapes(conn, tables)
        wal = parse_lsn(conn.execute(_WAL_SQL).fetchone()[0])  # after: past each ALTER seen
    except Exception:  # the server away: the next check asks again
        sync.disconnect()
        return {}
    if shapes is None:
        return {}  # (a server before 12)
    lines = read_catalog_lines(sync.capture_dir, name=RELATIONS_FILE)
    lake = lake_columns(marks, lines)
    kept = records(sync.out)
    found, again = {}, {}
    for t in tables:
        name, shape = t.qualified_name, shapes.get(t.qualified_name)
        if shape is None or shape.get("generated"):
            continue  # (altered while listed: the next look) (generated: left to the stream)
        server = cols(shape["columns"])
        have, from_line = lake[name]
        m = marks[name]
        if have is not None and not _same(have, server):
            d = sync.drift.get(name)
            found[name] = d if d is not None and d.server == server else Drift(t, server, wal)
            continue
        why = _rewritten_since(sync, t, m, server, shape["storage"]) if from_line else None
        if why:
            again[name] = why
            continue
        # as its Delta table holds it (or, a snapshot that recorded no columns, taken to be)
        if from_line or m.columns is None or m.storage != tuple(shape["storage"]):
            kept[name] = _record(t, m, len(lines), server, shape["storage"])
    sync.drift.clear()
    sync.drift.update(found)
    if kept != records(sync.out):
        write_json(sync.out / COLUMNS, kept)
    return again


def _rewritten_since(sync, t, mark, server, storage) -> str | None:
    """Why the table's snapshot is to be taken again although a change brought its columns
    (None: it is not): a column added since ``mark`` (by number) with no attmissingval while
    the table was rewritten (``DEFAULT random()``, an identity): apply gave the rows not
    changed since null in it, the server's hold a value each. (A rewrite for another reason
    in the same interval, VACUUM FULL or a type change, takes the snapshot too.)"""
    if mark.columns is None or mark.storage is None or tuple(storage) == mark.storage:
        return None
    if any(c.attnum is None for c in mark.columns):
        return None
    had = {c.attnum for c in mark.columns}
    added = [c for c in server if c.attnum not in had]
    if not added:
        return None
    try:
        _now, missing = _attributes(sync.connection(), t.oid)
    except Exception:  # the server away: the next check asks again
        sync.disconnect()
        return None
    per_row = [c.name for c in added if missing.get(c.name, VARIES) is VARIES]
    if not per_row:
        return None
    return (f"column {', '.join(per_row)} added with a value per row (the table was rewritten) "
            "before a change of the table")  # fmt: skip


def _record(t, mark, lines: int, server, storage) -> dict:
    return {"oid": t.oid, "point": mark.point, "lines": lines,
            "columns": [list(c) for c in server], "storage": list(storage)}  # fmt: skip


_ATTRIBUTES_SQL = """
SELECT a.attrelid::int8, a.attnum::int, a.attname::text, a.atttypid::int8, a.atttypmod,
       a.atthasmissing, (a.attmissingval::text::text[])[1]
FROM pg_attribute a
WHERE a.attnum > 0 AND NOT a.attisdropped
  AND (a.attrelid = %(oid)s
       OR a.attrelid IN (SELECT p.relid FROM pg_partition_tree(%(oid)s::oid::regclass) p
                         WHERE p.isleaf AND p.relid <> %(oid)s::oid::regclass))
ORDER BY a.attrelid, a.attnum
"""


def _attributes(conn, oid: int) -> tuple[tuple, dict]:
    """(the table's columns now, as :class:`Col`; {column: its attmissingval, or VARIES} for
    those that have one: in the table's own row, or in its partitions' when it has any)."""
    rows = conn.execute(_ATTRIBUTES_SQL, {"oid": oid}).fetchall()
    own = tuple(Col(n, name, typ, mod) for rel, n, name, typ, mod, _h, _v in rows if rel == oid)
    held = [r for r in rows if r[0] != oid] or [r for r in rows if r[0] == oid]
    values: dict[str, set] = {}
    for _rel, _n, name, _t, _m, has, value in held:
        values.setdefault(name, set()).add((has, value))
    missing = {}
    for name, found in values.items():
        if len(found) > 1:
            missing[name] = VARIES
        elif next(iter(found))[0]:
            missing[name] = next(iter(found))[1]
    return own, missing


def settle(sync, marks_of) -> list[tuple]:
    """Act on the tables of ``sync.drift`` the tables are now applied far enough for (see the
    module docstring); ``marks_of()``: :func:`pgcdc.sync.added.snapshot_marks`. Returns
    [(table, why)] of those whose snapshot is to be taken again (SCD1), for the caller."""
    import psycopg

    drift = sync.drift
    covered = sync.last_covered
    due = [d for d in drift.values() if not d.held and covered >= d.wal]
    if not due or sync.adding is not None or sync.stopper.requested:
        return []
    marks = marks_of()
    lines = read_catalog_lines(sync.capture_dir, name=RELATIONS_FILE)
    lake = lake_columns(marks, lines)
    doc = sync.applied_doc() or {}
    again = []
    for d in due:
        name = d.table.qualified_name
        have = lake.get(name, (None, False))[0]
        if name not in marks or have is None or _same(have, d.server):
            del drift[name]  # a change of it brought its columns (or it was taken again)
            continue
        try:
            conn = sync.connection()
            fresh = describe_published_table(conn, sync.pubs, d.table)
            now, missing = _attributes(conn, d.table.oid)
            storage = (table_storage(conn, [d.table.oid]) or {}).get(d.table.oid)
        except Exception:  # the server away: the next check looks again
            sync.disconnect()
            return again
        if _published(fresh, now) != d.server:
            # altered again since (a column the stream may have brought already, which a
            # change made here from the look's columns would drop): the next look sees it
            del drift[name]
            continue
        mark = marks[name]
        rewritten = None if mark.storage is None or storage is None else (
            tuple(storage) != mark.storage)  # fmt: skip
        keys = ((doc.get("tables") or {}).get(name) or {}).get("keys") or ()
        p = plan(have, d.server, missing, rewritten, keys)
        if p.action != "snapshot":
            try:
                _follow(sync, conn, d, have, missing, p, mark, len(lines), storage)
                del drift[name]
                continue
            except psycopg.Error:  # the server away: the next call tries again
                sync.disconnect()
                return again
            except Exception as e:  # noqa: BLE001 - said, and the snapshot mends it
                if sync.stopper.requested:
                    raise
                reason = redact(str(e).strip().splitlines()[0] if str(e).strip() else repr(e))
                then = "; its snapshot is taken again instead" if sync.config.scd == 1 else ""
                sync.log.event("warning", "columns_followed", f"{name}: {p.what}, with no "
                               f"change of the table since: rewriting its Delta table in "
                               f"place failed ({reason}){then}", table=name, columns=p.what,
                               failed=reason)  # fmt: skip
        if sync.config.scd == 1:
            del drift[name]
            again.append((d.table, p.what))
        else:
            d.held = True
            _said_held(sync, name, p.what)
    return again


def _published(table, now) -> tuple | None:
    """The published columns of ``table`` (a :class:`pgcdc.snapshot.server.PublishedTable` listed
    now, or None: gone) numbered by ``now`` (:func:`_attributes`' columns), as a look's."""
    numbers = {c.name: c.attnum for c in now}
    if table is None or any(c.name not in numbers for c in table.columns):
        return None
    return tuple(Col(numbers[c.name], c.name, c.type_oid, c.type_modifier) for c in table.columns)


def _said_held(sync, name: str, what: str) -> None:
    if name in sync.columns_warned:
        return
    sync.columns_warned.add(name)
    sync.log.event("warning", "columns_changed", f"{name}: {what}, with no change of the table "
                   "since, which no change carries to its rows; with --scd 2 its snapshot is "
                   "not taken again (it would replace the history): "
                   f"{sync.out / name} keeps its columns until the table's next change",
                   table=name)  # fmt: skip


def _follow(sync, conn, d: Drift, have, missing: dict, p: Plan, mark, lines: int, storage):
    """Bring the table's Delta table to ``d.server`` in place (``p.action`` ``"reshape"``), or
    only record that it holds them (``"record"``); said either way."""
    name, t0 = d.table.qualified_name, time.monotonic()
    uri = str(sync.out / name)
    version = None
    if p.action == "reshape" and delta.is_delta_table(uri):
        ts = _schema(sync, conn, d, have, missing)
        position = delta.position(uri)
        meta = {"pgcdc.table": name, "pgcdc.columns": p.what}
        if position is not None:
            meta["pgcdc.commit_lsn"] = format_lsn(position)
        version = reshape(resolve(sync.spark), uri, ts, sync.config.scd, meta)
        doc = sync.applied_doc()
        if doc is not None and name in (doc.get("tables") or {}):
            rows = sum(r or 0 for _p, _s, r in delta.current_files(uri))
            doc["tables"][name] = {**doc["tables"][name], "version": version, "rows": rows,
                                   "columns": [c.name for c in d.server]}  # fmt: skip
            write_json(sync.out / STATE_FILE, doc)
    kept = records(sync.out)
    kept[name] = _record(d.table, mark, lines, d.server, storage or ())
    write_json(sync.out / COLUMNS, kept)
    took = time.monotonic() - t0
    text = f"{name}: {p.what}, with no change of the table since: its Delta table "
    if version is None:
        text += "holds it as it is"
    else:
        text += f"rewritten with it in one commit (version {version}) in {took:.1f}s"
    sync.log.event("info", "columns_followed", text, table=name, columns=p.what,
                   version=version, took_s=round(took, 2))  # fmt: skip


class _Relation(NamedTuple):  # what TableSchema.add reads of a Relation message
    columns_names: tuple
    type_oids: tuple
    typmods: tuple
    identity: str = "default"
    key_names: tuple = ()


def _schema(sync, conn, d: Drift, have, missing: dict):
    """The :class:`pgcdc.spark.units.TableSchema` apply would have at the table's next change:
    its columns as the Delta table holds them, then as the server has them, typed with
    apply's catalog (and the server's entries of types it lacks), the values of the columns
    added being their attmissingval."""
    doc = sync.applied_doc() or {}
    catalog = Catalog.from_doc(doc["catalog"]) if doc.get("catalog") else Catalog()
    catalog = catalog.merged(load_catalog([sync.capture_dir]))
    catalog.add_entries([e for e in catalog_docs(conn, [d.table]) if e["oid"] not in catalog.types])
    had = {c.name for c in have}
    catalog.missing[d.table.oid] = {n: v for n, v in missing.items()
                                    if n not in had and v is not VARIES}  # fmt: skip
    ts = TableSchema(d.table.schema, d.table.table, catalog=catalog)
    for version in (have, d.server):
        ts.add(_Relation(tuple(c.name for c in version), tuple(c.type_oid for c in version),
                         tuple(c.typmod for c in version)), d.table.oid)  # fmt: skip
    return ts
