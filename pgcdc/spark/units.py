"""The units of work of the Spark change events: the summary of each capture file, and the
plan that cuts the stream into units and says what each one carries in.

1. **Summary** (:func:`summarize_file`, one task per file): reads every record's header and
   tag byte (in C where the reader is built, through :func:`pgcdc.capture.files.range_chunks`) and
   decodes only the small messages that frame transactions (Begin/Commit, Stream
   Start/Commit/Abort, Begin Prepare/Prepare/Commit Prepared/Rollback Prepared, Stream
   Prepare) and the Relation/Type messages. Inserts, updates and deletes are skipped unread.
   It returns these control entries with their position, and a possible split point every
   ``split_records`` records.
2. **Plan** (:func:`plan`, on the driver, on the small summaries only): folds the control
   entries in stream order into, for each :class:`Unit`, the position of the oldest
   transaction still open where the unit starts (a streamed, prepared or plain transaction
   begun earlier), and the relation cache at that position (the latest Relation message per
   table, Type messages). It also gives each table's schema (:class:`TableSchema`): the union
   of the columns of all its Relation messages, typed by :mod:`pgcdc.spark.types`.

:mod:`pgcdc.spark.changes` runs both and reads the units.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

import pgoutput_codec as pgc
from pgoutput_codec import capture as capfmt

from pgcdc.capture.chunks import GATES_BY_KEY, is_chunk
from pgcdc.lsn import format_lsn
from pgcdc.runtime.capture_file import RECORD_HEADER
from pgcdc.capture.files import CaptureFile, open_capture, range_chunks
from pgcdc.tablekey import table_key
from pgcdc.spark import types as pgtypes
from pgcdc.events.relations import KEY_FLAG, REPLICA_IDENTITY
from pgcdc.values import RowLoader

__all__ = [
    "DEFAULT_SPLIT_RECORDS",
    "SPLIT_GRAIN",
    "TableSchema",
    "Unit",
    "plan",
    "summarize_file",
]

DEFAULT_SPLIT_RECORDS = 1_000_000  # records per unit at most
SPLIT_GRAIN = 50_000  # the summary offers a unit boundary every this many records

# tags whose messages the summary decodes; every other message is skipped unread
_CONTROL = frozenset(
    ord(cls.TAG)
    for cls in (
        pgc.Begin, pgc.Commit, pgc.StreamStart, pgc.StreamStop, pgc.StreamCommit,
        pgc.StreamAbort, pgc.BeginPrepare, pgc.Prepare, pgc.CommitPrepared,
        pgc.RollbackPrepared, pgc.StreamPrepare, pgc.Relation, pgc.Type,
    )
)  # fmt: skip
_CONTROL_TAGS = re.compile(b"[" + re.escape(bytes(sorted(_CONTROL))) + b"]")


# --- 1. summary ---------------------------------------------------------------------------------


def summarize_file(file_no: int, cf: CaptureFile, split_records: int, since=None) -> dict:
    """Control entries ``(index, offset, lsn, tag, payload-or-fields)`` and split points
    ``(index, offset)`` of one file (runs in a task). ``since``: this file's summary up to an
    earlier end (its records unchanged since): only the records after it are read."""
    with open_capture(cf) as (data, start, end):
        splits = [(0, start)]
        control: list = []
        seen: set = set()
        size = RECORD_HEADER.size
        index, off = 0, start  # the next record's number and offset
        next_split = split_records
        if since is not None and start <= since["end"] <= end:
            splits, control = list(since["splits"]), list(since["control"])
            seen = set(since["seen"])
            index, off, next_split = since["records"], since["end"], since["next_split"]
            start = off
        for item in range_chunks(data, start, end):
            if is_chunk(item):
                n = len(item.keys)
                o = item.offsets
                # record i of the chunk starts after i headers and the messages before it
                while next_split < index + n:
                    i = next_split - index
                    splits.append((next_split, off + size * i + o[i]))
                    next_split += split_records
                for m in _CONTROL_TAGS.finditer(item.tags):
                    i = m.start()
                    rec = capfmt.Record(
                        *GATES_BY_KEY[item.keys[i]], item.lsns[i], item.values[o[i] : o[i + 1]]
                    )
                    at = off + size * i + o[i]
                    _control_entry(cf.path, index + i, at, rec, item.tags[i], seen, control)
                off += size * n + o[n]
                index += n
                continue
            # a record the C reader does not take (or every record without it)
            gates, lsn, payload = item
            if index == next_split:
                splits.append((index, off))
                next_split += split_records
            if payload and payload[0] in _CONTROL:
                rec = capfmt.Record(*gates, lsn, payload)
                _control_entry(cf.path, index, off, rec, payload[0], seen, control)
            off += size + len(payload)
            index += 1
    # end, next_split and seen: where a later summary of the same file goes on (since)
    return {"file_no": file_no, "splits": splits, "records": index, "control": control,
            "end": off, "next_split": next_split, "seen": seen}  # fmt: skip


def _control_entry(path, index, off, rec, tag, relations_seen, control) -> None:
    if tag in b"RY":
        raw = bytes(rec.data)
        if raw in relations_seen:  # streams resend the same Relation each block
            fields = None
        else:
            relations_seen.add(raw)
            fields = (rec.protocol_version, rec.in_stream, rec.parallel_streaming, raw)
        control.append((index, off, rec.lsn, chr(tag), fields))
        return
    try:
        msg = rec.decode()
    except pgc.DecodeError as e:
        raise ValueError(
            f"{path}: message {index} at LSN {format_lsn(rec.lsn)} (byte {off}) "
            f"does not decode: {e}"
        ) from e
    control.append((index, off, rec.lsn, chr(tag), _control_fields(msg)))


def _control_fields(msg) -> tuple:
    cls = type(msg)
    if cls is pgc.Begin:
        return (msg.xid, msg.final_lsn)
    if cls in (pgc.Commit,):
        return (msg.commit_lsn,)
    if cls is pgc.StreamStart:
        return (msg.xid, msg.first_segment)
    if cls is pgc.StreamStop:
        return ()
    if cls is pgc.StreamCommit:
        return (msg.xid, msg.commit_lsn)
    if cls is pgc.StreamAbort:
        return (msg.xid, msg.subxid)
    if cls in (pgc.BeginPrepare, pgc.Prepare):
        return (msg.xid, msg.gid)
    if cls is pgc.StreamPrepare:
        return (msg.xid, msg.gid)
    if cls in (pgc.CommitPrepared,):
        return (msg.xid, msg.gid, msg.commit_lsn)
    if cls is pgc.RollbackPrepared:
        return (msg.xid, msg.gid)
    return ()


# --- 2. plan ------------------------------------------------------------------------------------


@dataclass
class Unit:
    """What one events task reads: files[i] = (file_no, path, start, end, first_index, emit)
    from the oldest open transaction's start to the unit's end; ``relations`` the Relation
    and Type records (protocol, in_stream, parallel, payload) current where reading starts;
    ``max_commit_lsn`` the largest commit LSN among the transactions it may emit."""

    unit_no: int
    files: list
    relations: list
    max_commit_lsn: int = -1
    catalog: object = None  # the captures' pgcdc.values.Catalog (types not built in), or None
    passed_over: frozenset = frozenset()  # tables whose values are not loaded (not applied)


@dataclass
class TableSchema:
    """The union of a table's columns over all its Relation messages."""

    schema: str
    table: str
    names: list = field(default_factory=list)
    type_oids: list = field(default_factory=list)  # the widest version's (see add)
    typmods: list = field(default_factory=list)
    conflicts: set = field(default_factory=set)  # columns whose type changed otherwise: text
    key_names: tuple | None = None  # from the latest version with a real key
    identities: set = field(default_factory=set)
    latest: tuple = ()  # the columns of the latest Relation message (the table now)
    relation_oid: int = 0  # of the latest Relation message
    record: tuple = ()  # the latest Relation message: (protocol, in_stream, parallel, payload)
    catalog: object = None  # pgcdc.values.Catalog: types that are not built in, and defaults

    @property
    def qualified(self) -> str:
        return table_key(self.schema, self.table)

    def add(self, rel, relation_oid: int = 0) -> None:
        for name, oid, mod in zip(rel.columns_names, rel.type_oids, rel.typmods):
            if name not in self.names:
                self.names.append(name)
                self.type_oids.append(oid)
                self.typmods.append(mod)
                continue
            i = self.names.index(name)
            if name in self.conflicts:
                continue
            # Arrow's types are Spark's one for one, without importing Spark
            had = pgtypes.pg_arrow_type(self.type_oids[i], self.typmods[i], self.catalog)
            now = pgtypes.pg_arrow_type(oid, mod, self.catalog)
            if had == now or pgtypes.widens(now, had):
                continue  # (narrowed: the values before do not all fit the new type)
            if pgtypes.widens(had, now):
                # int to bigint, numeric(8,2) to numeric(12,4): the column takes the wider
                # type, as the server's rows did; values of either version convert to it
                self.type_oids[i], self.typmods[i] = oid, mod
            else:
                self.conflicts.add(name)
        self.identities.add(rel.identity)
        self.latest = rel.columns_names
        self.relation_oid = relation_oid
        if rel.identity in ("default", "index") and rel.key_names:
            self.key_names = rel.key_names

    def spark_type(self, name: str):
        return self.column_type("spark", name)

    def column_type(self, kind: str, name: str):
        """Column ``name``'s type among ``kind``'s types (``pgcdc.spark.types.column_type``);
        text for a column whose type changed between Relation messages."""
        if name in self.conflicts:
            return pgtypes.type_namespace(kind).StringType()
        i = self.names.index(name)
        return pgtypes.column_type(kind, self.type_oids[i], self.typmods[i], self.catalog)

    def defaults(self) -> dict:
        """Column -> the text of the value rows from before the column was added hold
        (``attmissingval``, recorded by the capture), for the table's current columns."""
        missing = getattr(self.catalog, "missing", None) or {}
        found = missing.get(self.relation_oid) or {}
        return {n: t for n, t in found.items() if n in self.latest and t is not None}

    def default_loaded(self) -> dict:
        """:meth:`defaults` as loaded values (what a change's columns hold)."""

        out = {}
        for name, text in self.defaults().items():
            oid = self.type_oids[self.names.index(name)]
            out[name] = RowLoader([oid], catalog=self.catalog).load([_Text(text.encode())])[0]
        return out

    def converter(self, name: str):
        """The value converter of column ``name`` as the table's schema types it."""
        i = self.names.index(name)
        if name in self.conflicts:
            return pgtypes.text_converter(self.type_oids[i])
        return pgtypes.value_converter(self.type_oids[i], self.typmods[i], self.catalog)

    def default_values(self) -> dict:
        """:meth:`defaults` converted: column -> (Spark value, None), or (None, text) when the
        Spark type cannot hold it (the text goes into ``_pg_text``)."""
        out = {}
        for name, value in self.default_loaded().items():
            try:
                out[name] = (self.converter(name)(value), None)
            except pgtypes.Unrepresentable as u:
                out[name] = (None, u.text)
        return out

    def column_types(self, kind: str = "spark") -> list:
        """The types of the columns (:attr:`names`), then of the side column
        ``pgtypes.SPECIAL_COLUMN`` (``map<string,string>``), among ``kind``'s types."""
        T = pgtypes.type_namespace(kind)
        side = T.MapType(T.StringType(), T.StringType(), True)
        return [*(self.column_type(kind, n) for n in self.names), side]

    def columns_struct(self, kind: str = "spark"):
        """The columns and the side column as a struct: Spark's, or (kind "arrow") Arrow's,
        without importing Spark."""
        T = pgtypes.type_namespace(kind)
        names = [*self.names, pgtypes.SPECIAL_COLUMN]
        return T.StructType(
            [T.StructField(n, t, True) for n, t in zip(names, self.column_types(kind))]
        )


