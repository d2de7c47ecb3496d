"""The initial snapshot of a slot's tables, on the PostgreSQL side.

A snapshot aligned with a slot is what makes "snapshot + changes" equal the server's tables:
``CREATE_REPLICATION_SLOT name LOGICAL pgoutput (SNAPSHOT 'export')`` returns the slot's
*consistent point* and the name of a snapshot that sees exactly the transactions that
committed before it. The slot sends every transaction that commits after it. So the tables
read at that snapshot plus the slot's changes from the consistent point lose nothing and
repeat nothing.

The exported snapshot lives only while the replication connection that made it is open and
idle, so :class:`SlotSnapshot` holds that connection until the whole read is over. Readers
(Spark tasks, or this process) each open their own connection and run ``BEGIN ISOLATION LEVEL
REPEATABLE READ; SET TRANSACTION SNAPSHOT '<name>'`` before reading their part.

Tables are split into ranges of heap blocks (``ctid >= '(a,0)' AND ctid < '(b,0)'``), which
works for every table, keyed or not, and uses a TID range scan (PostgreSQL 14+). The last range
is open-ended, so rows in blocks added after the size was measured are never missed (none of
them can be visible to the snapshot, but the query costs nothing more).

Rows come through ``COPY (SELECT ...) TO STDOUT`` in text format and are loaded by
:class:`pgcdc.values.RowLoader`, the loader change events use, so a snapshot row and an
inserted row of the same values give equal Python values. The session pins DateStyle,
IntervalStyle, extra_float_digits and TimeZone as the capture does.

What is read is what the publication publishes: the tables of ``pg_publication_tables``
(which already follows ``publish_via_partition_root``: a partitioned table is read through its
root), only the published columns (column lists, PostgreSQL 15+) and only rows that pass the
row filter (OR-ed across publications, as pgoutput does).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pgcdc.errors import SetupError
from pgcdc.capture.walsender import PINNED_GUCS, WalsenderConnection, quote_ident, quote_literal
from pgcdc.lsn import format_lsn
from pgcdc.tablekey import table_key
from pgcdc.values import RowLoader
from pgcdc.values import Catalog
from pgcdc.values._catalog import describe_types

__all__ = [
    "Column",
    "PublishedTable",
    "TableRange",
    "ExportedSnapshot",
    "SlotSnapshot",
    "SnapshotError",
    "list_published_tables",
    "plan_ranges",
    "describe_published_table",
    "table_shapes",
    "table_storage",
    "open_snapshot_connection",
    "read_range",
    "iter_text_copy_rows",
]


class SnapshotError(SetupError):
    """A snapshot that cannot be taken or read, with what and where."""


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int  # atttypmod: numeric(p,s), varchar(n), timestamp(p); -1 for none


@dataclass(frozen=True)
class PublishedTable:
    """One table as a publication publishes it."""

    schema: str
    table: str
    oid: int
    relkind: str  # 'r' table, 'p' partitioned table (read through its leaves)
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # replica identity columns (primary key or index); () for none
    replica_identity: str  # default | nothing | full | index
    row_filter: str | None  # SQL expression, or None for every row
    blocks: int  # heap blocks (the largest leaf for a partitioned table) when listed
    bytes: int = 0  # heap + TOAST bytes (all leaves) when listed: ranges are sized by it
    rows_estimate: int = 0  # pg_class.reltuples (all leaves), for progress; 0 unknown

    @property
    def qualified_name(self) -> str:
        """Its key: its directory under an output root (:func:`pgcdc.tablekey.table_key`)."""
        return table_key(self.schema, self.table)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def type_oids(self) -> tuple[int, ...]:
        return tuple(c.type_oid for c in self.columns)

    def select_sql(
        self, lo_block: int | None = None, hi_block: int | None = None, items: str | None = None
    ) -> str:
        """The SELECT of one block range (None: unbounded on that side); ``items``: the
        select list (default: the published columns)."""
        cols = items if items is not None else ", ".join(quote_ident(c.name) for c in self.columns)
        # ONLY: inheritance children are published (and read) as tables of their own; a
        # partitioned table has no rows of its own, so it is read with its partitions.
        only = "ONLY " if self.relkind == "r" else ""
        where = []
        if lo_block is not None and lo_block > 0:
            where.append(f"ctid >= '({lo_block},0)'::tid")
        if hi_block is not None:
            where.append(f"ctid < '({hi_block},0)'::tid")
        if self.row_filter:
            where.append(f"({self.row_filter})")
        sql = f"SELECT {cols} FROM {only}{quote_ident(self.schema)}.{quote_ident(self.table)}"
        return sql + (" WHERE " + " AND ".join(where) if where else "")

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "table": self.table,
            "oid": self.oid,
            "relkind": self.relkind,
            "columns": [[c.name, c.type_oid, c.type_modifier] for c in self.columns],
            "key": list(self.key),
            "replica_identity": self.replica_identity,
            "row_filter": self.row_filter,
            "blocks": self.blocks,
            "bytes": self.bytes,
            "rows_estimate": self.rows_estimate,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PublishedTable:
        return cls(
            d["schema"],
            d["table"],
            d["oid"],
            d["relkind"],
            tuple(Column(n, o, m) for n, o, m in d["columns"]),
            tuple(d["key"]),
            d["replica_identity"],
            d["row_filter"],
            d["blocks"],
            d.get("bytes", 0),
            d.get("rows_estimate", 0),
        )


@dataclass(frozen=True)
class TableRange:
    """Blocks [lo_block, hi_block) of one table; hi_block None reads to the end."""

    table: PublishedTable
    index: int  # the range's number within its table
    lo_block: int
    hi_block: int | None

    def select_sql(self) -> str:
        return self.table.select_sql(self.lo_block, self.hi_block)


@dataclass(frozen=True)
class ExportedSnapshot:
    slot: str
    consistent_point: int  # the slot sends the transactions that commit after this
    snapshot_name: str
    server_major: int

    @property
    def consistent_point_text(self) -> str:
        return format_lsn(self.consistent_point)


@dataclass
class SlotSnapshot:
    """Creates ``slot`` with an exported snapshot and keeps the replication connection open
    (and idle) until :meth:`close`, so readers can import the snapshot meanwhile::

        with SlotSnapshot(dsn, "cdc") as snap:
            info = snap.exported          # slot, consistent point, snapshot name
            ... read the tables at info.snapshot_name ...
    """

    dsn: str
    slot: str
    two_phase: bool = False
    exported: ExportedSnapshot | None = None
    _conn: WalsenderConnection | None = field(default=None, repr=False)

    def open(self) -> SlotSnapshot:
        self._conn = WalsenderConnection.connect(self.dsn, application_name="pgcdc snapshot")
        try:
            info = self._conn.create_slot(self.slot, two_phase=self.two_phase, snapshot="export")
        except BaseException:
            self.close()
            raise
        if not info.snapshot_name:
            self.close()
            raise SnapshotError(f"CREATE_REPLICATION_SLOT {self.slot}: no snapshot was exported")
        self.exported = ExportedSnapshot(
            info.slot_name, info.consistent_point, info.snapshot_name, self._conn.server_version
        )
        return self

    def close(self) -> None:
        """Release the exported snapshot (the slot stays)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> SlotSnapshot:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


