"""The relation cache: what each relation OID means, as the stream has described it so far.

pgoutput sends a Relation message before the first change to a table in each context (and again
after its definition changes), and a Type message for every column type that is not built in.
Changes refer to the table only by OID, so a reader must remember the latest description.

Every Relation message makes a new, immutable :class:`RelationInfo` *version*. The cache keeps
them all, numbered by an epoch that grows with each Relation or Type message, so a change that
was buffered (a streamed or prepared transaction, possibly spilled to disk) is typed later with
the columns that were current when it arrived, not with those of a later ALTER TABLE.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import lru_cache

from psycopg import postgres

from pgcdc.errors import DataError
from pgcdc.tablekey import table_key
from pgcdc.values import RowLoader

# pg_class.relreplident, as the Relation message sends it (a character code)
REPLICA_IDENTITY = {ord("d"): "default", ord("n"): "nothing", ord("f"): "full", ord("i"): "index"}
KEY_FLAG = 1  # RelationColumn.flags: the column is part of the replica identity key


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A non-built-in type as a Type message named it (a domain is named by its base type)."""

    oid: int
    schema: str
    name: str


@dataclass(frozen=True, slots=True, eq=False)
class RelationInfo:
    """One version of a table's description, from one Relation message."""

    oid: int
    schema: str
    table: str
    replica_identity: str  # default | nothing | full | index
    names: tuple[str, ...]
    type_oids: tuple[int, ...]
    type_modifiers: tuple[int, ...]
    key_indexes: tuple[int, ...]  # positions of the replica identity key columns
    epoch: int  # the cache epoch this version was made in
    loader: object = field(repr=False)  # a values.RowLoader for these column types
    key_names: tuple[str, ...] = ()
    key_type_oids: tuple[int, ...] = ()
    # The type each column's values load and render as: its own OID, or for a domain over a
    # built-in type that built-in type's OID (its Type message names the base type).
    value_type_oids: tuple[int, ...] = ()
    # Each column's type name: built-in types by their pg_catalog name (arrays with "[]"),
    # others as their Type message named them ("schema.name"; a domain by its base type's
    # name, which is what pgoutput sends), "" for an OID nothing described.
    type_names: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.value_type_oids:
            object.__setattr__(self, "value_type_oids", self.type_oids)
        if not self.type_names:
            object.__setattr__(self, "type_names", tuple(map(builtin_type_name, self.type_oids)))
        # derived once here: renderers use them per event
        object.__setattr__(self, "key_names", tuple(self.names[i] for i in self.key_indexes))
        object.__setattr__(
            self, "key_type_oids", tuple(self.value_type_oids[i] for i in self.key_indexes)
        )

    @property
    def qualified_name(self) -> str:
        return _qualified(self.schema, self.table)


def _qualified(schema: str, table: str) -> str:
    # pgoutput writes pg_catalog as the empty string; tables never live there
    return f"{schema}.{table}" if schema else table


@lru_cache(maxsize=4096)  # built-in types never change: asked per column of each Relation
def builtin_type_name(oid: int) -> str:
    """The pg_catalog name of a built-in type (``int4``, ``text[]``), or "" if not built in."""
    info = postgres.types.get(oid)
    if info is None:
        return ""
    return f"{info.name}[]" if oid == info.array_oid and oid != info.oid else info.name


def _builtin_oid(name: str) -> int | None:
    info = postgres.types.get(name)
    return None if info is None else info.oid


class UnknownRelation(DataError, KeyError):
    """A change names a relation OID that no Relation message has described (yet)."""


class PassedOver:
    """The row loader of a table whose values nobody reads (a run that applies other tables):
    every value None, nothing decoded, so none of them can fail."""

    def load(self, columns) -> tuple:
        return (None,) * len(columns)

    def load_lenient(self, columns) -> tuple[tuple, list]:
        return self.load(columns), []