def relation_record(msg) -> tuple:
    """A pgoutput_codec.Relation (as relations.jsonl describes it) as plan's ``known`` takes
    it."""
    return (1, False, False, pgc.encode(msg, protocol_version=1))


def record_to_json(record: tuple) -> list:
    version, in_stream, parallel, payload = record
    return [version, in_stream, parallel, base64.b64encode(payload).decode()]


def record_from_json(doc: list) -> tuple:
    version, in_stream, parallel, payload = doc
    return (version, in_stream, parallel, base64.b64decode(payload))


@dataclass(frozen=True)
class _Text:  # a TupleData column as RowLoader takes it
    value: bytes
    kind: str = "t"


@dataclass(frozen=True)
class _Rel:
    qualified: tuple
    identity: str
    columns_names: tuple
    type_oids: tuple
    typmods: tuple
    key_names: tuple


def _relation_of(fields) -> tuple[str, object]:
    version, in_stream, parallel, raw = fields
    msg = capfmt.Record(version, in_stream, parallel, 0, raw).decode()
    if type(msg) is pgc.Type:
        return "Y", msg
    cols = msg.columns
    return (
        "R",
        _Rel(
            (msg.namespace, msg.relation_name),
            REPLICA_IDENTITY.get(msg.replica_identity, chr(msg.replica_identity)),
            tuple(c.name for c in cols),
            tuple(c.type_oid for c in cols),
            tuple(c.type_modifier for c in cols),
            tuple(c.name for c in cols if c.flags & KEY_FLAG),
        ),
        msg.relation_oid,
    )


