"""What the stream leaves out, recorded beside a capture: the catalog of the types its Relation
messages name that are not built in, and the values of columns added with a DEFAULT.

pgoutput sends a type's OID (and, for a type that is not built in, a Type message with its
name), never what the type is. A binary value of an enum, a composite or an array of them is
unreadable without that; a composite's text does not say its attributes' names. So when
``pgcdc capture`` reads a Relation message, it asks the server, on a side connection, what each
type that is not built in is (kind, enum labels in order, composite attribute names and types,
domain base type, range subtype; the types those name, recursively), and which of the
relation's columns have an ``attmissingval`` (a column added with a non-volatile DEFAULT: rows
written before hold that value without it being in the table or in any change). It appends one
JSON line to ``catalog.jsonl`` and fsyncs it before the Relation message's segment is made
durable, so the catalog is always durable with the data it describes. A stream of built-in
types without such columns writes nothing.

Why a side connection: while it streams, the walsender connection is in COPY BOTH mode and
cannot run SQL; stopping the stream to ask would stall it for every Relation message. The
side connection is opened on the first Relation message that needs it and reused. What it
sees is the catalog at that moment, which is what the Relation message describes unless the
type changed again in between (an enum label added later is recorded at the next Relation
message; a binary enum value is its label's text, so such a value reads right regardless).

Each line: ``{"lsn": "X/Y", "relation": OID, "types": [entry...], "missing": {column: text}}``
where an entry is ``{"oid", "kind", "namespace", "name", ...}`` (see :func:`describe_types`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..lsn import format_lsn, parse_lsn

CATALOG_FILE = "catalog.jsonl"
FIRST_NORMAL_OID = 16384  # types made by initdb have smaller OIDs; everything else is described

_KINDS = {"e": "enum", "d": "domain", "c": "composite", "r": "range", "m": "multirange"}

_TYPES_SQL = """
SELECT t.oid::int8, t.typtype::text, n.nspname::text, t.typname::text, t.typcategory::text,
       t.typelem::int8, t.typarray::int8, t.typbasetype::int8,
       (SELECT r.rngsubtype::int8 FROM pg_range r WHERE r.rngtypid = t.oid),
       (SELECT r.rngtypid::int8 FROM pg_range r WHERE r.rngmultitypid = t.oid),
       CASE WHEN t.typtype = 'e' THEN ARRAY(SELECT e.enumlabel::text FROM pg_enum e
            WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) END,
       CASE WHEN t.typtype = 'c' THEN ARRAY(SELECT a.attname::text FROM pg_attribute a
            WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum) END,
       CASE WHEN t.typtype = 'c' THEN ARRAY(SELECT a.atttypid::int8 FROM pg_attribute a
            WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum) END
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE t.oid = ANY(%s)
"""

_MISSING_SQL = """
SELECT a.attname::text, (a.attmissingval::text::text[])[1]
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing
ORDER BY a.attnum
"""


def is_builtin(oid: int) -> bool:
    return 0 < oid < FIRST_NORMAL_OID


def describe_types(execute, oids) -> dict[int, dict]:
    """OID -> entry for ``oids`` and every type they name that is not built in. ``execute(sql,
    params)`` returns rows. An entry has ``oid``, ``kind`` (enum, domain, composite, range,
    multirange, array, or base: an extension's type, known by name only), ``namespace``,
    ``name``, and as its kind needs: ``labels``; ``fields`` ([name, type OID]...);
    ``base_oid``; ``subtype_oid``; ``range_oid``; ``element_oid``; and ``array_oid``."""
    out: dict[int, dict] = {}
    todo = sorted({o for o in oids if not is_builtin(o)})
    while todo:
        rows = execute(_TYPES_SQL, [todo])
        todo = []
        for (oid, typtype, nsp, name, category, elem, arr, base, sub, rng, labels, names,
             types) in rows:  # fmt: skip
            if category == "A" and elem:
                entry = {"kind": "array", "element_oid": elem}
            elif typtype in _KINDS:
                entry = {"kind": _KINDS[typtype]}
            else:
                entry = {"kind": "base"}
            entry.update(oid=oid, namespace=nsp, name=name)
            if arr:
                entry["array_oid"] = arr
            kind = entry["kind"]
            refs = []
            if kind == "enum":
                entry["labels"] = list(labels or [])
            elif kind == "composite":
                entry["fields"] = [[n, t] for n, t in zip(names or [], types or [])]
                refs += list(types or [])
            elif kind == "domain":
                entry["base_oid"] = base
                refs.append(base)
            elif kind == "range":
                entry["subtype_oid"] = sub
                refs.append(sub)
            elif kind == "multirange":
                entry["range_oid"] = rng
                refs.append(rng)
            elif kind == "array":
                refs.append(elem)
            out[oid] = entry
            todo += [r for r in refs if r and not is_builtin(r) and r not in out]
        todo = sorted(set(todo) - set(out))
    return out


def missing_values(execute, relation_oid: int) -> dict[str, str | None]:
    """Column -> the text of its attmissingval (None: a NULL default), for columns added with
    a non-volatile DEFAULT after rows existed."""
    return dict(execute(_MISSING_SQL, [relation_oid]))


class CatalogRecorder:
    """Appends the catalog entries a capture needs to ``DIR/catalog.jsonl`` (see the module
    doc), asking the server on a side connection made from ``dsn``."""

    def __init__(self, dsn: str, directory, *, fsync: bool = True, connect=None):
        self.dsn = dsn
        self.path = Path(directory) / CATALOG_FILE
        self.fsync = fsync
        self._connect = connect
        self._conn = None
        self.known: dict[int, dict] = {}  # what the file holds already (latest entry per OID)
        self.missing: dict[int, dict] = {}
        self.entries = 0  # lines written by this recorder
        for line in read_catalog_lines(directory):
            for t in line.get("types", ()):
                self.known[t["oid"]] = t
            if line.get("missing"):
                self.missing[line["relation"]] = line["missing"]

    def _execute(self, sql: str, params):
        if self._conn is None:
            if self._connect is not None:
                self._conn = self._connect()
            else:
                import psycopg

                self._conn = psycopg.connect(
                    self.dsn, autocommit=True, application_name="pgcdc catalog"
                )
        return self._conn.execute(sql, params).fetchall()

    def on_relation(self, lsn: int, relation_oid: int, type_oids) -> None:
        """A Relation message at ``lsn``: record what is new about its types and columns."""
        wanted = [o for o in type_oids if not is_builtin(o)]
        types = describe_types(self._execute, wanted) if wanted else {}
        changed = [t for oid, t in sorted(types.items()) if self.known.get(oid) != t]
        missing = missing_values(self._execute, relation_oid)
        if missing == self.missing.get(relation_oid, {}):
            missing = None
        if not changed and missing is None:
            return
        line = {"lsn": format_lsn(lsn), "relation": relation_oid, "types": changed}
        if missing is not None:
            line["missing"] = missing
            self.missing[relation_oid] = missing
        for t in changed:
            self.known[t["oid"]] = t
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, sort_keys=True) + "\n")
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self.entries += 1

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def read_catalog_lines(directory, until_lsn: int | None = None) -> list[dict]:
    """The lines of a capture directory's catalog.jsonl (none if it has none), those that
    apply from at most ``until_lsn`` when given. A last line cut short (a crash while it was
    written, before the data it describes was durable) is ignored."""
    path = Path(directory) / CATALOG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            break
        if until_lsn is not None and parse_lsn(line["lsn"]) > until_lsn:
            break
        out.append(line)
    return out


def load_catalog(directories, until: dict | None = None):
    """A :class:`pgcdc.values.Catalog` of the types the catalog.jsonl files of
    ``directories`` describe (a directory's lines up to ``until[directory]``, its durable LSN,
    when given), or None when none has any: a stream of built-in types only."""
    from ..values import Catalog

    lines = []
    for d in dict.fromkeys(str(Path(x)) for x in directories):
        lines += read_catalog_lines(d, (until or {}).get(d))
    if not lines:
        return None
    cat = Catalog()
    for line in sorted(lines, key=lambda ln: parse_lsn(ln["lsn"])):
        cat.add_entries(line.get("types", ()))
        if line.get("missing"):
            cat.missing[line["relation"]] = line["missing"]
    return cat
