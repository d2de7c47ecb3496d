"""The rows of ``format("pgcdc")`` and ``format("pgcdc_capture")``: the event schema
(:func:`event_schema`, :data:`EVENT_COLUMNS`) and change events made Arrow RecordBatches of it
(:func:`events_batch`), column by column: the JSON images of runs of events of one table and
shape rendered a column at a time, as :func:`pgcdc.values.dumps_images` renders them one by
one. :class:`Batches` cuts the rows into batches of a size, in stream order.

Importing this module needs neither pyspark nor pyarrow; its functions import them.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from functools import partial
from itertools import repeat
from operator import is_not, itemgetter

from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.streaming.json_runs import quoted_strings
from pgcdc.streaming.typed import truncate_detail
from pgcdc.values import _json as value_json
from pgcdc.values import dumps, dumps_images
from pgcdc.values._pgtext import REPR_EXACT

__all__ = ["EVENT_COLUMNS", "RAW_RUN_ROWS", "Batches", "arrow_schema", "event_schema",
           "events_batch"]  # fmt: skip

EVENT_COLUMNS = (
    ("op", "string"),
    ("schema", "string"),
    ("table", "string"),
    ("before_json", "string"),
    ("after_json", "string"),
    ("unchanged", "array<string>"),
    ("detail_json", "string"),
    ("lsn", "long"),
    ("commit_lsn", "long"),
    ("tx_ordinal", "long"),
    ("commit_time", "timestamp"),
    ("xid", "long"),
    ("errors", "array<string>"),
)


def event_schema():
    """The source's Spark schema (a StructType of :data:`EVENT_COLUMNS`)."""
    from pyspark.sql import types as T  # lazy: pyspark

    simple = {"string": T.StringType(), "long": T.LongType(), "timestamp": T.TimestampType()}
    fields = [
        T.StructField(
            name,
            T.ArrayType(T.StringType(), True) if kind == "array<string>" else simple[kind],
            True,
        )
        for name, kind in EVENT_COLUMNS
    ]
    return T.StructType(fields)


_SCHEMA = None


def arrow_schema():
    global _SCHEMA
    if _SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema  # lazy: pyspark

        _SCHEMA = to_arrow_schema(event_schema(), timezone="UTC")
    return _SCHEMA


RAW_RUN_ROWS = 64  # a shorter raw run is loaded as events: a batch of its own costs more


class Batches:
    """RecordBatches of ``batch_rows`` rows (the last one fewer) in stream order, from lists
    of events (made a batch by ``make``) and batches made already (raw runs)."""

    def __init__(self, make, batch_rows: int):
        self.make, self.batch_rows = make, batch_rows
        self.rows: list = []  # events not made yet, after every batch in `made`
        self.made: list = []  # RecordBatches, fewer than batch_rows rows in all
        self.count = 0  # rows in made

    def add_events(self, events: list):
        rows = self.rows
        rows += events
        while self.count + len(rows) >= self.batch_rows:
            take = self.batch_rows - self.count
            self.made.append(self.make(rows[:take]))
            del rows[:take]
            yield self._emit()

    def add_batch(self, batch):
        self._make_rows()
        self.made.append(batch)
        self.count += batch.num_rows
        while self.count >= self.batch_rows:
            yield self._emit()

    def finish(self):
        self._make_rows()
        if self.count:
            yield self._emit()

    def _make_rows(self) -> None:
        """The events not made yet, made a batch after the others (order kept)."""
        if self.rows:
            self.made.append(self.make(self.rows))
            self.count += len(self.rows)
            self.rows = []

    def _emit(self):
        """One batch of the first batch_rows rows made (or all of them), the rest kept."""
        import pyarrow as pa

        if len(self.made) == 1 and self.count <= self.batch_rows:
            (batch,), self.made, self.count = self.made, [], 0
            return batch
        table = pa.Table.from_batches(self.made)
        head, rest = table.slice(0, self.batch_rows), table.slice(self.batch_rows)
        self.made = rest.to_batches() if rest.num_rows else []
        self.count = rest.num_rows
        return head.combine_chunks().to_batches()[0]


