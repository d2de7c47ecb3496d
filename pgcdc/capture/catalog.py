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

A binary slot sends a reg* value (regclass, regtype, ...) as its OID, where a text slot
sends the name. So for a binary slot the recorder also watches the changes of relations with
reg* columns, collects the OIDs it has not named yet, and before the next durable point asks
the server their names (as the text slot would print them) into a ``reg`` line.

Each line: ``{"lsn": "X/Y", "relation": OID, "types": [entry...], "missing": {column: text}}``
where an entry is ``{"oid", "kind", "namespace", "name", ...}`` (see :func:`describe_types`),
or ``{"lsn": "X/Y", "reg": {"<reg type OID>": {"<OID>": name}}}``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pgoutput_codec as pgc

from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.values import Catalog
from pgcdc.values._catalog import FIRST_NORMAL_OID, describe_types, is_builtin
from pgcdc.values._catalog import REG_ARRAY_ELEMENTS as REG_ARRAYS
from pgcdc.values._catalog import REG_TYPE_NAMES as REG_TYPES
from pgcdc.capture.walsender import CaptureError

__all__ = ["FIRST_NORMAL_OID", "describe_types", "is_builtin"]  # the server's side of it

CATALOG_FILE = "catalog.jsonl"
# each Relation message whose description changed, so that a reader whose first segments are
# gone (pruned, archived) still knows the relations of the changes it reads. Its "lsn" is the
# last transaction boundary before the message (a segment starts at one): pgoutput's
# walsender sends a Relation message at LSN 0, and directories written before 2026-11-28
# hold that 0, which read as "before" any segment
RELATIONS_FILE = "relations.jsonl"

# reg* types (and their arrays): a binary slot sends the OID, a text slot the name
_I32 = struct.Struct("!i")

_MISSING_SQL = """
SELECT a.attname::text, (a.attmissingval::text::text[])[1]
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing
ORDER BY a.attnum
"""


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
        self.relations_path = Path(directory) / RELATIONS_FILE
        self.relations = {
            line["relation"]["oid"]: line["relation"]
            for line in read_catalog_lines(directory, name=RELATIONS_FILE)
        }
        self.fsync = fsync
        # (lsn, relation doc, [(old name, new name)]) when a Relation message looks like
        # columns renamed (renamed_columns): the capture warns, as nothing else can
        self.on_renamed = None
        self._connect = connect
        self._conn = None
        self.known: dict[int, dict] = {}  # what the file holds already (latest entry per OID)
        self.missing: dict[int, dict] = {}
        self.entries = 0  # lines written by this recorder
        # reg* names: what the file holds, what the stream showed since, which columns
        self.reg_names: dict[int, dict[int, str]] = {}
        self.reg_pending: dict[int, set[int]] = {}
        self.reg_first_lsn: int | None = None
        self.reg_columns: dict[int, tuple[tuple[int, int, bool], ...]] = {}
        for line in read_catalog_lines(directory):
            for typ, names in line.get("reg", {}).items():
                self.reg_names.setdefault(int(typ), {}).update(
                    {int(o): n for o, n in names.items()}
                )
            for t in line.get("types", ()):
                self.known[t["oid"]] = t
            if line.get("missing"):
                self.missing[line["relation"]] = line["missing"]

    def _execute(self, sql: str, params):
        import psycopg

        try:
            if self._conn is None:
                if self._connect is not None:
                    self._conn = self._connect()
                else:
                    self._conn = psycopg.connect(
                        self.dsn, autocommit=True, application_name="pgcdc catalog"
                    )
            return self._conn.execute(sql, params).fetchall()
        except psycopg.Error as e:
            # the capture reconnects (and the server sends the Relation message again)
            self.close()
            text = " ".join(str(e).split())
            raise CaptureError(f"catalog query on the side connection: {text}",
                               transient=True) from None  # fmt: skip

    def on_relation_payload(self, lsn: int, payload: bytes, in_stream: bool, options) -> None:
        """A Relation message's payload as the stream sent it (``options``: the slot's
        PluginOptions, for the codec's gates)."""
        msg = pgc.decode(
            payload,
            protocol_version=options.protocol_version,
            streaming=options.streaming,
            in_stream=in_stream,
        )
        type_oids = [c.type_oid for c in msg.columns]
        self.on_relation(lsn, msg.relation_oid, type_oids)
        self._record_relation(lsn, msg)
        if options.binary:
            regs = tuple(
                (i, REG_ARRAYS.get(t, t), t in REG_ARRAYS)
                for i, t in enumerate(type_oids)
                if t in REG_TYPES or t in REG_ARRAYS
            )
            if regs:
                self.reg_columns[msg.relation_oid] = regs
            else:
                self.reg_columns.pop(msg.relation_oid, None)

    def on_change_payload(self, lsn: int, payload: bytes, in_stream: bool, options) -> None:
        """An Insert/Update/Delete of a binary slot: note the reg* OIDs not named yet."""
        msg = pgc.decode(
            payload,
            protocol_version=options.protocol_version,
            streaming=options.streaming,
            in_stream=in_stream,
        )
        regs = self.reg_columns.get(msg.relation_oid)
        if not regs:
            return
        for tup in (getattr(msg, n, None) for n in ("new_tuple", "old_tuple", "key_tuple")):
            if tup is None:
                continue
            cols = tup.columns
            for i, typ, is_array in regs:
                if i >= len(cols) or cols[i].kind != "b":
                    continue
                data = cols[i].value
                found = _array_oids(data) if is_array else [int.from_bytes(data, "big")]
                known = self.reg_names.get(typ, {})
                new = {o for o in found if o not in known}
                if new:
                    self.reg_pending.setdefault(typ, set()).update(new)
                    if self.reg_first_lsn is None:
                        self.reg_first_lsn = lsn

    def _record_relation(self, lsn: int, msg) -> None:
        doc = {
            "oid": msg.relation_oid,
            "namespace": msg.namespace,
            "name": msg.relation_name,
            "replica_identity": msg.replica_identity,
            "columns": [[c.flags, c.name, c.type_oid, c.type_modifier] for c in msg.columns],
        }
        before = self.relations.get(msg.relation_oid)
        if before == doc:
            return
        self.relations[msg.relation_oid] = doc
        self._append({"lsn": format_lsn(lsn), "relation": doc}, self.relations_path)
        if before is not None and self.on_renamed is not None:
            pairs = renamed_columns(before["columns"], doc["columns"])
            if pairs:
                self.on_renamed(lsn, doc, pairs)

    @property
    def watching(self) -> bool:
        """Whether changes must be shown to :meth:`on_change_payload` (reg* columns)."""
        return bool(self.reg_columns)

    def flush(self) -> None:
        """Name the reg* OIDs seen since the last call (before the data is made durable)."""
        if not self.reg_pending:
            return
        reg = {}
        for typ, oids in sorted(self.reg_pending.items()):
            rows = self._execute(
                f"SELECT x::int8, x::{REG_TYPES[typ]}::text FROM unnest(%s::oid[]) x",
                [sorted(oids)],
            )
            names = {int(o): n for o, n in rows}
            self.reg_names.setdefault(typ, {}).update(names)
            reg[str(typ)] = {str(o): n for o, n in sorted(names.items())}
        self._append({"lsn": format_lsn(self.reg_first_lsn or 0), "reg": reg})
        self.reg_pending.clear()
        self.reg_first_lsn = None

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
        self._append(line)

    def _append(self, line: dict, path: Path | None = None) -> None:
        with open(path or self.path, "a", encoding="utf-8") as f:
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


