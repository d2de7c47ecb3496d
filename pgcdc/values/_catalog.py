"""What a capture knows about types that are not built in: enums, domains, composites, ranges,
multiranges, extension base types and arrays of them (``pgcdc capture`` records it in the
capture directory's catalog.jsonl, see :mod:`pgcdc.capture.catalog`)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import pq
from psycopg.adapt import AdaptersMap, Loader
from psycopg.types import TypeInfo, array
from psycopg.types.composite import CompositeInfo, register_composite
from psycopg.types.multirange import MultirangeInfo, register_multirange
from psycopg.types.range import RangeInfo, register_range

from pgcdc.values._loaders import ADAPTERS, FAST_ADAPTERS, FLOAT4, float4_range_loader

TEXT, BINARY = pq.Format.TEXT, pq.Format.BINARY


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


REG_TYPE_NAMES = {24: "regproc", 2202: "regprocedure", 2203: "regoper", 2204: "regoperator",
              2205: "regclass", 2206: "regtype", 3734: "regconfig", 3769: "regdictionary",
              4089: "regnamespace", 4096: "regrole", 4191: "regcollation"}  # fmt: skip
REG_ARRAY_ELEMENTS = {1008: 24, 2207: 2202, 2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206,
              3735: 3734, 3770: 3769, 4090: 4089, 4097: 4096, 4192: 4191}  # fmt: skip  # reg*[] -> reg*
REG_TYPES = tuple(REG_TYPE_NAMES)  # reg* types: a binary slot sends the OID, a text slot the name


def _reg_loader(typ: int, names: dict[int, str]):
    class _RegName(Loader):
        format = BINARY

        def load(self, data):
            oid = int.from_bytes(data, "big")
            try:
                return names[oid]
            except KeyError:
                raise ValueError(
                    f"the capture's catalog has no name for {oid} (a reg* value of type OID "
                    f"{typ}): a binary slot sends the OID; capture with pgcdc capture, which "
                    "records the names, or read with lenient mode"
                ) from None

    return _RegName


class PgComposite(dict):
    """A composite value: attribute name -> value, in the type's order (``to_jsonb`` renders
    it as that object)."""

    __slots__ = ()


def _make_composite(values, info) -> PgComposite:
    return PgComposite(zip(info.field_names, values))


@dataclass(frozen=True)
class TypeEntry:
    """One type: ``kind`` is 'enum', 'domain', 'composite', 'range', 'multirange', 'array',
    'base' (an extension's type: its text from a text slot, unreadable in binary) or 'other'
    (known by name only, e.g. from a Type message); ``base_oid`` is a domain's base type,
    ``element_oid`` an array's element type, ``fields`` a composite's (name, type OID)
    attributes, ``subtype_oid`` a range's subtype, ``range_oid`` a multirange's range."""

    oid: int
    kind: str
    name: str = ""
    namespace: str = ""
    base_oid: int = 0
    element_oid: int = 0
    array_oid: int = 0
    fields: tuple[tuple[str, int], ...] = ()
    labels: tuple[str, ...] = ()
    subtype_oid: int = 0
    range_oid: int = 0

    @classmethod
    def from_json(cls, doc: dict) -> TypeEntry:
        """An entry of a capture's catalog.jsonl (see pgcdc.capture.catalog)."""
        return cls(
            oid=doc["oid"],
            kind=doc["kind"],
            name=doc.get("name", ""),
            namespace=doc.get("namespace", ""),
            base_oid=doc.get("base_oid") or 0,
            element_oid=doc.get("element_oid") or 0,
            array_oid=doc.get("array_oid") or 0,
            fields=tuple((n, t) for n, t in doc.get("fields", ())),
            labels=tuple(doc.get("labels", ())),
            subtype_oid=doc.get("subtype_oid") or 0,
            range_oid=doc.get("range_oid") or 0,
        )

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name


class Catalog:
    """Type OID -> how to load its values. Without an entry a type that is not built in loads
    as its text (a text value) or stays ``bytes`` (a binary value)."""

    def __init__(self) -> None:
        self.types: dict[int, TypeEntry] = {}
        # relation OID -> {column: the text of its attmissingval}: columns added with a
        # DEFAULT after rows existed (pgcdc.capture.catalog.missing_values)
        self.missing: dict[int, dict[str, str | None]] = {}
        # reg* type OID -> {object OID: name}: what a binary slot's reg* values name
        self.reg_names: dict[int, dict[int, str]] = {}
        self._adapters: tuple[AdaptersMap, AdaptersMap] | None = None

    def __getstate__(self):  # shipped to Spark executors: the adapter maps are rebuilt there
        return {"types": self.types, "missing": self.missing, "reg_names": self.reg_names}

    def __setstate__(self, state):
        self.types, self.missing = state["types"], state["missing"]
        self.reg_names = state.get("reg_names", {})
        self._adapters = None

    def add(self, entry: TypeEntry) -> None:
        self.types[entry.oid] = entry
        self._adapters = None

    def to_doc(self) -> dict:
        """This catalog as JSON (apply keeps it in its state, so that a later run over newer
        captures alone still types their values): :meth:`from_doc` reads it back."""
        types = []
        for e in self.types.values():
            doc = {k: v for k, v in vars(e).items() if v not in (0, "", ())}
            doc["oid"], doc["kind"] = e.oid, e.kind
            if e.fields:
                doc["fields"] = [list(f) for f in e.fields]
            if e.labels:
                doc["labels"] = list(e.labels)
            types.append(doc)
        return {
            "types": sorted(types, key=lambda d: d["oid"]),
            "missing": {str(r): dict(m) for r, m in sorted(self.missing.items())},
            "reg": {
                str(t): {str(o): n for o, n in sorted(names.items())}
                for t, names in sorted(self.reg_names.items())
                if names
            },
        }

    @classmethod
    def from_doc(cls, doc: dict) -> Catalog:
        cat = cls()
        for entry in doc.get("types", ()):
            cat.add(TypeEntry.from_json(entry))
        cat.missing = {int(r): dict(m) for r, m in doc.get("missing", {}).items()}
        for typ, names in doc.get("reg", {}).items():
            cat.reg_names[int(typ)] = {int(o): n for o, n in names.items()}
        return cat

    def merged(self, newer: Catalog | None) -> Catalog:
        """A new catalog with what this one knows, and what ``newer`` knows on top."""
        out = Catalog.from_doc(self.to_doc())
        if newer is not None:
            for entry in newer.types.values():
                out.add(entry)
            out.missing.update(newer.missing)
            for typ, names in newer.reg_names.items():
                out.reg_names.setdefault(typ, {}).update(names)
        return out

    def add_enum(self, oid: int, name: str = "", array_oid: int = 0) -> None:
        self.add(TypeEntry(oid, "enum", name))
        if array_oid:
            self.add(TypeEntry(array_oid, "array", f"_{name}", element_oid=oid))

    def add_domain(self, oid: int, base_oid: int, name: str = "", array_oid: int = 0) -> None:
        self.add(TypeEntry(oid, "domain", name, base_oid=base_oid))
        if array_oid:
            self.add(TypeEntry(array_oid, "array", f"_{name}", element_oid=oid))

    def ensure(self, oids) -> None:
        """Called with a relation's column types before they are loaded: a catalog that can
        ask a server (:class:`LiveCatalog`) learns the ones it lacks; this one knows what it
        was given."""

    def add_entries(self, docs) -> None:
        """Entries of a capture's catalog.jsonl lines; an array entry's element and a type's
        array both end up described."""
        for doc in docs:
            entry = TypeEntry.from_json(doc)
            self.add(entry)
            if entry.array_oid and entry.kind != "array" and entry.array_oid not in self.types:
                self.add(
                    TypeEntry(
                        entry.array_oid,
                        "array",
                        f"_{entry.name}",
                        entry.namespace,
                        element_oid=entry.oid,
                    )  # fmt: skip
                )

    def describes(self, oid: int) -> bool:
        """Whether values of ``oid`` load as a type (not left as their text or bytes)."""
        e = self.types.get(oid)
        if e is None:
            return False
        if e.kind == "array":
            return self.describes(e.element_oid) or e.element_oid < 16384
        if e.kind == "domain":
            return self.base_type(oid) < 16384 or self.describes(self.base_type(oid))
        return e.kind in ("enum", "composite", "range", "multirange")

    def add_type_message(self, msg) -> None:
        """Record a pgoutput Type message (it carries the name only: values stay text)."""
        if msg.type_oid not in self.types:
            self.add(TypeEntry(msg.type_oid, "other", msg.type_name, msg.namespace))

    @classmethod
    def from_connection(cls, conn) -> Catalog:
        """Every type of a database that is not built in, from the server (what
        ``pgcdc capture`` records, for all types rather than those a stream names)."""
        cat = cls()
        rows = conn.execute(
            "SELECT t.oid::int8 FROM pg_type t WHERE t.oid >= %s AND t.typtype <> 'p'",
            [FIRST_NORMAL_OID],
        ).fetchall()
        types = describe_types(lambda q, p: conn.execute(q, p).fetchall(), [r[0] for r in rows])
        cat.add_entries(types[o] for o in sorted(types))
        return cat

    @property
    def array_oids(self) -> frozenset[int]:
        return frozenset(o for o, e in self.types.items() if e.kind == "array")

    def base_type(self, oid: int) -> int:
        """The type whose loader a domain uses (domains over domains followed)."""
        seen = set()
        while (e := self.types.get(oid)) is not None and e.kind == "domain" and oid not in seen:
            seen.add(oid)
            oid = e.base_oid
        return oid

    @property
    def adapters(self) -> tuple[AdaptersMap, AdaptersMap]:
        """(careful, fast) adapter maps with this catalog's types; see build_adapters."""
        if self._adapters is None:
            self._adapters = (self._build(ADAPTERS), self._build(FAST_ADAPTERS))
        return self._adapters

    def _build(self, base_map: AdaptersMap) -> AdaptersMap:
        adapters = AdaptersMap(base_map)
        by_kind: dict[str, list[TypeEntry]] = {}
        for e in self.types.values():
            by_kind.setdefault(e.kind, []).append(e)
        for e in by_kind.get("enum", ()):
            for fmt in (TEXT, BINARY):  # enum_send sends the label's text
                adapters.register_loader(e.oid, base_map.get_loader(25, fmt))
        # psycopg looks a composite's field loaders and an array's element loader up when a
        # value is loaded, in this same map: the order of registration does not matter
        for e in by_kind.get("range", ()):
            subtype = self.base_type(e.subtype_oid)
            register_range(RangeInfo(e.name, e.oid, e.array_oid, subtype_oid=subtype), adapters)
            if subtype == FLOAT4:
                _float4_ranges(adapters, e.oid)
        for e in by_kind.get("multirange", ()):
            rng = self.types.get(e.range_oid)
            if rng is not None:
                subtype = self.base_type(rng.subtype_oid)
                info = MultirangeInfo(e.name, e.oid, e.array_oid, range_oid=rng.oid,
                                      subtype_oid=subtype)  # fmt: skip
                register_multirange(info, adapters)
                if subtype == FLOAT4:
                    _float4_ranges(adapters, e.oid)
        for e in by_kind.get("composite", ()):
            info = CompositeInfo(e.name, e.oid, e.array_oid, field_names=[n for n, _ in e.fields],
                                 field_types=[self.base_type(t) for _, t in e.fields])  # fmt: skip
            register_composite(info, adapters, make_object=_make_composite)
        for e in by_kind.get("domain", ()):
            base = self.base_type(e.oid)
            for fmt in (TEXT, BINARY):
                loader = adapters.get_loader(base, fmt)
                if loader is not None:
                    adapters.register_loader(e.oid, loader)
        for e in by_kind.get("array", ()):
            array.register_array(TypeInfo(e.name, e.element_oid, e.oid), adapters)
        for typ in REG_TYPES:  # a binary reg* value is an OID: its name, as a text slot sends
            adapters.register_loader(typ, _reg_loader(typ, self.reg_names.setdefault(typ, {})))
        return adapters


def _float4_ranges(adapters: AdaptersMap, oid: int) -> None:
    """The range or multirange ``oid``'s loaders, just registered, made to load
    Float4Range values."""
    for fmt in (TEXT, BINARY):
        adapters.register_loader(oid, float4_range_loader(adapters.get_loader(oid, fmt)))


class _AskedNames(dict):
    """reg* OID -> name, asking the server for an OID not seen yet."""

    def __init__(self, execute, reg_type: int):
        super().__init__()
        self._execute, self._type = execute, reg_type

    def __missing__(self, oid: int) -> str:
        cast = REG_TYPE_NAMES[self._type]
        rows = self._execute(f"SELECT %s::oid::{cast}::text", [oid])
        self[oid] = name = rows[0][0]
        return name


class LiveCatalog(Catalog):
    """A catalog that asks the server (``execute(sql, params) -> rows``) about each type that
    is not built in the first time a relation names it, and about each reg* OID a binary
    value carries: for readers of a live slot (the streaming source), where the server is at
    hand and nothing was recorded."""

    def __init__(self, execute) -> None:
        super().__init__()
        self._execute = execute
        self.reg_names = {t: _AskedNames(execute, t) for t in REG_TYPES}

    def __getstate__(self):
        raise TypeError("a LiveCatalog holds a connection: it is not shipped")

    def ensure(self, oids) -> None:
        wanted = [o for o in oids if not is_builtin(o) and o not in self.types]
        if wanted:
            types = describe_types(self._execute, wanted)
            self.add_entries(types[o] for o in sorted(types))
            # types the server does not have (dropped since): known as unreadable
            for o in wanted:
                if o not in self.types:
                    self.add(TypeEntry(o, "other"))