class RelationCache:
    """Relation OID -> latest :class:`RelationInfo`; older versions stay reachable by epoch.
    ``passed_over``: keys (:func:`pgcdc.tablekey.table_key`) of tables whose values are not loaded
    (:class:`PassedOver`: their changes come with every value None)."""

    def __init__(self, *, catalog=None, loader_factory=None, passed_over=frozenset()):
        # loader_factory(type_oids, catalog=...) -> row loader; values.RowLoader by default.
        self._loader_factory = RowLoader if loader_factory is None else loader_factory
        self.passed_over = passed_over
        self.catalog = catalog
        self.epoch = 0
        self.current: dict[int, RelationInfo] = {}
        self.types: dict[int, TypeInfo] = {}
        # oid -> ([epochs], [versions]) in arrival order, for lookups as of an earlier epoch
        self._history: dict[int, tuple[list[int], list[RelationInfo]]] = {}
        # type OIDs -> row loader: streamed transactions resend Relation messages each time,
        # and building a loader costs as much as loading a few hundred rows
        self._loaders: dict[tuple[int, ...], object] = {}
        # (type OIDs, names, type names) -> the loader named for them: one per table, so the
        # per-column loaders it makes on first use are made once, not per Relation message
        self._named: dict[tuple, object] = {}

    def on_relation(self, msg) -> RelationInfo:
        """Record a Relation message (pgoutput_codec.Relation); returns the new version."""
        self.epoch += 1
        cols = msg.columns
        type_oids = tuple(c.type_oid for c in cols)
        if self.catalog is not None:
            self.catalog.ensure(type_oids)
        value_oids = tuple(map(self.value_type_oid, type_oids))
        names = tuple(c.name for c in cols)
        type_names = tuple(map(self.type_name, type_oids))
        if self.passed_over and table_key(msg.namespace, msg.relation_name) in self.passed_over:
            loader = PassedOver()
        else:
            loader = self._named_loader(value_oids, names, type_names)
        info = RelationInfo(
            oid=msg.relation_oid,
            schema=msg.namespace,
            table=msg.relation_name,
            replica_identity=REPLICA_IDENTITY.get(msg.replica_identity, chr(msg.replica_identity)),
            names=names,
            type_oids=type_oids,
            type_modifiers=tuple(c.type_modifier for c in cols),
            key_indexes=tuple(i for i, c in enumerate(cols) if c.flags & KEY_FLAG),
            epoch=self.epoch,
            loader=loader,
            value_type_oids=value_oids,
            type_names=type_names,
        )
        self.current[info.oid] = info
        epochs, versions = self._history.setdefault(info.oid, ([], []))
        epochs.append(self.epoch)
        versions.append(info)
        return info

    def _named_loader(self, value_oids, names, type_names):
        key = (value_oids, names, type_names)
        loader = self._named.get(key)
        if loader is None:
            loader = self._loader(value_oids)
            if hasattr(loader, "named"):  # errors that say which column, by name
                loader = loader.named(names, type_names)
            if len(self._named) > 10_000:
                self._named.clear()
            self._named[key] = loader
        return loader

    def _loader(self, type_oids: tuple[int, ...]):
        loader = self._loaders.get(type_oids)
        if loader is None:
            loader = self._loaders[type_oids] = self._loader_factory(
                type_oids, catalog=self.catalog
            )
        return loader

    def value_type_oid(self, oid: int) -> int:
        """The OID whose loader reads this type's values: a type a Type message described as
        a pg_catalog type (how pgoutput describes a domain over a built-in type) loads as
        that built-in type; any other OID as itself."""
        t = self.types.get(oid)
        if t is not None and t.schema in ("", "pg_catalog"):
            builtin = _builtin_oid(t.name)
            if builtin is not None:
                return builtin
        return oid

    def type_name(self, oid: int) -> str:
        name = builtin_type_name(oid)
        if name:
            return name
        entry = self.catalog.types.get(oid) if self.catalog is not None else None
        if entry is not None and entry.kind != "other":
            if entry.kind == "array":
                return self.type_name(entry.element_oid) + "[]"
            return entry.qualified_name
        t = self.types.get(oid)
        if t is None:
            return ""
        return f"{t.schema}.{t.name}" if t.schema else t.name

    def on_type(self, msg) -> TypeInfo:
        """Record a Type message (pgoutput_codec.Type)."""
        self.epoch += 1
        self._loaders.clear()  # a catalog that learns this type may load columns differently
        self._named.clear()
        info = TypeInfo(msg.type_oid, msg.namespace, msg.type_name)
        self.types[info.oid] = info
        return info

    def get(self, oid: int) -> RelationInfo:
        """The latest version of relation ``oid``; raises :class:`UnknownRelation`."""
        try:
            return self.current[oid]
        except KeyError:
            raise UnknownRelation(oid) from None

    def as_of(self, oid: int, epoch: int) -> RelationInfo:
        """The version of relation ``oid`` that was current at ``epoch``."""
        latest = self.current.get(oid)
        if latest is not None and latest.epoch <= epoch:
            return latest  # no Relation message for it since: the usual case
        hist = self._history.get(oid)
        if hist is not None:
            i = bisect.bisect_right(hist[0], epoch)
            if i:
                return hist[1][i - 1]
        raise UnknownRelation(oid)
