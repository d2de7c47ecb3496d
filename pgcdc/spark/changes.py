"""Change events of capture files as Spark DataFrames, one per table, built on the executors.

Design: two Spark jobs, the second one task per *unit* (a capture file, or a slice of one),
so the values are decoded and typed on the executors:

1. **Summary** (one task per file): reads every record's header and tag byte (in C where the
   reader is built) and decodes only the small messages that frame transactions (Begin/
   Commit, Stream Start/Commit/Abort, Begin Prepare/Prepare/Commit Prepared/Rollback
   Prepared, Stream Prepare) and the Relation/Type messages. Inserts, updates and deletes
   are skipped unread. It returns these control entries with their position, and a possible
   split point every 50,000 records. Units are at most ``split_records`` records (1M by
   default) and as large as gives every core one (:func:`plan`): apply's tasks combine a
   unit's changes per key, which larger units do better.
2. **Plan** (driver, on the small summaries only): folds the control entries in stream order
   into, for each unit, the position of the oldest transaction still open where the unit
   starts (a streamed, prepared or plain transaction begun earlier), and the relation cache
   at that position (the latest Relation message per table, Type messages). It also gives
   each table's schema: the union of the columns of all its Relation messages (schema
   evolution: a column added by ALTER TABLE is null before it existed, a dropped one stops
   being filled), typed by :mod:`pgcdc.spark.types`.
3. **Events** (one task per unit, ``mapInArrow``): loads the carried relations into a
   :class:`pgcdc.events.EventReader`, reads from that oldest open transaction's start to the
   unit's end, and emits the events that the unit's own records release (a transaction's
   events come out at its commit, or as they arrive for a plain Begin ... Commit), so every
   event is emitted by exactly one task, typed and in Arrow batches. The cost of carrying
   state is re-reading a transaction that spans a unit boundary, once per unit it spans.

The result (:class:`ChangeEvents`) is one wide DataFrame with the common columns and one
``<table>`` struct column per table holding ``before``/``after``; :meth:`ChangeEvents.table`
projects one table's DataFrame from it (persist it when several tables are read). A capture
directory is read up to its durable position (``state.json``), where nothing is open.

Columns of a table's DataFrame (Debezium names, as ``pgcdc changes`` writes them): ``op``
(c, u, d, t), ``before`` and ``after`` (structs of the table's columns plus ``_pg_text``; see
:mod:`pgcdc.spark.types`; ``before`` holds only the key columns unless the identity is FULL),
``before_is_key``, ``unchanged`` (unchanged TOAST columns, null in ``after``), ``commit_lsn``
and ``tx_ordinal`` (LongType: the total order), ``source`` (``lsn`` and ``commit_lsn`` as
PostgreSQL prints them, ``tx_ordinal``, ``commit_time``, ``xid``, ``origin``, ``schema``,
``table``), ``truncate`` (cascade, restart_identity) and ``errors`` (lenient mode). Logical
messages are not table changes and are left out (``pgcdc changes`` prints them).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress, groupby, repeat
from operator import itemgetter

import pgoutput_codec as pgc
from pgoutput_codec import capture as capfmt

from ..lsn import MAX_LSN, format_lsn
from ..sources import CaptureFile, Captures
from . import types as pgtypes

__all__ = ["ChangeEvents", "EventStats", "Unit", "change_events", "list_capture_files"]

RECORD_HEADER = struct.Struct(">BBQI")
FILE_HEADER_SIZE = len(capfmt.MAGIC) + 1
DEFAULT_SPLIT_RECORDS = 1_000_000  # records per unit at most
SPLIT_GRAIN = 50_000  # the summary offers a unit boundary every this many records
DRIVER_SUMMARY_BYTES = 256 << 20  # captures up to this size are summarised on the driver
BATCH_ROWS = 8192
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 - 1970-01-01 in microseconds

# tags whose messages the summary decodes; every other message is skipped unread
_CONTROL = frozenset(b"BCSEcAbPKrpRY")


def list_capture_files(paths) -> list[CaptureFile]:
    """Capture files and directories -> the files to read, in stream order, each up to where
    it may be read (:class:`pgcdc.sources.Captures`: a directory's durable position, the
    last commit boundary of a file or of a directory without state.json)."""
    return Captures.open(paths).logged().files


def _open_data(cf: CaptureFile):
    """(buffer, end offset, closer) of a capture file."""
    if cf.path.endswith(".gz"):
        import gzip

        with gzip.open(cf.path, "rb") as f:
            data = f.read()
        return data, len(data), lambda: None
    f = open(cf.path, "rb")
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        f.close()
        raise ValueError(f"{cf.path}: empty file, not a capture")
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def close():
        data.close()
        f.close()

    end = size if cf.end is None else min(cf.end, size)
    return data, end, close


def _check_header(path: str, data) -> None:
    if bytes(data[: len(capfmt.MAGIC)]) != capfmt.MAGIC or len(data) < FILE_HEADER_SIZE:
        raise ValueError(f"{path}: not a capture file (expected {capfmt.MAGIC!r})")


def iter_range(path: str, data, start: int, end: int) -> Iterator[tuple[int, capfmt.Record]]:
    """(offset, Record) of the records in data[start:end]; a partial record at the end (a
    crash while appending) is not a record and stops the iteration."""
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    record = capfmt.Record
    off = start
    while off < end:
        if off + size > end:
            return
        version, flags, lsn, length = unpack(data, off)
        body = off + size
        if body + length > end:
            return
        yield (
            off,
            record(version, bool(flags & 1), bool(flags & 2), lsn, data[body : body + length]),
        )
        off = body + length


def iter_raw_range(data, start: int, end: int) -> Iterator[tuple[tuple, int, bytes]]:
    """The records of data[start:end] as ``(gates, lsn, payload)`` triples, the input of
    :meth:`pgcdc.events.EventReader.read_raw` (no Record object per message: building one
    costs about as much as decoding the message); stops at a partial record as
    :func:`iter_range` does."""
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    gates_of: dict = {}
    off = start
    while off + size <= end:
        version, flags, lsn, length = unpack(data, off)
        body = off + size
        if body + length > end:
            return
        gates = gates_of.get((version, flags))
        if gates is None:
            gates = gates_of[(version, flags)] = (version, bool(flags & 1), bool(flags & 2))
        yield gates, lsn, data[body : body + length]
        off = body + length


def iter_chunks_range(data, start: int, end: int) -> Iterator:
    """:func:`iter_raw_range` for :meth:`pgcdc.events.EventReader.read_chunks`: chunks of
    the records read in C, then triples from the first record that is not plain."""
    from .. import sources

    yield from sources.chunks_then(data, start, end, lambda off, _: iter_raw_range(data, off, end))


# --- 1. summary ---------------------------------------------------------------------------------


def summarize_file(file_no: int, cf: CaptureFile, split_records: int) -> dict:
    """Control entries ``(index, offset, lsn, tag, payload-or-fields)`` and split points
    ``(index, offset)`` of one file (runs in a task)."""
    data, end, close = _open_data(cf)
    try:
        _check_header(cf.path, data)
        out = {"control": [], "splits": [(0, FILE_HEADER_SIZE)], "seen": set()}
        index, off = _summarize_chunks(cf.path, data, FILE_HEADER_SIZE, end, split_records, out)
        index = _summarize_records(cf.path, data, off, end, index, split_records, out)
        return {
            "file_no": file_no,
            "splits": out["splits"],
            "records": index,
            "control": out["control"],
        }
    finally:
        close()


_CONTROL_TAGS = re.compile(b"[" + re.escape(bytes(sorted(_CONTROL))) + b"]")


def _summarize_chunks(path, data, off: int, end: int, split_records: int, out: dict):
    """The plain records from ``off`` read in C, a chunk at a time (only the control ones
    become Records); (records read, offset of the first record not read)."""
    from .. import sources
    from ..chunks import GATES_BY_KEY

    if sources._c_scan is None:
        return 0, off
    chunks = sources.chunks_of(data, off, end)
    index = 0
    next_split = split_records
    while True:
        try:
            chunk = next(chunks)
        except StopIteration as stop:
            return index, stop.value
        n = len(chunk.keys)
        o = chunk.offsets
        # a record's offset: 14 bytes of header before each message
        size = RECORD_HEADER.size
        while next_split < index + n:
            i = next_split - index
            out["splits"].append((next_split, off + size * i + o[i]))
            next_split += split_records
        for m in _CONTROL_TAGS.finditer(chunk.tags):
            i = m.start()
            rec = capfmt.Record(
                *GATES_BY_KEY[chunk.keys[i]], chunk.lsns[i], chunk.values[o[i] : o[i + 1]]
            )
            at = off + size * i + o[i]
            _control_entry(path, index + i, at, rec, chunk.tags[i], out["seen"], out["control"])
        off += size * n + o[n]
        index += n


def _summarize_records(path, data, off: int, end: int, index: int, split_records, out) -> int:
    """The records from ``off`` one at a time (what the C reader leaves: records it does
    not take, or all without it); the number of records in all."""
    # the records as iter_range reads them, without a Record for the ones skipped
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    next_split = (index // split_records + 1) * split_records
    while off + size <= end:
        version, flags, lsn, length = unpack(data, off)
        body = off + size
        if body + length > end:
            break
        if index == next_split:
            out["splits"].append((index, off))
            next_split += split_records
        tag = data[body] if length else None
        if tag in _CONTROL:
            rec = capfmt.Record(
                version, bool(flags & 1), bool(flags & 2), lsn, data[body : body + length]
            )
            _control_entry(path, index, off, rec, tag, out["seen"], out["control"])
        off = body + length
        index += 1
    return index


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


@dataclass
class TableSchema:
    """The union of a table's columns over all its Relation messages."""

    schema: str
    table: str
    names: list = field(default_factory=list)
    type_oids: list = field(default_factory=list)  # as the first version typed them
    typmods: list = field(default_factory=list)
    conflicts: set = field(default_factory=set)  # columns whose type changed: text
    key_names: tuple | None = None  # from the latest version with a real key
    identities: set = field(default_factory=set)
    latest: tuple = ()  # the columns of the latest Relation message (the table now)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def add(self, rel) -> None:
        for name, oid, mod in zip(rel.columns_names, rel.type_oids, rel.typmods):
            if name not in self.names:
                self.names.append(name)
                self.type_oids.append(oid)
                self.typmods.append(mod)
                continue
            i = self.names.index(name)
            if pgtypes.spark_type(oid, mod) != pgtypes.spark_type(
                self.type_oids[i], self.typmods[i]
            ):
                self.conflicts.add(name)
        self.identities.add(rel.identity)
        self.latest = rel.columns_names
        if rel.identity in ("default", "index") and rel.key_names:
            self.key_names = rel.key_names

    def spark_type(self, name: str):
        from pyspark.sql.types import StringType

        if name in self.conflicts:
            return StringType()
        i = self.names.index(name)
        return pgtypes.spark_type(self.type_oids[i], self.typmods[i])

    def columns_struct(self):
        from pyspark.sql.types import MapType, StringType, StructField, StructType

        fields = [StructField(n, self.spark_type(n), True) for n in self.names]
        fields.append(
            StructField(pgtypes.SPECIAL_COLUMN, MapType(StringType(), StringType(), True), True)
        )
        return StructType(fields)