def plan(
    files: list[CaptureFile],
    summaries: list[dict],
    split_records: int | None = None,
    min_units: int | None = None,
    *,
    catalog=None,
    known: list | None = None,
):
    """(units, {qualified name: TableSchema}) from the per-file summaries. ``known``: Relation
    and Type records (protocol, in_stream, parallel, payload) current before the first file
    (what a capture directory or apply's state recorded: files before were pruned);
    ``catalog``: the captures' :class:`pgcdc.values.Catalog`, typing the schemas. Every file starts
    a unit; with ``split_records``, a file is cut at the summary's split points into units of
    at most that many records, and of about ``total / min_units`` when that is fewer (so
    every core gets a unit, and each unit is as large as that allows: apply's tasks combine
    a unit's changes per key before Spark shuffles them); without, at every split point."""
    summaries = sorted(summaries, key=lambda s: s["file_no"])
    size = None
    if split_records is not None:
        total = sum(s["records"] for s in summaries)
        size = split_records
        if min_units:
            size = max(1, min(size, -(-total // min_units)))
    # unit boundaries, as global positions (file_no, index, offset)
    bounds = []
    for s in summaries:
        points = s["splits"]
        grain = points[1][0] - points[0][0] if len(points) > 1 else 1
        wanted = 0  # the next boundary wanted, in records from the file's start
        kept = 0
        for index, off in points:
            if not (index < s["records"] or (index == 0 and s["records"] == 0)):
                continue
            # no crumb of a unit at the end: the last one takes it if it stays within bounds
            crumb = s["records"] - index < min(size or 1, grain) // 2
            crumb = crumb and s["records"] - kept <= (split_records or 0)
            if size is None or index == 0 or (index + grain // 2 >= wanted and not crumb):
                bounds.append((s["file_no"], index, off))
                wanted = index + (size or 0)
                kept = index
    ends = {s["file_no"]: s["records"] for s in summaries}
    tables: dict[str, TableSchema] = {}
    latest_rel: dict[int, tuple] = {}  # relation oid -> record fields
    latest_type: dict[int, tuple] = {}
    raw_fields: dict[bytes, tuple] = {}
    plain = preparing = None  # start positions
    streams: dict[int, tuple] = {}
    prepared: dict[str, tuple] = {}
    open_commit: dict[tuple, int] = {}  # start position -> commit lsn once known
    unit_states = []  # (bound, oldest open start, relations snapshot)
    entries = [(s["file_no"], *e) for s in summaries for e in s["control"]]
    if known:
        first = (summaries[0]["file_no"], -1, 0, 0) if summaries else (0, -1, 0, 0)
        entries[:0] = [(*first, "Y" if f[3][:1] == b"Y" else "R", f) for f in known]
    b = 0
    # commit LSNs released per unit: (start position, commit lsn) pairs per unit boundary
    commits: list[tuple[tuple, tuple, int]] = []  # (txn start pos, commit pos, commit lsn)
    for file_no, index, off, lsn, tag, fields in entries + [(1 << 60, 0, 0, 0, "", None)]:
        pos = (file_no, index, off)
        while b < len(bounds) and bounds[b][:2] <= pos[:2]:
            starts = [p for p in (plain, preparing) if p is not None]
            starts += list(streams.values()) + list(prepared.values())
            oldest = min(starts) if starts else bounds[b]
            unit_states.append((bounds[b], oldest, dict(latest_rel), dict(latest_type)))
            b += 1
        if not tag:
            break
        if tag in "RY":
            if fields is None:
                continue  # a resent copy: the cache already has it
            kind, info, *oid = _relation_of(fields)
            raw_fields[fields[3]] = fields
            if kind == "Y":
                latest_type[info.type_oid] = fields
            else:
                latest_rel[oid[0]] = fields
                name = table_key(*info.qualified)
                if name not in tables:
                    tables[name] = TableSchema(*info.qualified, catalog=catalog)
                tables[name].add(info, oid[0])
                tables[name].record = fields
            continue
        if tag == "B":
            plain = pos
            open_commit[pos] = fields[1]
        elif tag == "C":
            if plain is not None:
                commits.append((plain, pos, fields[0]))
            plain = None
        elif tag == "S":
            xid, first = fields
            if first or xid not in streams:
                streams.setdefault(xid, pos)
        elif tag == "c":
            start = streams.pop(fields[0], None)
            commits.append((start or pos, pos, fields[1]))
        elif tag == "A":
            xid, subxid = fields
            if xid == subxid:
                streams.pop(xid, None)
        elif tag == "b":
            preparing = pos
        elif tag == "P":
            if preparing is not None:
                prepared[fields[1]] = preparing
            preparing = None
        elif tag == "p":
            start = streams.pop(fields[0], None)
            prepared[fields[1]] = start or pos
        elif tag == "K":
            start = prepared.pop(fields[1], None)
            commits.append((start or pos, pos, fields[2]))
        elif tag == "r":
            prepared.pop(fields[1], None)
    if plain is not None:
        commits.append((plain, (1 << 60, 0, 0), open_commit[plain]))
    units = []
    for u, (bound, oldest, rels, types_) in enumerate(unit_states):
        nxt = unit_states[u + 1][0] if u + 1 < len(unit_states) else None
        parts = []
        last_file = nxt[0] if nxt is not None else len(files) - 1
        for fno in range(oldest[0], last_file + 1):
            start_idx, start_off = (oldest[1], oldest[2]) if fno == oldest[0] else (0, None)
            if nxt is not None and fno == nxt[0]:
                end_idx, end_off = nxt[1], nxt[2]
            else:
                end_idx, end_off = ends[fno], None
            if end_idx <= start_idx:
                continue
            cut = (bound[1], bound[2]) if fno == bound[0] else None
            cf = files[fno]
            parts.append(
                (fno, cf.path, cf.end, start_idx, start_off, end_idx, end_off, fno < bound[0], cut)
            )
        lo = (bound[0], bound[1])
        hi = (nxt[0], nxt[1]) if nxt is not None else (1 << 60, 0)
        max_commit = max(
            (lsn for start, cpos, lsn in commits if cpos[:2] >= lo and start[:2] < hi),
            default=-1,
        )
        relations = list(types_.values()) + list(rels.values())
        units.append(Unit(u, parts, relations, max_commit))
    return units, tables