def events_batch(events: list):
    """The RecordBatch of :func:`event_schema` for ``events`` (change events, and logical
    messages), column by column: JSON images rendered a column at a time for runs of
    events of one table and shape (:func:`_image_column`), as :func:`pgcdc.values.dumps_images`
    renders them one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    if not events:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in schema], schema=schema
        )
    # the events' fields as lists (zip(*events) takes longer)
    columns = [list(map(itemgetter(i), events)) for i in range(len(events[0]))]
    (ops, rels, _, _, unchanged, lsns, commits, ordinals, times, xids, _, _, details,
     errors) = columns  # fmt: skip
    n = len(events)
    schemas = [None if r is None else r.schema for r in rels]
    tables = [None if r is None else r.table for r in rels]
    before, after = _image_column(events, columns, pa, pc)
    detail = [None] * n
    for i, op in enumerate(ops):
        if op == "t" or op == "m":
            detail[i] = _detail(events[i])
    stamp = pa.array(times, type=pa.int64())
    if stamp.null_count < n:
        stamp = pc.add(stamp, PG_EPOCH_UNIX_US)
    arrays = [
        pa.array(ops, type=pa.string()),
        pa.array(schemas, type=pa.string()),
        pa.array(tables, type=pa.string()),
        before,
        after,
        pa.array(unchanged, type=schema.field(5).type),
        pa.array(detail, type=pa.string()),
        pa.array(lsns, type=pa.int64()),
        pa.array(commits, type=pa.int64()),
        pa.array(ordinals, type=pa.int64()),
        stamp.cast(schema.field(10).type),
        pa.array(xids, type=pa.int64()),
        pa.array([[str(e) for e in x] if x else None for x in errors], type=schema.field(12).type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_BULK_RUN = 16  # shorter runs of one shape are rendered event by event


def _image_column(events: list, columns, pa, pc):
    """``before_json`` and ``after_json`` of ``events`` (``columns``: the events
    transposed) as Arrow string arrays."""
    ops = columns[0]
    before_parts, after_parts = [], []
    for lo, hi in _shape_runs(columns):
        run = events[lo:hi]
        op, partial_row = ops[lo], bool(columns[4][lo])
        bulk = None
        whole = op in ("c", "u", "d") and not partial_row and run[0].relation is not None
        if whole and len(run) >= _BULK_RUN:
            try:
                bulk = _bulk_images(run, pa, pc)
            except Exception:  # the event by event path says what is wrong, or agrees
                bulk = None
        if bulk is None:
            images = [dumps_images(ev) for ev in run]
            bulk = (
                pa.array([b for b, _ in images], type=pa.binary()),
                pa.array([a for _, a in images], type=pa.binary()),
            )
        before_parts.append(bulk[0])
        after_parts.append(bulk[1])
    return tuple(
        (pa.concat_arrays(parts) if len(parts) > 1 else parts[0]).cast(pa.string())
        for parts in (before_parts, after_parts)
    )


def _shape_runs(columns) -> list[tuple[int, int]]:
    """(start, end) of each run of events of one shape: relation, op, whether ``before`` is
    the key, unchanged columns or not, ``before`` and ``after`` present or not. Found with
    numpy, a column at a time (a Python groupby over each event's shape took a seventh of a
    batch)."""
    import numpy as np

    ops, rels, befores, afters, unchanged = columns[:5]
    n = len(ops)
    if n == 0:
        return []
    change = np.zeros(n, bool)
    for values in (
        np.fromiter(map(id, rels), np.int64, n),
        np.frombuffer("".join(ops).encode(), np.uint8) if sum(map(len, ops)) == n else None,
        np.fromiter(map(bool, columns[11]), bool, n),
        np.fromiter(map(bool, unchanged), bool, n),
        np.fromiter(map(is_not, befores, repeat(None)), bool, n),
        np.fromiter(map(is_not, afters, repeat(None)), bool, n),
    ):
        if values is None:  # an op of more than one letter (begin, end): by each op
            values = np.unique(np.asarray(ops, dtype=object), return_inverse=True)[1]
        change[1:] |= values[1:] != values[:-1]
    cuts = [0, *np.flatnonzero(change).tolist(), n]
    return list(zip(cuts, cuts[1:]))


def _bulk_images(run: list, pa, pc):
    rel = run[0].relation
    ev = run[0]
    n = len(run)
    if ev.before is None:
        before = pa.nulls(n, type=pa.binary())
    elif ev.before_is_key:
        before = _json_objects([e.before for e in run], rel.key_names, rel.key_type_oids, pa, pc)
    else:
        before = _json_objects([e.before for e in run], rel.names, rel.value_type_oids, pa, pc)
    if ev.after is None:
        after = pa.nulls(n, type=pa.binary())
    else:
        after = _json_objects([e.after for e in run], rel.names, rel.value_type_oids, pa, pc)
    return before, after


def _json_objects(rows: list, names, type_oids, pa, pc):
    """``dumps_row(names, row, type_oids)`` of every row, as a binary array: each column's
    values rendered by themselves (:func:`_fragments`), then joined with the keys row by
    row in Arrow (orjson writes a value the same inside an object as alone)."""
    import orjson

    columns = list(zip(*rows))
    if len(columns) != len(names):
        raise ValueError("a row of another length")
    renders = dict(value_json._plan(type_oids))
    parts = []
    for j, (name, values) in enumerate(zip(names, columns)):
        render = renders.get(j)
        if render in (value_json._float, value_json._float4) and _plain_floats(values, pa, pc):
            render = None  # orjson writes these as to_jsonb does
        if render is not None:
            values = [None if v is None else render(v) for v in values]
        key = (b"{" if j == 0 else b",") + orjson.dumps(name) + b":"
        parts.append(pa.scalar(key, type=pa.binary()))
        parts.append(_fragments(values, pa, pc))
    if not parts:
        return pa.array([b"{}"] * len(rows), type=pa.binary())
    parts.append(pa.scalar(b"}", type=pa.binary()))
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", type=pa.binary()))


def _plain_floats(values, pa, pc) -> bool:
    """Whether every float is finite and below 2**53 (where repr's digits are float8out's)."""
    try:
        floats = pa.array(values, type=pa.float64())
        plain = pc.and_(pc.is_finite(floats), pc.less(pc.abs(floats), REPR_EXACT))
        return pc.all(plain).as_py() is not False
    except (pa.ArrowException, TypeError):
        return False


def _fragments(values, pa, pc):
    """The JSON of each value, as :func:`pgcdc.values.dumps` writes it, as a binary array.
    A column of one type (NULLs aside) is done in Arrow: integers, strings (those holding a
    character orjson escapes dumped one by one), finite Decimals, datetimes of years 1000 to
    9999; any other in one ``dumps`` of the whole column split at its commas, when no value
    holds one; else a value at a time."""
    import orjson

    dump = partial(orjson.dumps, default=value_json._orjson_default, option=value_json._OPTIONS)
    kinds = set(map(type, values))
    kinds.discard(type(None))
    kind = kinds.pop() if len(kinds) == 1 else None
    null = pa.scalar(b"null", type=pa.binary())
    try:
        if kind is int:
            texts = pa.array(values, type=pa.int64()).cast(pa.string())
            return texts.cast(pa.binary()).fill_null(null)
        if kind is str:
            texts = pa.array(values, type=pa.string())
            return quoted_strings(texts, pa, pc).cast(pa.binary()).fill_null(null)
        if kind is Decimal:  # the default hook writes a finite one as format(d, "f")
            texts = [None if d is None else format(d, "f") for d in values]
            texts = pa.array(texts, type=pa.string())
            if not pc.any(pc.match_substring_regex(texts, "[^-0-9.]")).as_py():
                return texts.cast(pa.binary()).fill_null(null)
        elif kind is datetime:
            return _datetime_texts(values, pa, pc).fill_null(null)
    except (pa.ArrowException, OverflowError, _NotVectorised):
        pass
    if values:
        parts = dump(list(values))[1:-1].split(b",")
        if len(parts) == len(values):  # no value's JSON holds a comma: these are the values
            return pa.array(parts, type=pa.binary())
    return pa.array(list(map(dump, values)), type=pa.binary())


class _NotVectorised(Exception):
    pass


def _datetime_texts(values, pa, pc):
    """``xsd_datetime`` of each datetime, quoted: ISO 8601, the fraction without trailing
    zeros, an aware one in UTC (``+00:00``)."""
    aware = next(v for v in values if v is not None).tzinfo is not None
    if any((v.tzinfo is None) == aware for v in values if v is not None):
        raise _NotVectorised  # aware and naive mixed
    stamps = pa.array(values, type=pa.timestamp("us", tz="UTC" if aware else None))
    stamps = stamps.cast(pa.timestamp("us"))  # an aware one as its UTC time
    years = pc.year(stamps)
    if pc.min(years).as_py() < 1000 or pc.max(years).as_py() > 9999:
        raise _NotVectorised
    texts = stamps.cast(pa.string())  # 2024-01-01 00:00:01.500000
    texts = pc.replace_substring(texts, " ", "T", max_replacements=1)
    texts = pc.replace_substring_regex(texts, r"\.?0+$", "")  # trailing zeros of the fraction
    tail = '+00:00"' if aware else '"'
    return pc.binary_join_element_wise('"', texts, tail, "").cast(pa.binary())


def _detail(ev) -> str | None:
    if ev.op == "t":
        return truncate_detail(ev)
    prefix, content, transactional = ev.detail
    return _json(
        {"prefix": prefix, "content": "\\x" + bytes(content).hex(), "transactional": transactional}
    )


def _text(data) -> str | None:
    if data is None:
        return None
    return data.decode() if isinstance(data, (bytes, bytearray)) else data


def _json(obj) -> str:
    return _text(dumps(obj))