@dataclass(frozen=True)
class _Rel:
    qualified: tuple
    identity: str
    columns_names: tuple
    type_oids: tuple
    typmods: tuple
    key_names: tuple


def _relation_of(fields) -> tuple[str, object]:
    from ..relations import KEY_FLAG, REPLICA_IDENTITY

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
):
    """(units, {qualified name: TableSchema}) from the per-file summaries. Every file starts
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
                name = ".".join(info.qualified)
                if name not in tables:
                    tables[name] = TableSchema(*info.qualified)
                tables[name].add(info)
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


# --- 3. events ----------------------------------------------------------------------------------


def arrow_type(dt):
    """The Arrow type Spark's mapInArrow expects for a Spark DataType."""
    import pyarrow as pa
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return pa.struct([pa.field(f.name, arrow_type(f.dataType), True) for f in dt.fields])
    if isinstance(dt, T.ArrayType):
        return pa.list_(arrow_type(dt.elementType))
    if isinstance(dt, T.MapType):
        return pa.map_(arrow_type(dt.keyType), arrow_type(dt.valueType))
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, T.TimestampNTZType):
        return pa.timestamp("us")
    if isinstance(dt, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    simple = {
        T.BooleanType: pa.bool_(),
        T.ShortType: pa.int16(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
    }
    for cls, at in simple.items():
        if isinstance(dt, cls):
            return at
    raise TypeError(f"no Arrow type for {dt}")


def table_column(qualified: str, number: int) -> str:
    """The wide DataFrame's struct column for a table (names are not valid identifiers)."""
    return f"t{number}"


def event_schema(tables: dict[str, TableSchema]):
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    source = StructType(
        [
            StructField("lsn", StringType()),
            StructField("commit_lsn", StringType()),
            StructField("tx_ordinal", LongType()),
            StructField("commit_time", TimestampType()),
            StructField("xid", LongType()),
            StructField("origin", StringType()),
            StructField("schema", StringType()),
            StructField("table", StringType()),
        ]
    )
    truncate = StructType(
        [StructField("cascade", BooleanType()), StructField("restart_identity", BooleanType())]
    )
    fields = [
        StructField("table_name", StringType()),
        StructField("op", StringType()),
        StructField("commit_lsn", LongType()),
        StructField("tx_ordinal", LongType()),
        StructField("before_is_key", BooleanType()),
        StructField("unchanged", ArrayType(StringType())),
        StructField("source", source),
        StructField("truncate", truncate),
        StructField("errors", ArrayType(StringType())),
    ]
    for i, (name, ts) in enumerate(tables.items()):
        cols = ts.columns_struct()
        fields.append(
            StructField(
                table_column(name, i),
                StructType([StructField("before", cols), StructField("after", cols)]),
            )
        )
    return StructType(fields)


class _TableBuffer:
    """Events of one table, column by column, until a batch is full."""

    def __init__(self, ts: TableSchema, number: int, struct_type):
        self.ts = ts
        self.number = number
        self.cols_type = struct_type  # arrow struct of the columns (+ _pg_text)
        self.names = ts.names
        self.rows: list = []  # events
        self.plans: dict = {}  # relation version -> (positions, converters)

    def plan_for(self, rel):
        p = self.plans.get(id(rel))
        if p is None:
            pos = [self.names.index(n) for n in rel.names]
            convs = []
            for n, oid, mod in zip(rel.names, rel.type_oids, rel.type_modifiers):
                if n in self.ts.conflicts:
                    convs.append(pgtypes.text_converter(oid))
                else:
                    convs.append(pgtypes.value_converter(oid, mod))
            p = self.plans[id(rel)] = (rel, pos, convs)
        return p

    def positions(self, rel, is_key: bool) -> list:
        """Where the values of an image of ``rel`` go (the key columns only if ``is_key``)."""
        if is_key:
            return [self.names.index(x) for x in rel.key_names]
        return self.plan_for(rel)[1]


def _image_columns(buf: _TableBuffer, images, rels, keyed, which: str):
    """Arrow StructArray of the before/after ``images`` (value tuples or None) of a batch,
    whose relations are ``rels`` (``keyed``: the before image holds only the key). A batch
    whose images share one layout (one relation version, all key-only or none) is turned
    into columns at once; any other goes row by row."""
    import pyarrow as pa

    n = len(images)
    ncols = len(buf.names)
    present = [v is not None for v in images]
    everywhere = all(present)
    if everywhere:
        there, there_rels, there_keyed = images, rels, keyed
    else:  # the layouts of the images there are
        there = list(compress(images, present))
        there_rels, there_keyed = compress(rels, present), compress(keyed, present)
    if which == "before":
        kinds = set(zip(there_rels, there_keyed))
    else:
        kinds = set(zip(there_rels, repeat(False)))
    # relation versions (a new one per Relation message) mostly put values in the same places
    layouts = {tuple(buf.positions(rel, is_key)) for rel, is_key in kinds}
    lengths = set(map(len, there))
    columns = [None] * ncols
    if not there:
        pass
    elif len(layouts) == 1 and len(lengths) == 1:
        pos = layouts.pop()
        width = lengths.pop()
        if not everywhere:
            blank = (None,) * width
            images = [v if v is not None else blank for v in images]
        for k, p in enumerate(pos[:width]):  # as many as both have, as row by row
            columns[p] = list(map(itemgetter(k), images))
    else:
        columns = [[None] * n for _ in range(ncols)]
        for r, values in enumerate(images):
            if values is None:
                continue
            for p, v in zip(buf.positions(rels[r], which == "before" and keyed[r]), values):
                columns[p][r] = v
    specials: list = [None] * n
    arrays = []
    struct_fields = buf.cols_type
    for j in range(ncols):
        at = struct_fields.field(j).type
        if columns[j] is None:
            arrays.append(pa.nulls(n, at))
        else:
            arrays.append(_column_array(buf, rels, j, columns[j], at, specials))
    if specials.count(None) < n:
        special_arr = pa.array(
            [None if s is None else list(s.items()) for s in specials],
            type=struct_fields.field(ncols).type,
        )
    else:
        special_arr = pa.nulls(n, struct_fields.field(ncols).type)
    mask = None if everywhere else pa.array([not p for p in present], pa.bool_())
    return pa.StructArray.from_arrays([*arrays, special_arr], fields=list(struct_fields), mask=mask)


def _column_array(buf, rels, j, values, at, specials):
    import pyarrow as pa

    try:
        return pa.array(values, type=at)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    name = buf.names[j]
    out = []
    for r, v in enumerate(values):
        if v is None or v is pgtypes.UNCHANGED:
            out.append(None)
            continue
        conv = _converter_of(buf, rels[r], name)
        try:
            out.append(conv(v))
        except pgtypes.Unrepresentable as u:
            out.append(None)
            if specials[r] is None:
                specials[r] = {}
            specials[r][name] = u.text
    return pa.array(out, type=at)


def _converter_of(buf, rel, name):
    rel, _pos, convs = buf.plan_for(rel)
    return convs[rel.names.index(name)]


def lsn_texts(lsns):
    """Arrow strings of LSNs as PostgreSQL prints them (:func:`pgcdc.lsn.format_lsn`), made
    a column at a time by decode_messages' own LSN text; a value repeated along the column (a
    commit LSN) is made once."""
    import numpy as np
    import pyarrow as pa

    from ..runtime.spark.arrow import _lsn_text

    if not lsns or None in lsns or min(lsns) < 0 or max(lsns) > MAX_LSN:
        return pa.array([None if x is None else format_lsn(x) for x in lsns], pa.string())
    a = np.array(lsns, dtype=np.uint64)
    values, where = np.unique(a, return_inverse=True)
    if 2 * len(values) <= len(a):
        return _lsn_text(pa.array(values)).take(pa.array(where.ravel()))
    return _lsn_text(pa.array(a))


_TABLE_OPS = frozenset("cudt")
_EVENT_FIELDS = (
    "op",
    "relation",
    "before",
    "after",
    "unchanged",
    "lsn",
    "commit_lsn",
    "tx_ordinal",
    "commit_time",
    "xid",
    "origin",
    "before_is_key",
    "detail",
    "errors",
)  # pgcdc.events.Event's, in order (checked by the tests)


def _events_batch(buf: _TableBuffer, events, schema):
    """One RecordBatch of a table's change events (c, u, d, t), built a column at a time;
    None if there are none."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _TABLE_OPS.issuperset(map(itemgetter(0), events)):
        events = [ev for ev in events if ev.op in _TABLE_OPS]
        if not events:
            return None
    n = len(events)
    # the events' fields as lists (zip(*events) is slower; so is pa.array of a tuple)
    (
        ops,
        rels,
        befores,
        afters,
        unchanged,
        lsns,
        commit_lsns,
        tx_ordinals,
        times,
        xids,
        origins,
        keyed,
        details,
        errors,
    ) = [list(map(itemgetter(i), events)) for i in range(len(_EVENT_FIELDS))]
    before = _image_columns(buf, befores, rels, keyed, "before")
    after = _image_columns(buf, afters, rels, keyed, "after")
    commit_time = pc.add_checked(pa.array(times, pa.int64()), PG_EPOCH_US).cast(
        pa.timestamp("us", tz="UTC")
    )
    source = pa.StructArray.from_arrays(
        [
            lsn_texts(lsns),
            lsn_texts(commit_lsns),
            pa.array(tx_ordinals, pa.int64()),
            commit_time,
            pa.array(xids, pa.int64()),
            pa.array(origins, pa.string()),
            pa.repeat(pa.scalar(buf.ts.schema, pa.string()), n),
            pa.repeat(pa.scalar(buf.ts.table, pa.string()), n),
        ],
        fields=list(schema.field("source").type),
    )
    trunc_type = schema.field("truncate").type
    if "t" in ops:
        truncate = pa.array(
            [
                {"cascade": d[0], "restart_identity": d[1]} if op == "t" else None
                for op, d in zip(ops, details)
            ],
            trunc_type,
        )
    else:
        truncate = pa.nulls(n, trunc_type)
    if any(unchanged):
        unchanged_arr = pa.array(unchanged, pa.list_(pa.string()))
    else:  # all empty lists
        unchanged_arr = pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], pa.string())
        )
    if any(errors):
        errors_arr = pa.array(
            [[str(e) for e in errs] if errs else None for errs in errors], pa.list_(pa.string())
        )
    else:
        errors_arr = pa.nulls(n, pa.list_(pa.string()))
    columns = {
        "table_name": pa.repeat(pa.scalar(buf.ts.qualified, pa.string()), n),
        "op": pa.array(ops, pa.string()),
        "commit_lsn": pa.array(commit_lsns, pa.int64()),
        "tx_ordinal": pa.array(tx_ordinals, pa.int64()),
        "before_is_key": pa.array(keyed, pa.bool_()),
        "unchanged": unchanged_arr,
        "source": source,
        "truncate": truncate,
        "errors": errors_arr,
    }
    mine = table_column(buf.ts.qualified, buf.number)
    arrays = []
    for f in schema:
        if f.name in columns:
            arrays.append(columns[f.name])
        elif f.name == mine:
            arrays.append(pa.StructArray.from_arrays([before, after], fields=list(f.type)))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def unit_events(unit: Unit, lenient: bool = False) -> Iterator:
    """The events one unit emits, in stream order (runs in a task)."""
    for part in unit_parts(unit, lenient):
        yield from part


def unit_parts(unit: Unit, lenient: bool = False, raw_runs: bool = False) -> Iterator:
    """:func:`unit_events` as lists (a run of changes loaded column-wise, or the messages
    between such runs; at most a chunk of records each); with ``raw_runs``, a run that
    would load column-wise comes as a :class:`pgcdc.events.RawRun` instead."""
    from ..events import EventReader, RawRun

    reader = EventReader(lenient=lenient)
    rels = reader.relations
    for fields in unit.relations:
        msg = capfmt.Record(fields[0], fields[1], fields[2], 0, fields[3]).decode()
        if type(msg) is pgc.Type:
            rels.on_type(msg)
        else:
            rels.on_relation(msg)
    for fno, path, fend, start_idx, start_off, end_idx, end_off, before, cut in unit.files:
        cf = CaptureFile(path, fend)
        data, end, close = _open_data(cf)
        try:
            _check_header(path, data)
            off = FILE_HEADER_SIZE if start_off is None else start_off
            stop = end if end_off is None else end_off
            reader.index = start_idx
            records = iter_chunks_range(data, off, stop)
            try:
                if before:
                    for _ in reader.read_chunks(records):
                        pass
                    continue
                if cut is not None and cut[0] > start_idx:
                    for _ in reader.read_chunks(iter_chunks_range(data, off, cut[1])):
                        pass
                    records = iter_chunks_range(data, cut[1], stop)
                for part in reader.read_chunk_parts(records, raw_runs):
                    if type(part) is RawRun:
                        part.path = path
                        yield part
                        continue
                    events = list(part)  # here, so that its errors name the file
                    if events:
                        yield events
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from e
        finally:
            close()


def events_to_batches(
    unit: Unit, tables: dict, schema, lenient: bool = False, stats: dict | None = None
):
    """Arrow RecordBatches of one unit's table change events (runs in a task); ``stats``:
    a dict ``{"after": LSN or None}`` that :func:`batch_stats` fills as the batches go."""
    arrow_schema = arrow_type(schema)
    import pyarrow as pa

    arrow_schema = pa.schema(list(arrow_schema))
    buffers = {}
    for i, (name, ts) in enumerate(tables.items()):
        col = arrow_schema.field(table_column(name, i)).type
        buffers[name] = _TableBuffer(ts, i, col.field("after").type)

    def batch_of(buf, rows):
        """The batch of a table's rows, with its stats taken; None if none changed it."""
        batch = _events_batch(buf, rows, arrow_schema)
        if batch is not None and stats is not None:
            batch_stats(batch, buf.ts.qualified, stats)
        return batch

    for rel, group in groupby(unit_events(unit, lenient), itemgetter(1)):
        if rel is None:  # logical messages
            continue
        buf = buffers.get(f"{rel.schema}.{rel.table}")
        if buf is None:  # lenient: an unknown relation; its errors say so
            continue
        rows = buf.rows
        rows.extend(group)
        while len(rows) >= BATCH_ROWS:
            batch = batch_of(buf, rows[:BATCH_ROWS])
            del rows[:BATCH_ROWS]
            if batch is not None:
                yield batch
    for buf in buffers.values():
        if buf.rows:
            batch = batch_of(buf, buf.rows)
            buf.rows = []
            if batch is not None:
                yield batch


def batch_stats(batch, table: str, stats: dict) -> None:
    """Add a batch's events committed after ``stats["after"]`` to ``stats["tables"][table]``
    (see :class:`EventStats`)."""
    import numpy as np
    import pyarrow.compute as pc

    commit = batch.column("commit_lsn").to_numpy(zero_copy_only=False)
    ordinal = batch.column("tx_ordinal").to_numpy(zero_copy_only=False)
    keep = np.ones(len(commit), bool) if stats["after"] is None else commit > stats["after"]
    if not keep.any():
        return
    truncates = keep & pc.equal(batch.column("op"), "t").to_numpy(zero_copy_only=False)
    unchanged = pc.list_flatten(batch.column("unchanged").filter(keep))
    EventStats.addInPlace(
        stats["tables"],
        {
            table: {
                "last": _max_seq(commit, ordinal, keep),
                "truncate": _max_seq(commit, ordinal, truncates) if truncates.any() else None,
                "unchanged": set(pc.unique(unchanged).to_pylist()) if len(unchanged) else set(),
            }
        },
    )


def _max_seq(commit, ordinal, where) -> tuple[int, int]:
    top = commit[where].max()
    return int(top), int(ordinal[where & (commit == top)].max())


class EventStats:
    """Accumulator of :func:`change_events` ``stats``: ``{table: {"last": (commit_lsn,
    tx_ordinal), "truncate": the last truncate's or None, "unchanged": {column names}}}``
    over the events committed after ``min_commit_lsn``. Merging is idempotent, so a task
    run again (a lost cache block, a retry) changes nothing."""

    @staticmethod
    def zero(value):
        return {}

    @staticmethod
    def addInPlace(into: dict, more: dict) -> dict:  # noqa: N802 (Spark's name)
        for table, s in more.items():
            mine = into.get(table)
            if mine is None:
                into[table] = {**s, "unchanged": set(s["unchanged"])}
                continue
            mine["last"] = max(mine["last"], s["last"])
            if s["truncate"] is not None:
                mine["truncate"] = max(mine["truncate"] or s["truncate"], s["truncate"])
            mine["unchanged"] |= s["unchanged"]
        return into


# --- the DataFrames -----------------------------------------------------------------------------


@dataclass
class ChangeEvents:
    """The events of some captures: ``events`` (the wide DataFrame), the table schemas and
    the plan (units) it was built from."""

    events: object
    tables: dict
    units: list
    skipped_units: int = 0  # units not read: all they emit was committed by min_commit_lsn
    stats: object = None  # change_events(stats=True): an EventStats accumulator
    seeds: object = None  # one row (a unit number) per partition: what the tasks map over
    lenient: bool = False
    min_commit_lsn: int | None = None

    def table_stats(self) -> dict:
        """With ``stats=True``, once ``events`` has been computed: {table: {"last",
        "truncate", "unchanged"}} of the events committed after ``min_commit_lsn`` (see
        :class:`EventStats`); tables without such events are not in it."""
        if self.stats is None:
            return {}
        return {t: dict(s) for t, s in self.stats.value.items()}

    def files_read(self) -> list[str]:
        """The capture files the units read (any part of them)."""
        return sorted({part[1] for unit in self.units for part in unit.files})

    def table_names(self) -> list[str]:
        return list(self.tables)

    def table(self, qualified: str, events=None, extra=("truncate", "errors")):
        """One table's change events: the common columns, ``before`` and ``after``, then the
        ``extra`` columns; from ``events`` when given (a DataFrame of this one's rows and
        columns, such as apply's cache of what it reads)."""
        from pyspark.sql import functions as F

        names = list(self.tables)
        if qualified not in self.tables:
            raise KeyError(f"no changes of table {qualified!r} (tables: {names})")
        col = table_column(qualified, names.index(qualified))
        df = (self.events if events is None else events).where(F.col("table_name") == qualified)
        return df.select(
            "op",
            F.col(col + ".before").alias("before"),
            F.col(col + ".after").alias("after"),
            "before_is_key",
            "unchanged",
            "commit_lsn",
            "tx_ordinal",
            "source",
            *extra,
        )


def change_events(
    spark,
    captures,
    *,
    split_records: int = DEFAULT_SPLIT_RECORDS,
    min_units: int | None = None,
    lenient: bool = False,
    min_commit_lsn: int | None = None,
    ship: bool | None = None,
    stats: bool = False,
) -> ChangeEvents:
    """Change events of capture files/directories (one continuous stream, in the order given)
    as a :class:`ChangeEvents`. ``min_commit_lsn``: units that can only emit transactions
    committed at or before it are not read (incremental runs). ``split_records``: records
    per task at most; ``min_units``: tasks at least, when there are records enough (default:
    the context's parallelism), see :func:`plan`. ``ship``: add pgcdc and the
    codecs to the executors (:mod:`pgcdc.spark.ship`); by default unless the master is local
    (local executors run this interpreter, which has them). ``stats``: the tasks also gather
    :attr:`ChangeEvents.stats` as they compute ``events`` (no job of its own)."""
    from .ship import is_local_master, ship_packages

    if ship or (ship is None and not is_local_master(spark)):
        ship_packages(spark)
    files = list_capture_files(captures)
    sc = spark.sparkContext
    grain = min(SPLIT_GRAIN, split_records)
    jobs = list(enumerate(files))
    if sum(os.path.getsize(f.path) for f in files) <= DRIVER_SUMMARY_BYTES:
        # a job costs more than reading these headers here (about 0.04 s per 1M records)
        summaries = [summarize_file(i, f, grain) for i, f in jobs]
    else:
        summaries = (
            sc.parallelize(jobs, len(jobs))
            .map(lambda job: summarize_file(job[0], job[1], grain))
            .collect()
        )
    if min_units is None:
        min_units = sc.defaultParallelism
    units, tables = plan(files, summaries, split_records, min_units)
    if min_commit_lsn is not None:
        kept = [u for u in units if u.max_commit_lsn > min_commit_lsn]
        skipped, units = len(units) - len(kept), kept
    else:
        skipped = 0
    schema = event_schema(tables)
    acc = sc.accumulator({}, EventStats()) if stats else None
    if not units:
        return ChangeEvents(
            spark.createDataFrame([], schema),
            tables,
            units,
            skipped,
            acc,
            None,
            lenient,
            min_commit_lsn,
        )
    tables_b = tables
    units_by_no = {u.unit_no: u for u in units}
    _UNITS_LOCAL = units_by_no

    def run_units(batches):
        for batch in batches:
            for unit_no in batch.column(0).to_pylist():
                found = {"after": min_commit_lsn, "tables": {}} if acc is not None else None
                yield from events_to_batches(
                    _UNITS_LOCAL[unit_no], tables_b, schema, lenient, found
                )
                if acc is not None:
                    acc.add(found["tables"])

    # one partition per unit: spark.range puts exactly one id in each
    seeds = spark.range(0, len(units), 1, numPartitions=len(units)).selectExpr(
        f"element_at(array({','.join(str(u.unit_no) for u in units)}), int(id) + 1) AS unit"
    )
    events = seeds.mapInArrow(run_units, schema)
    return ChangeEvents(events, tables, units, skipped, acc, seeds, lenient, min_commit_lsn)