def renamed_columns(before: list, after: list) -> list[tuple[str, str]]:
    """The columns a table's new Relation message seems to have renamed: each
    ``[flags, name, type OID, typmod]`` of ``after`` whose name differs from the column at
    its place in ``before``, same type, neither name in the other version. pgoutput sends
    names only, so a rename reads as a column dropped and another added: the rows not
    changed since would hold null in it. (A column dropped and another of its type added
    last in one statement looks the same: the warning says so.) [] when the columns moved
    otherwise (dropped, added, retyped)."""
    if len(before) != len(after):
        return []
    old_names = {c[1] for c in before}
    new_names = {c[1] for c in after}
    pairs = []
    for old, new in zip(before, after):
        if old[1] == new[1]:
            continue
        if old[2] != new[2] or old[1] in new_names or new[1] in old_names:
            return []
        pairs.append((old[1], new[1]))
    return pairs


def _array_oids(data) -> list[int]:
    """The element OIDs of a binary oid-like array (array_send: header, then each element's
    length and bytes; a length of -1 is NULL)."""
    ndim = _I32.unpack_from(data, 0)[0]
    count = 1 if ndim else 0
    for d in range(ndim):
        count *= _I32.unpack_from(data, 12 + 8 * d)[0]
    pos, out = 12 + 8 * ndim, []
    for _ in range(count):
        n = _I32.unpack_from(data, pos)[0]
        pos += 4
        if n >= 0:
            out.append(int.from_bytes(data[pos : pos + n], "big"))
            pos += n
    return out


def read_catalog_lines(directory, until_lsn: int | None = None, name=CATALOG_FILE) -> list[dict]:
    """The lines of a capture directory's catalog.jsonl (or ``name``; none if it has none),
    those that apply from at most ``until_lsn`` when given. A last line cut short (a crash
    while it was written, before the data it describes was durable) is ignored."""
    path = Path(directory) / name
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
        # not in LSN order: a reg line is keyed by the first change that needed it and
        # written at the next durable point, after lines of Relation messages read since
        if until_lsn is not None and parse_lsn(line["lsn"]) > until_lsn:
            continue
        out.append(line)
    return out


def load_catalog(directories, until: dict | None = None):
    """A :class:`pgcdc.values.Catalog` of the types the catalog.jsonl files of
    ``directories`` describe (a directory's lines up to ``until[directory]``, its durable LSN,
    when given), or None when none has any: a stream of built-in types only."""
    lines = []
    for d in dict.fromkeys(str(Path(x)) for x in directories):
        lines += read_catalog_lines(d, (until or {}).get(d))
    if not lines:
        return None
    cat = Catalog()
    for line in sorted(lines, key=lambda ln: parse_lsn(ln["lsn"])):
        cat.add_entries(line.get("types", ()))
        for typ, names in line.get("reg", {}).items():
            cat.reg_names.setdefault(int(typ), {}).update({int(o): n for o, n in names.items()})
        if line.get("missing"):
            cat.missing[line["relation"]] = line["missing"]
    return cat


def relations_before(directory, lsn: int) -> list:
    """The Relation messages (pgoutput_codec.Relation) a capture directory recorded before
    ``lsn``, the latest of each relation: what a reader starting at ``lsn`` must know."""
    latest = {}
    for line in read_catalog_lines(directory, name=RELATIONS_FILE):
        if parse_lsn(line["lsn"]) >= lsn:
            continue  # (in order, but a crash's undurable tail may have gone past)
        latest[line["relation"]["oid"]] = line["relation"]
    return [
        pgc.Relation(
            relation_oid=r["oid"],
            namespace=r["namespace"],
            relation_name=r["name"],
            replica_identity=r["replica_identity"],
            columns=tuple(
                pgc.RelationColumn(flags=f, name=n, type_oid=t, type_modifier=m)
                for f, n, t, m in r["columns"]
            ),
        )
        for r in latest.values()
    ]
