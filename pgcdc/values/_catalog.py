"""What a capture knows about types that are not built in (enums, domains, their arrays)."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import pq
from psycopg.adapt import AdaptersMap
from psycopg.types import TypeInfo, array

from ._loaders import ADAPTERS, FAST_ADAPTERS

TEXT, BINARY = pq.Format.TEXT, pq.Format.BINARY


@dataclass(frozen=True)
class TypeEntry:
    """One type: ``kind`` is 'enum', 'domain', 'array' or 'other' (known by name only, e.g.
    from a Type message); ``base_oid`` is a domain's base type, ``element_oid`` an array's
    element type."""

    oid: int
    kind: str
    name: str = ""
    namespace: str = ""
    base_oid: int = 0
    element_oid: int = 0


class Catalog:
    """Type OID -> how to load its values. Without an entry a type that is not built in loads
    as its text (a text value) or stays ``bytes`` (a binary value)."""

    def __init__(self) -> None:
        self.types: dict[int, TypeEntry] = {}
        self._adapters: tuple[AdaptersMap, AdaptersMap] | None = None

    def add(self, entry: TypeEntry) -> None:
        self.types[entry.oid] = entry
        self._adapters = None

    def add_enum(self, oid: int, name: str = "", array_oid: int = 0) -> None:
        self.add(TypeEntry(oid, "enum", name))
        if array_oid:
            self.add(TypeEntry(array_oid, "array", f"_{name}", element_oid=oid))

    def add_domain(self, oid: int, base_oid: int, name: str = "", array_oid: int = 0) -> None:
        self.add(TypeEntry(oid, "domain", name, base_oid=base_oid))
        if array_oid:
            self.add(TypeEntry(array_oid, "array", f"_{name}", element_oid=oid))

    def add_type_message(self, msg) -> None:
        """Record a pgoutput Type message (it carries the name only: values stay text)."""
        if msg.type_oid not in self.types:
            self.add(TypeEntry(msg.type_oid, "other", msg.type_name, msg.namespace))

    @classmethod
    def from_connection(cls, conn) -> Catalog:
        """Enums and domains (and their arrays) of a database, from ``pg_type``."""
        cat = cls()
        rows = conn.execute(
            "SELECT t.oid::int8, t.typtype::text, t.typname::text, t.typbasetype::int8,"
            " t.typarray::int8 FROM pg_type t WHERE t.typtype IN ('e', 'd') ORDER BY t.oid"
        ).fetchall()
        for oid, typtype, name, base, arr in rows:
            if typtype == "e":
                cat.add_enum(oid, name, arr)
            else:
                cat.add_domain(oid, base, name, arr)
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
        arrays = []
        for e in self.types.values():
            if e.kind == "enum":
                for fmt in (TEXT, BINARY):  # enum_send sends the label's text
                    adapters.register_loader(e.oid, base_map.get_loader(25, fmt))
            elif e.kind == "domain":
                base = self.base_type(e.oid)
                for fmt in (TEXT, BINARY):
                    loader = base_map.get_loader(base, fmt)
                    if loader is not None:
                        adapters.register_loader(e.oid, loader)
            elif e.kind == "array":
                arrays.append(e)
        for e in arrays:
            array.register_array(TypeInfo(e.name, e.element_oid, e.oid), adapters)
        return adapters
