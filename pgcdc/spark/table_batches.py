"""Arrow batches of the Spark change events: a table's events, column by column.

The events of a unit (:func:`pgcdc.spark.changes.unit_events`) go into one
:class:`TableBuffer` per table and come out as RecordBatches of the wide schema
(:func:`event_schema`: the common columns, then one ``t<n>`` struct column per table holding
``before`` and ``after``), built a column at a time (:func:`events_batch`). A value Spark
cannot hold in its column's type goes to the ``_pg_text`` map of its row
(:mod:`pgcdc.spark.types`). :func:`batch_stats` and :class:`EventStats` gather, as the
batches go, what apply needs to know of them. :mod:`pgcdc.apply.ops` builds its batches of
operations from the same buffers and image columns.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import itemgetter
from typing import TYPE_CHECKING

from pgcdc.lsn import MAX_LSN, format_lsn
from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.spark import types as pgtypes
from pgcdc.spark.text_arrow import text_array

if TYPE_CHECKING:
    from pgcdc.spark.units import TableSchema

__all__ = [
    "BATCH_ROWS",
    "EVENT_FIELDS",
    "EventStats",
    "TableBuffer",
    "arrow_type",
    "batch_stats",
    "event_schema",
    "events_batch",
    "image_columns",
    "lsn_texts",
    "table_column",
]

BATCH_ROWS = 8192


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


class TableBuffer:
    """Events of one table, column by column, until a batch is full."""

    def __init__(self, ts: TableSchema, number: int, struct_type, fill_defaults: bool = False):
        self.ts = ts
        # apply's: an image of a version before a column was added with a DEFAULT holds that
        # default, as the server's row does (attmissingval); the change events keep it null
        self.fills = ts.default_loaded() if fill_defaults else {}
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
                    convs.append(pgtypes.value_converter(oid, mod, self.ts.catalog))
            p = self.plans[id(rel)] = (rel, pos, convs)
        return p

    def positions(self, rel, is_key: bool) -> list:
        """Where the values of an image of ``rel`` go (the key columns only if ``is_key``)."""
        if is_key:
            return [self.names.index(x) for x in rel.key_names]
        return self.plan_for(rel)[1]


def image_columns(buf: TableBuffer, images, rels, keyed, which: str):
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
    for name, value in buf.fills.items():
        j = buf.names.index(name)
        for r in range(n):
            if present[r] and name not in rels[r].names and not (which == "before" and keyed[r]):
                if columns[j] is None:
                    columns[j] = [None] * n
                columns[j][r] = value
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


def same_layout(rel, other) -> bool:
    """Whether two relation versions put the same types in the same places."""
    return (rel.names, rel.type_oids, rel.type_modifiers, rel.key_names) == (
        other.names,
        other.type_oids,
        other.type_modifiers,
        other.key_names,
    )


def text_image(buf, rel, is_key: bool, kinds: list, values: list):
    """Images of ``rel`` (the key columns only if ``is_key``) as :func:`image_columns` makes
    them, from their columns' kinds and raw values (flattened row after row, as
    :class:`pgcdc.events.reader.RawRun` holds them), each column typed from its text by Arrow
    (:mod:`.text_arrow`), no value loaded in Python. None unless every column is text or
    NULL and takes that path, and no default is to be filled in: the caller loads them."""
    import pyarrow as pa

    if is_key:
        at = rel.key_indexes
    else:
        at = range(len(rel.names))
        if any(name not in rel.names for name in buf.fills):
            return None  # a default filled in
    pos = buf.positions(rel, is_key)
    w = len(rel.names)  # a key image too holds every column (the others NULL)
    n = len(kinds) // w if w else 0
    if not pos or n * w != len(kinds) or any(buf.names[p] in buf.ts.conflicts for p in pos):
        return None
    fields = list(buf.cols_type)
    arrays = [None] * len(buf.names)
    for p, i in zip(pos, at):
        column_kinds = kinds[i::w]
        if column_kinds.count("t") + column_kinds.count("n") != n:
            return None  # binary, unchanged TOAST
        arr = text_array(values[i::w], rel.type_oids[i], rel.type_modifiers[i], fields[p].type)
        if arr is None:
            return None
        arrays[p] = arr
    for j, arr in enumerate(arrays):
        if arr is None:
            arrays[j] = pa.nulls(n, fields[j].type)
    return pa.StructArray.from_arrays([*arrays, pa.nulls(n, fields[-1].type)], fields=fields)


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
    if name not in rel.names:  # a default filled in (see TableBuffer.fills)
        return buf.ts.converter(name)
    return convs[rel.names.index(name)]


def lsn_texts(lsns):
    """Arrow strings of LSNs as PostgreSQL prints them (:func:`pgcdc.lsn.format_lsn`), made
    a column at a time by decode_messages' own LSN text; a value repeated along the column (a
    commit LSN) is made once."""
    import numpy as np
    import pyarrow as pa

    from pgcdc.runtime.spark.arrow import _lsn_text  # lazy: pyarrow

    if not lsns or None in lsns or min(lsns) < 0 or max(lsns) > MAX_LSN:
        return pa.array([None if x is None else format_lsn(x) for x in lsns], pa.string())
    a = np.array(lsns, dtype=np.uint64)
    values, where = np.unique(a, return_inverse=True)
    if 2 * len(values) <= len(a):
        return _lsn_text(pa.array(values)).take(pa.array(where.ravel()))
    return _lsn_text(pa.array(a))


_TABLE_OPS = frozenset("cudt")
EVENT_FIELDS = (
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
)  # pgcdc.events.reader.Event's, in order (checked by the tests)


def events_batch(buf: TableBuffer, events, schema):
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
    ) = [list(map(itemgetter(i), events)) for i in range(len(EVENT_FIELDS))]
    before = image_columns(buf, befores, rels, keyed, "before")
    after = image_columns(buf, afters, rels, keyed, "after")
    commit_time = pc.add_checked(pa.array(times, pa.int64()), PG_EPOCH_UNIX_US).cast(
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
    tx_ordinal), "truncate": the last truncate's or None, "unchanged": {column names},
    "errors": {(lsn, message)} (lenient: values kept raw; at most ERRORS_KEPT)}}`` over the
    events committed after ``min_commit_lsn``. Merging is idempotent, so a task
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
                if s.get("errors"):
                    into[table]["errors"] = set(s["errors"])
                continue
            mine["last"] = max(mine["last"], s["last"])
            if s["truncate"] is not None:
                mine["truncate"] = max(mine["truncate"] or s["truncate"], s["truncate"])
            mine["unchanged"] |= s["unchanged"]
            if s.get("errors"):
                mine["errors"] = _first_errors(mine.get("errors", set()) | s["errors"])
        return into


#: lenient runs: the errors kept per table (the first ones in stream order), so that a
#: run with many bad values says how many at least, and where the first are
ERRORS_KEPT = 1000


def _first_errors(errors: set) -> set:
    """The ERRORS_KEPT first ``(lsn, message)`` errors: the same whatever the merge order."""
    return errors if len(errors) <= ERRORS_KEPT else set(sorted(errors)[:ERRORS_KEPT])