# -- what is published ---------------------------------------------------------------------

_TABLES_SQL = """
SELECT DISTINCT c.oid::int8, n.nspname::text, c.relname::text, c.relkind::text
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY(%s)
ORDER BY 2, 3
"""

# per publication: its column list (attnames) and row filter, for one table
_TABLE_PUBS_SQL = """
SELECT pt.attnames::text[], pt.rowfilter
FROM pg_publication_tables pt
WHERE pt.pubname = ANY(%s) AND pt.schemaname = %s AND pt.tablename = %s
"""

_COLUMNS_SQL = """
SELECT a.attname::text, a.atttypid::int8, a.atttypmod
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

# the replica identity columns: the primary key (DEFAULT) or the chosen index (USING INDEX)
_KEY_SQL = """
SELECT c.relreplident::text,
       COALESCE((SELECT array_agg(a.attname::text ORDER BY k.ord)
                 FROM pg_index i
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                 WHERE i.indrelid = c.oid
                   AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                           WHEN 'i' THEN i.indisreplident ELSE false END),
                '{}')
FROM pg_class c WHERE c.oid = %s
"""

_BLOCKS_SQL = """
SELECT (GREATEST(pg_relation_size(%(oid)s::oid),
                 COALESCE((SELECT max(pg_relation_size(t.relid))
                           FROM pg_partition_tree(%(oid)s::oid) t), 0))
        / current_setting('block_size')::int8)::int8
"""

# heap + TOAST bytes and the planner's row estimate, over the table or all its leaves
_SIZE_SQL = """
WITH rels AS (SELECT relid FROM pg_partition_tree(%(oid)s::oid) WHERE isleaf
              UNION SELECT %(oid)s::oid::regclass)
SELECT COALESCE(sum(pg_table_size(r.relid)), 0)::int8,
       COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::int8
FROM rels r JOIN pg_class c ON c.oid = r.relid
"""

_ANCESTORS_SQL = "SELECT relid::int8 FROM pg_partition_ancestors(%s) WHERE relid <> %s::regclass"

_IDENTITY = {"d": "default", "n": "nothing", "f": "full", "i": "index"}


def list_published_tables(conn, publications: Sequence[str]) -> list[PublishedTable]:
    """The tables ``publications`` publish, with their published columns and row filter.

    A partition whose ancestor is listed too is dropped: pgoutput then sends its changes as
    the ancestor's (publish_via_partition_root), and reading both would read its rows twice.
    ``conn`` is a psycopg connection (any snapshot: names and types do not change under a
    replication slot's feet without a Relation message saying so)."""
    pubs = list(publications)
    found = conn.execute(
        "SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s)", [pubs]
    ).fetchall()
    missing = sorted(set(pubs) - {r[0] for r in found})
    if missing:
        raise SnapshotError(
            f"publication {', '.join(missing)} does not exist (fix: CREATE PUBLICATION, "
            "or check --publication)"
        )
    rows = conn.execute(_TABLES_SQL, [pubs]).fetchall()
    oids = {r[0] for r in rows}
    out = []
    for oid, schema, name, relkind in rows:
        ancestors = {r[0] for r in conn.execute(_ANCESTORS_SQL, [oid, oid]).fetchall()}
        if ancestors & oids:
            continue
        out.append(_describe_table(conn, pubs, oid, schema, name, relkind))
    return out


# what puts each table in the publications: its pg_publication_rel rows (its own or an
# ancestor's), pg_publication_namespace rows (PostgreSQL 15+) of its schema or an ancestor's,
# and the FOR ALL TABLES publications. A row removed and added again has a new OID.
_MEMBERSHIP_SQL = """
WITH t AS (SELECT unnest(%(oids)s::int8[])::oid AS relid),
     up AS (SELECT t.relid, a.relid AS anc FROM t, pg_partition_ancestors(t.relid) a
            UNION SELECT t.relid, t.relid FROM t)
SELECT t.relid::int8,
       ARRAY(SELECT 'rel ' || pr.oid FROM pg_publication_rel pr
             JOIN pg_publication p ON p.oid = pr.prpubid
             WHERE p.pubname = ANY(%(pubs)s)
               AND pr.prrelid IN (SELECT anc FROM up WHERE up.relid = t.relid))
       {namespaces}
       || ARRAY(SELECT 'all ' || p.oid FROM pg_publication p
                WHERE p.pubname = ANY(%(pubs)s) AND p.puballtables)
FROM t
"""
_NAMESPACES_SQL = """
       || ARRAY(SELECT 'schema ' || pn.oid FROM pg_publication_namespace pn
                JOIN pg_publication p ON p.oid = pn.pnpubid
                WHERE p.pubname = ANY(%(pubs)s)
                  AND pn.pnnspid IN (SELECT c.relnamespace FROM pg_class c
                                     JOIN up ON c.oid = up.anc WHERE up.relid = t.relid))
"""


def publication_memberships(conn, publications: Sequence[str], oids) -> dict[int, set[str]]:
    """{table OID: the catalog rows that put it in ``publications``} (``rel N``, ``schema N``,
    ``all N``: the row's OID). A table removed from a publication and added back has none of
    the rows it had: ``pgcdc sync`` snapshots it again (its changes meanwhile never came)."""
    version = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()[0]
    sql = _MEMBERSHIP_SQL.format(namespaces=_NAMESPACES_SQL if version >= 150000 else "")
    rows = conn.execute(sql, {"oids": list(oids), "pubs": list(publications)}).fetchall()
    return {oid: set(tokens) for oid, tokens in rows}


def partition_leaves(conn, oids) -> dict[int, set[str]]:
    """{partitioned table OID: its partitions' tokens (``leaf N``: a leaf's OID)}. Published
    through its root, a partition detached or dropped takes its rows out of the table with
    no change in the stream: ``pgcdc sync`` says so."""
    rows = conn.execute(
        "SELECT r::int8, array_agg('leaf ' || t.relid::int8) FILTER (WHERE t.isleaf) "
        "FROM unnest(%s::int8[]) r, pg_partition_tree(r::oid) t GROUP BY r",
        [list(oids)],
    ).fetchall()
    return {oid: set(tokens or ()) for oid, tokens in rows}


def table_memberships(conn, publications: Sequence[str], tables) -> dict[str, list[str]]:
    """{table name: its sorted tokens}: the catalog rows that put each of ``tables``
    (:class:`PublishedTable`) in ``publications`` (:func:`publication_memberships`) and, for a
    partitioned table, its partitions (:func:`partition_leaves`). ``pgcdc sync`` records them
    with each snapshot and at each check, and compares: a table removed and added back, or a
    partition detached or dropped, changes its rows with no change in the stream."""
    members = publication_memberships(conn, publications, [t.oid for t in tables])
    roots = [t.oid for t in tables if t.relkind == "p"]
    for oid, leaves in (partition_leaves(conn, roots) if roots else {}).items():
        members[oid] = members.get(oid, set()) | leaves
    return {t.qualified_name: sorted(members.get(t.oid, ())) for t in tables}


def memberships_or_none(conn, publications: Sequence[str], tables) -> dict | None:
    """:func:`table_memberships` as a snapshot records it, or None where the server cannot
    tell (before 12: no ``pg_partition_tree``); then the first check records them."""
    import psycopg

    try:
        with conn.transaction():
            return table_memberships(conn, publications, tables)
    except psycopg.Error:
        return None


# each column's number (a rename keeps it; a column added takes a new one) and whether it is
# generated (pgoutput leaves those out of its Relation messages before PostgreSQL 18)
_ATTNUMS_SQL = """
SELECT a.attrelid::int8, a.attnum::int, a.attname::text, a.attgenerated <> ''
FROM pg_attribute a
WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
"""

# where the table's rows are stored: its relfilenode, or its partitions'. A rewrite (a
# volatile DEFAULT, a type change, VACUUM FULL, CLUSTER, TRUNCATE) gives a new one
_STORAGE_SQL = """
SELECT t.relid::int8,
       ARRAY(SELECT c.relfilenode::int8 FROM pg_class c
             WHERE c.oid = t.relid
                OR c.oid IN (SELECT p.relid FROM pg_partition_tree(t.relid) p WHERE p.isleaf)
             ORDER BY c.oid)
FROM unnest(%s::int8[]) AS t(relid)
"""


def describe_published_table(conn, publications: Sequence[str], table: PublishedTable):
    """``table`` as ``publications`` publish it now (:class:`PublishedTable`: its published
    columns, key, row filter), or None when it is gone or renamed since it was listed."""
    row = conn.execute(
        "SELECT n.nspname::text, c.relname::text, c.relkind::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        [table.oid],
    ).fetchone()
    if row is None or (row[0], row[1]) != (table.schema, table.table):
        return None
    return _describe_table(conn, list(publications), table.oid, *row)


def table_storage(conn, oids) -> dict[int, list[int]] | None:
    """{table OID: its relfilenodes} (:data:`_STORAGE_SQL`), None before PostgreSQL 12."""
    import psycopg

    try:
        with conn.transaction():
            return {o: list(r or ()) for o, r in conn.execute(_STORAGE_SQL, [list(oids)])}
    except psycopg.Error:
        return None


def table_shapes(conn, tables) -> dict[str, dict] | None:
    """{table name: its shape}: ``columns``, the published columns of each of ``tables``
    (:class:`PublishedTable`) as ``[attnum, name, type OID, typmod]``, ``storage``, its
    relfilenodes (a table rewritten has new ones), and ``generated``, its generated columns
    (when it has any). ``pgcdc sync`` records them with each snapshot and compares them with
    the server's at each check: a column added, dropped, renamed or retyped with no change
    of the table since. None where the server cannot tell (before 12)."""
    import psycopg

    oids = [t.oid for t in tables]
    storage = table_storage(conn, oids)
    try:
        with conn.transaction():
            attnums = conn.execute(_ATTNUMS_SQL, [oids]).fetchall()
    except psycopg.Error:
        return None
    if storage is None:
        return None
    numbers: dict[int, dict[str, int]] = {}
    generated: dict[int, list[str]] = {}
    for oid, attnum, name, gen in attnums:
        numbers.setdefault(oid, {})[name] = attnum
        if gen:
            generated.setdefault(oid, []).append(name)
    out = {}
    for t in tables:
        have = numbers.get(t.oid, {})
        if any(c.name not in have for c in t.columns):
            continue  # altered since it was listed: the next look sees it as it is
        doc = {"columns": [[have[c.name], c.name, c.type_oid, c.type_modifier] for c in t.columns],
               "storage": list(storage.get(t.oid) or ())}  # fmt: skip
        if t.oid in generated:
            doc["generated"] = sorted(generated[t.oid])
        out[t.qualified_name] = doc
    return out


def _describe_table(conn, pubs, oid, schema, name, relkind) -> PublishedTable:
    all_cols = [Column(*r) for r in conn.execute(_COLUMNS_SQL, [oid]).fetchall()]
    published: set[str] = set()
    filters: list[str | None] = []
    for attnames, rowfilter in conn.execute(_TABLE_PUBS_SQL, [pubs, schema, name]).fetchall():
        published.update(attnames or ())
        filters.append(rowfilter)
    columns = tuple(c for c in all_cols if c.name in published) if published else tuple(all_cols)
    # a row is sent when any publication's filter passes it; no filter passes every row
    row_filter = None if any(f is None for f in filters) or not filters else " OR ".join(
        f"({f})" for f in dict.fromkeys(filters)
    )  # fmt: skip
    ident, key = conn.execute(_KEY_SQL, [oid]).fetchone()
    (blocks,) = conn.execute(_BLOCKS_SQL, {"oid": oid}).fetchone()
    size, rows = conn.execute(_SIZE_SQL, {"oid": oid}).fetchone()
    return PublishedTable(
        schema,
        name,
        oid,
        relkind,
        columns,
        tuple(key),
        _IDENTITY.get(ident, ident),
        row_filter,
        int(blocks),
        int(size),
        int(rows),
    )


DEFAULT_RANGE_BYTES = 128 << 20


def blocks_for_bytes(table: PublishedTable, range_bytes: int) -> int:
    """Heap blocks per range so that a range holds about ``range_bytes`` of the table (heap
    and TOAST: a table of large TOASTed values gets ranges of fewer blocks)."""
    if range_bytes < 1:
        raise ValueError(f"range_bytes must be at least 1, got {range_bytes}")
    per_block = table.bytes / table.blocks if table.blocks and table.bytes else 8192.0
    return max(1, int(range_bytes / max(per_block, 1.0)))


def plan_ranges(
    tables: Sequence[PublishedTable],
    *,
    blocks_per_range: int | None = None,
    range_bytes: int | None = None,
    min_ranges: int = 1,
) -> list[TableRange]:
    """Split each table into ranges of about ``range_bytes`` (heap and TOAST; default
    128 MiB), or of ``blocks_per_range`` heap blocks when that is given; a table of more
    blocks than ``min_ranges`` gets at least that many ranges (every task has work). The
    last range of a table is open-ended, so every row is in exactly one."""
    if blocks_per_range is not None and blocks_per_range < 1:
        raise ValueError(f"blocks_per_range must be at least 1, got {blocks_per_range}")
    out = []
    for t in tables:
        per = blocks_per_range or blocks_for_bytes(t, range_bytes or DEFAULT_RANGE_BYTES)
        if min_ranges > 1 and t.blocks >= min_ranges:
            # a multiple of min_ranges ranges (the tasks that run at once): no last wave
            # with one task alone
            n = -(-max(1, -(-t.blocks // per)) // min_ranges) * min_ranges
            per = -(-t.blocks // n)
        out.extend(_table_ranges(t, per))
    return out


def _table_ranges(t: PublishedTable, blocks_per_range: int) -> list[TableRange]:
    n = max(1, -(-t.blocks // blocks_per_range))
    return [
        TableRange(t, i, i * blocks_per_range, None if i == n - 1 else (i + 1) * blocks_per_range)
        for i in range(n)
    ]


# -- reading at the snapshot ---------------------------------------------------------------


def open_snapshot_connection(dsn: str, snapshot_name: str, *, application_name="pgcdc snapshot"):
    """A psycopg connection inside ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`` at the
    exported snapshot ``snapshot_name``, with the session settings text values assume."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True, application_name=application_name)
    try:
        for name, value in PINNED_GUCS.items():
            conn.execute(f"SET {name} = {quote_literal(value)}")
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot_name)}")
    except psycopg.Error as e:
        conn.close()
        raise SnapshotError(
            f"cannot import snapshot {snapshot_name!r}: {str(e).strip()} (the exporting "
            "replication connection must stay open and idle until every reader has started)"
        ) from None
    return conn


class _Col:
    """The (kind, value) shape RowLoader reads, for a text COPY field."""

    __slots__ = ("kind", "value")

    def __init__(self, value):
        self.kind = "t" if value is not None else "n"
        self.value = value


_ESCAPE = re.compile(rb"\\(.)", re.S)
_UNESCAPE = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescape(field: bytes) -> bytes:
    return _ESCAPE.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(1)), field)


def iter_text_copy_rows(chunks, ncols: int, where: str = "") -> Iterator[list]:
    """Rows of a text-format COPY stream as lists of field bytes (None for NULL).

    COPY's text format escapes backslash, tab, newline and the other control characters it
    would otherwise emit raw, so a row ends at a raw newline and fields split at raw tabs."""
    rest = b""
    rowno = 0
    for chunk in chunks:
        data = rest + bytes(chunk) if rest else bytes(chunk)
        lines = data.split(b"\n")
        rest = lines.pop()
        for line in lines:
            fields = line.split(b"\t") if ncols else []
            if len(fields) != ncols:
                raise SnapshotError(
                    f"{where}: COPY row {rowno} has {len(fields)} fields, expected {ncols}"
                )
            rowno += 1
            yield [None if f == b"\\N" else (_unescape(f) if b"\\" in f else f) for f in fields]
    if rest:
        raise SnapshotError(f"{where}: COPY ended inside row {rowno} ({len(rest)} bytes)")


FIRST_NORMAL_OID = 16384  # types made by initdb (built in) have smaller OIDs
_TEXT_OID = 25


def catalog_docs(conn, tables: Sequence[PublishedTable]) -> list[dict]:
    """What the server says of the tables' column types that are not built in (the entries a
    capture records in catalog.jsonl), for :class:`pgcdc.values.Catalog.add_entries`."""

    oids = sorted({o for t in tables for o in t.type_oids if o >= FIRST_NORMAL_OID})
    if not oids:
        return []
    found = describe_types(lambda q, p: conn.execute(q, p).fetchall(), oids)
    return [found[o] for o in sorted(found)]


def make_catalog(docs: list[dict]):
    """A :class:`pgcdc.values.Catalog` of :func:`catalog_docs`' entries (None for none)."""
    if not docs:
        return None

    cat = Catalog()
    cat.add_entries(docs)
    return cat


def loader_oid(type_oid: int) -> int:
    """The type a snapshot loads a column's text as: its own when built in; text for the
    others (enums, domains, composites, extension types): the snapshot reads no capture
    catalog, so their values are their text, as change events without a catalog give them."""
    return type_oid if type_oid < FIRST_NORMAL_OID else _TEXT_OID


def read_range(
    conn, rng: TableRange, *, batch_rows: int = 10_000, catalog=None
) -> Iterator[list[tuple]]:
    """Batches of rows (tuples of Python values, as change events load them) of one range,
    read on ``conn`` (from :func:`open_snapshot_connection`). ``catalog``
    (:class:`pgcdc.values.Catalog`, e.g. from :func:`catalog_docs`) types what is not built
    in, as a capture's catalog does for change events; without one, such values are text."""
    t = rng.table
    if catalog is not None:
        loader = RowLoader(
            [o if catalog.describes(o) or o < FIRST_NORMAL_OID else _TEXT_OID for o in t.type_oids],
            catalog=catalog,
        )
    else:
        loader = RowLoader([loader_oid(o) for o in t.type_oids])
    where = f"{t.qualified_name} range {rng.index} (blocks {rng.lo_block}..{rng.hi_block})"
    ncols = len(t.columns)
    batch: list[tuple] = []
    load = loader.load
    with conn.cursor() as cur, cur.copy(f"COPY ({rng.select_sql()}) TO STDOUT") as copy:
        for fields in iter_text_copy_rows(copy, ncols, where):
            try:
                batch.append(load([_Col(f) for f in fields]))
            except ValueError as e:
                raise SnapshotError(f"{where}, row {len(batch)}: {e}") from e
            if len(batch) >= batch_rows:
                yield batch
                batch = []
    if batch:
        yield batch
