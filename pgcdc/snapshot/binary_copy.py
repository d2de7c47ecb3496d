"""A snapshot range read in binary COPY and typed in C, straight into Arrow.

Each range is one ``SELECT`` run by the ADBC PostgreSQL driver (``adbc-driver-postgresql``:
libpq, ``COPY ... TO STDOUT (FORMAT binary)``, values decoded into Arrow buffers in C), inside
``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '<name>'``, and
streamed as record batches (the driver's batch size hint, 16 MiB by default), so memory per
task is a few batches whatever the range's size. No Python object is made per value on the
common path.

Every output value must equal what :mod:`pgcdc.spark.types` makes of the same value in a
change event (the text COPY path through :class:`pgcdc.values.RowLoader`). So each column gets
a *plan*:

- **native**: types whose Arrow form from the driver is already the Spark value (integers,
  floats, bool, strings, bytea, date, timestamps, ``numeric(p,s)`` within 38 digits, ``uuid``
  as its text, one-dimensional arrays of numbers, bool and strings), cast to the exact Arrow
  type Spark expects. Values such a column cannot hold (infinity or years outside 1..9999
  for dates and timestamps, NaN and infinity for numeric, arrays with more than one
  dimension or a lower bound other than 1) take the exact path below with their text, which
  comes from where it is cheapest: numeric, jsonb and integer arrays are read as their text
  (cast in Arrow), so those values are found in Arrow; dates and timestamps are read typed
  and checked in Arrow, and a range holding one out of range is read again with the
  *server's* predicate for that column (:class:`Recheck`), which gives the typed column NULL
  there and a second column the value's text; other arrays always have the server's
  predicate (the driver flattens dimensions). Those rows are rare: only they cost Python
  work.
- **exact**: every other type (time, interval, json, jsonb, inet, ranges, geometric types,
  arrays of them, enums, domains, ...): the value's text (its output function, as COPY's
  text format prints it) is loaded and converted per value by the change events' own
  loader and converter. Exact by construction, slower (a few microseconds per value).

The table of native types is :data:`NATIVE`; ``tests/snapshot/test_snapshot_types.py`` checks, on a
table of every built-in type, that this reader's batches equal the text path's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pgcdc.snapshot import server as pgsnap
from pgcdc.capture.walsender import PINNED_GUCS, quote_ident, quote_literal
from pgcdc.spark.types import Unrepresentable, spark_type, value_converter
from pgcdc.values import RowLoader

__all__ = [
    "NATIVE",
    "ColumnPlan",
    "RangeReader",
    "Recheck",
    "adbc_available",
    "column_plans",
    "open_adbc_snapshot_connection",
    "select_sql",
]

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID, XID = 16, 17, 19, 20, 21, 23, 25, 26, 28
FLOAT4, FLOAT8, BPCHAR, VARCHAR = 700, 701, 1042, 1043
DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1082, 1114, 1184, 1700, 2950, 3802

# arrays of these element types come natively (one dimension, lower bound 1)
_ARRAY_ELEMENTS = {
    1000: BOOL,
    1005: INT2,
    1007: INT4,
    1016: INT8,
    1021: FLOAT4,
    1022: FLOAT8,
    1009: TEXT,
    1015: VARCHAR,
    1014: BPCHAR,
    1003: NAME,
}

# type OID -> predicate (SQL, with {c} for the column) true for values the Spark type cannot
# hold, or "" for none. Everything here comes natively; every other type goes the exact path.
# The driver reads such values without error (infinity is a sentinel integer): the typed
# value is replaced by the exact path's, so the predicate is evaluated once per row.
NATIVE: dict[int, str] = {
    BOOL: "",
    INT2: "",
    INT4: "",
    INT8: "",
    OID: "",  # selected as int8 (the driver reads it as a signed int32)
    XID: "",  # selected as int8 through its text
    FLOAT4: "",
    FLOAT8: "",
    TEXT: "",
    VARCHAR: "",
    BPCHAR: "",
    NAME: "",
    BYTEA: "",
    UUID: "",  # its text: lower-case hex with dashes, as change events give it
    # selected as its text, made compact (see _compact_json); a top-level string or null
    # (text starting with '"', or 'null') loads, in change events too, as the string itself
    # or None: those rows are found here and go the exact path with that same text
    JSONB: "",
    # selected as its text (cast to decimal here); NaN and +-Infinity found here by it
    NUMERIC: "",
    DATE: "{c} < '0001-01-01'::date OR {c} > '9999-12-31'::date",
    TIMESTAMP: "{c} < '0001-01-01'::timestamp OR {c} >= '10000-01-01'::timestamp",
    TIMESTAMPTZ: "{c} < '0001-01-01 00:00:00+00'::timestamptz"
    " OR {c} >= '10000-01-01 00:00:00+00'::timestamptz",
}
# the driver cannot read these (a lower bound other than 0 or 1) or flattens them (more
# than one dimension): NULL in the typed column, the text beside it
_ARRAY_SPECIAL = "COALESCE(array_ndims({c}) <> 1 OR array_lower({c}, 1) <> 1, false)"
_NUMERIC_SPECIAL = ("NaN", "Infinity", "-Infinity")
# integer arrays are read as their text ('{1,NULL,3}'), parsed in Arrow: the driver's binary
# array reading costs more than array_out plus the parse, and the text shows the arrays
# Spark's type cannot hold ('[0:2]={...}', '{{...}}') without a predicate on the server
_INT_ARRAYS = {1005: INT2, 1007: INT4, 1016: INT8}
# the values Spark's date and timestamp types hold, as the driver's integers (days, and
# microseconds, since 1970; what the server's predicates in NATIVE let through): infinity
# and years past 294276 arrive wrapped around, far below the lower bound
_BOUNDS = {
    DATE: (-719_162, 2_932_896),  # 0001-01-01 .. 9999-12-31
    TIMESTAMP: (-62_135_596_800_000_000, 253_402_300_799_999_999),  # .. 9999-12-31 23:59:59.999999
    TIMESTAMPTZ: (-62_135_596_800_000_000, 253_402_300_799_999_999),
}


class Recheck(Exception):
    """A range held a value only the server's text describes (a date or timestamp out of
    Spark's range) in columns read without the server's predicate: read the range again
    with :meth:`RangeReader.checking` those columns."""

    def __init__(self, columns):
        super().__init__(f"values out of Spark's range in {sorted(columns)}: read again")
        self.columns = frozenset(columns)


def adbc_available() -> bool:
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class ColumnPlan:
    """How one column is selected and typed. ``native_sql``: the typed expression (None on
    the exact path); ``special_sql``: the text of values that take the exact path (None:
    no value does)."""

    name: str
    type_oid: int
    typmod: int
    native_sql: str | None
    special_sql: str | None
    # (low, high) the driver's integers must lie in, else :class:`Recheck` (dates and
    # timestamps read without the server's predicate)
    bounds: tuple[int, int] | None = None

    @property
    def exact(self) -> bool:
        return self.native_sql is None


def _text_sql(col: str) -> str:
    # format('%s') calls the type's output function, as COPY's text format does (a cast to
    # text may not: bool::text is 'true', inet::text always shows the mask, bpchar trims)
    # (num_nulls, not IS NOT NULL: a composite of NULLs IS NULL but is a value)
    return f"CASE WHEN num_nulls({col}) = 0 THEN format('%s', {col}) END"


def _is_native(oid: int, typmod: int) -> bool:
    from pyspark.sql.types import DecimalType

    if oid == NUMERIC:
        return isinstance(spark_type(oid, typmod), DecimalType)
    return oid in NATIVE or oid in _ARRAY_ELEMENTS


def column_plans(
    table: pgsnap.PublishedTable, *, exact_only: bool = False, checked=None
) -> list[ColumnPlan]:
    """``checked``: the date and timestamp columns whose out-of-range values the server
    finds (None: all of them, as a reader that cannot read a range again needs); the others
    are checked in Arrow (:class:`Recheck`)."""
    plans = []
    for c in table.columns:
        col = quote_ident(c.name)
        oid, mod = c.type_oid, c.type_modifier
        if exact_only or not _is_native(oid, mod):
            plans.append(ColumnPlan(c.name, oid, mod, None, _text_sql(col)))
            continue
        if oid in _BOUNDS and checked is not None and c.name not in checked:
            plans.append(ColumnPlan(c.name, oid, mod, col, None, _BOUNDS[oid]))
            continue
        if oid in _INT_ARRAYS:  # array_out: '{1,NULL,3}', '[0:1]={1,2}', '{{1},{2}}'
            plans.append(ColumnPlan(c.name, oid, mod, f"{col}::text", None))
            continue
        pred = _ARRAY_SPECIAL if oid in _ARRAY_ELEMENTS else NATIVE[oid]
        expr = {
            OID: f"{col}::int8",
            XID: f"{col}::text::int8",
            # jsonb's binary form is its text (after a version byte the driver drops)
            UUID: f"{col}::text",  # uuid_out on the server costs less than any client side
            NUMERIC: f"{col}::text",  # the driver's binary numeric -> text is the slower
        }.get(oid, col)
        if pred:
            p = pred.format(c=col)
            typed = f"CASE WHEN {p} THEN NULL ELSE {expr} END" if oid in _ARRAY_ELEMENTS else expr
            plans.append(
                ColumnPlan(c.name, oid, mod, typed, f"CASE WHEN {p} THEN format('%s', {col}) END")
            )
        else:
            plans.append(ColumnPlan(c.name, oid, mod, expr, None))
    return plans


def select_sql(rng: pgsnap.TableRange, plans: list[ColumnPlan]) -> str:
    """The range's SELECT with the plans' expressions (``n<i>`` typed, ``s<i>`` text)."""
    t = rng.table
    items = []
    for i, p in enumerate(plans):
        if p.native_sql is not None:
            items.append(f"{p.native_sql} AS n{i}")
        if p.special_sql is not None:
            items.append(f"{p.special_sql} AS s{i}")
    # the table's own SELECT gives FROM/WHERE (ONLY, ctid bounds, row filter)
    return t.select_sql(rng.lo_block, rng.hi_block, ", ".join(items) or "NULL")


class _Col:
    __slots__ = ("kind", "value")

    def __init__(self, value: bytes):
        self.kind = "t"
        self.value = value


_XID_ARRAY = 1011


def _ints(v):
    return [_ints(x) if isinstance(x, list) else (None if x is None else int(x)) for x in v]


def xid_fixes(type_oids) -> list:
    """(column, function) for the xid columns: their text loads as a str, their binary form
    (and Spark's LongType) is an int."""
    fixes = {XID: int, _XID_ARRAY: _ints}
    return [(i, fixes[o]) for i, o in enumerate(type_oids) if o in fixes]


class _Exact:
    """The change events' path for one column: text -> RowLoader -> value_converter."""

    def __init__(self, oid: int, typmod: int, catalog=None):
        if catalog is not None and oid >= pgsnap.FIRST_NORMAL_OID and catalog.describes(oid):
            self.load = RowLoader((oid,), catalog=catalog).load
        else:
            self.load = RowLoader((pgsnap.loader_oid(oid),)).load
        self.convert = value_converter(oid, typmod, catalog)
        # xid's text loader gives a str, its binary one (and Spark's LongType) an int
        self.fix = {XID: int, _XID_ARRAY: _ints}.get(oid)

    def __call__(self, text: str):
        """(typed value, side text or None)."""
        (value,) = self.load([_Col(text.encode())])
        if value is None:
            return None, None
        if self.fix is not None:
            value = self.fix(value)
        try:
            return self.convert(value), None
        except Unrepresentable as u:
            return None, u.text


class RangeReader:
    """Reads ranges of one table as Arrow batches of its snapshot schema (columns,
    ``_pg_text``, ``_commit_lsn``, ``_tx_ordinal``).

    ``checked``: the date and timestamp columns the server checks (None, the default: all).
    A reader whose caller can start a range over passes ``checked=()``: those columns are
    checked in Arrow, and a range holding a value out of Spark's range raises
    :class:`Recheck` (nothing of it is to be kept): read it again with
    :meth:`checking`."""

    def __init__(self, table: pgsnap.PublishedTable, arrow_schema, commit_lsn: int, **kw):
        self.table = table
        self.schema = arrow_schema
        self.commit_lsn = commit_lsn
        self.kw = kw
        self.checked = None if kw.get("checked") is None else frozenset(kw["checked"])
        self.plans = column_plans(
            table, exact_only=kw.get("exact_only", False), checked=self.checked
        )
        catalog = kw.get("catalog")
        self._exact = {
            i: _Exact(p.type_oid, p.typmod, catalog)
            for i, p in enumerate(self.plans)
            if p.special_sql is not None or p.type_oid in (JSONB, *_INT_ARRAYS)
        }

    def checking(self, columns) -> RangeReader:
        """This reader with the server checking ``columns`` too."""
        kw = dict(self.kw, checked=(self.checked or frozenset()) | frozenset(columns))
        return RangeReader(self.table, self.schema, self.commit_lsn, **kw)

    def read(
        self, dsn: str, snapshot_name: str, rng: pgsnap.TableRange, *, batch_bytes: int = 16 << 20
    ) -> Iterator:
        """RecordBatches of ``rng`` at the exported snapshot ``snapshot_name``, of about
        ``batch_bytes`` each (the driver's hint)."""
        conn = open_adbc_snapshot_connection(dsn, snapshot_name)
        try:
            cur = conn.cursor()
            try:
                cur.adbc_statement.set_options(
                    **{"adbc.postgresql.batch_size_hint_bytes": str(batch_bytes)}
                )
                cur.execute(select_sql(rng, self.plans))
                reader = cur.fetch_record_batch()
                for batch in reader:
                    if batch.num_rows:
                        yield self.convert(batch)
            finally:
                cur.close()
        finally:
            conn.close()

    def convert(self, batch):
        """One driver batch -> one batch of the snapshot schema."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        names = batch.schema.names
        arrays = []
        specials: dict[int, dict] = {}
        for i, p in enumerate(self.plans):
            target = self.schema.field(i).type
            arr = None
            if p.native_sql is not None:
                raw = batch.column(names.index(f"n{i}"))
                if p.type_oid == NUMERIC:
                    arr = self._numeric(pa, pc, raw, target, p.name, specials)
                elif p.type_oid == JSONB:
                    arr = self._jsonb(pa, pc, np, i, raw, specials)
                elif p.type_oid in _INT_ARRAYS:
                    arr = self._int_array(pa, pc, np, i, raw, target, specials)
                else:
                    if p.bounds is not None:
                        _check_bounds(pa, pc, raw, p)
                    arr = _to_type(pa, raw, target)
            if p.special_sql is not None:
                texts = batch.column(names.index(f"s{i}"))
                if texts.null_count < n:
                    arr = self._exact_values(pa, pc, np, i, p, texts, arr, target, specials)
                elif arr is None:
                    arr = pa.nulls(n, target)
            arrays.append(arr)
        map_type = self.schema.field(len(self.plans)).type
        if specials:
            side = [None] * n
            for row, d in specials.items():
                side[row] = list(d.items())
            arrays.append(pa.array(side, type=map_type))
        else:
            arrays.append(pa.nulls(n, map_type))
        lsn = pa.array(np.full(n, self.commit_lsn, dtype=np.int64))
        arrays.append(lsn)
        arrays.append(pa.array(np.zeros(n, dtype=np.int64)))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _numeric(self, pa, pc, raw, target, name, specials):
        """numeric(p,s) from its text; NaN and infinities into the side map (as the
        converter says them: 'NaN', 'Infinity', '-Infinity', the server's text too)."""
        if isinstance(raw.type, pa.BaseExtensionType):
            raw = raw.storage
        mask = pc.is_in(raw, value_set=pa.array(_NUMERIC_SPECIAL))
        if pc.any(mask).as_py():
            rows = _true_rows(mask)
            for row, text in zip(rows.tolist(), raw.take(pa.array(rows)).to_pylist()):
                specials.setdefault(row, {})[name] = text
            raw = pc.if_else(mask, pa.scalar(None, raw.type), raw)
        return raw.cast(target)

    def _jsonb(self, pa, pc, np, i, raw, specials):
        """jsonb text made compact; top-level strings and nulls through the exact path."""
        if isinstance(raw.type, pa.BaseExtensionType):
            raw = raw.storage
        raw = raw.cast(pa.string())
        arr = _compact_json(pa, np, raw)
        mask = pc.or_(pc.starts_with(raw, '"'), pc.equal(raw, "null"))
        if pc.any(mask).as_py():
            texts = pc.if_else(mask, raw, pa.scalar(None, pa.string()))
            arr = self._exact_values(
                pa, pc, np, i, self.plans[i], texts, arr, pa.string(), specials
            )
        return arr

    def _int_array(self, pa, pc, np, i, raw, target, specials):
        """An integer array's text ('{1,NULL,3}', '{}') split and cast in Arrow; arrays of
        more than one dimension or another lower bound ('{{...}}', '[0:1]={...}') through
        the exact path with that text."""
        if isinstance(raw.type, pa.BaseExtensionType):
            raw = raw.storage
        raw = raw.cast(pa.string())
        special = pc.or_(pc.starts_with(raw, "["), pc.starts_with(raw, "{{"))
        texts = None
        if pc.any(special).as_py():
            texts = pc.if_else(special, raw, pa.scalar(None, pa.string()))
            raw = pc.if_else(special, pa.scalar(None, pa.string()), raw)
        body = pc.utf8_slice_codeunits(raw, 1, -1)  # no braces
        # '{}' -> no element (split would give one empty string)
        body = pc.if_else(pc.equal(body, ""), pa.scalar(None, pa.string()), body)
        parts = pc.split_pattern(body, ",")
        if isinstance(parts, pa.ChunkedArray):
            parts = parts.combine_chunks()
        flat = parts.flatten()
        elems = pc.if_else(pc.equal(flat, "NULL"), pa.scalar(None, pa.string()), flat)
        elems = elems.cast(target.value_type)
        arr = pa.ListArray.from_arrays(parts.offsets, elems, mask=pc.is_null(raw))
        arr = arr.cast(target)
        if texts is not None:
            arr = self._exact_values(pa, pc, np, i, self.plans[i], texts, arr, target, specials)
        return arr

    def _exact_values(self, pa, pc, np, i, plan, texts, arr, target, specials):
        exact = self._exact[i]
        name = plan.name
        if arr is None:  # every value through the exact path
            values = []
            append = values.append
            for row, text in enumerate(texts.to_pylist()):
                if text is None:
                    append(None)
                    continue
                v, side = exact(text)
                append(v)
                if side is not None:
                    specials.setdefault(row, {})[name] = side
            return pa.array(values, type=target)
        # only the rows the server flagged
        rows = _true_rows(texts.is_valid())
        found = texts.take(pa.array(rows)).to_pylist()
        typed = []
        for row, text in zip(rows.tolist(), found):
            v, side = exact(text)
            typed.append(v)
            if side is not None:
                specials.setdefault(row, {})[name] = side
        if len(rows):  # the typed value read there may be a sentinel (infinity): replaced
            index = np.arange(len(arr), dtype=np.int64)
            index[rows] = len(arr) + np.arange(len(rows))
            merged = pa.concat_arrays([arr, pa.array(typed, type=arr.type)])
            arr = merged.take(pa.array(index))
        return arr


def _check_bounds(pa, pc, raw, plan) -> None:
    """:class:`Recheck` when a date or timestamp lies outside ``plan.bounds``."""
    if isinstance(raw.type, pa.BaseExtensionType):
        raw = raw.storage
    if raw.null_count == len(raw):
        return
    ints = raw.view(pa.int32() if pa.types.is_date32(raw.type) else pa.int64())
    mm = pc.min_max(ints)
    lo, hi = plan.bounds
    if mm["min"].as_py() < lo or mm["max"].as_py() > hi:
        raise Recheck([plan.name])


def _true_rows(mask):
    import numpy as np

    return np.flatnonzero(mask.fill_null(False).to_numpy(zero_copy_only=False))


def _compact_json(pa, np, arr):
    """jsonb text -> the compact JSON change events give (orjson's, same escapes and digits).

    jsonb's output puts exactly one space after each ',' and ':' that separate items, and no
    other space outside strings; inside strings a ', ' or ': ' is data. So a space goes when
    it follows a ',' or ':' outside a string: whether a position is inside a string is the
    parity of the unescaped quotes before it. Vectorised over the whole data buffer (every
    document closes its strings, so the parity does not carry from one to the next)."""
    if arr.offset:
        arr = pa.concat_arrays([arr])  # buffers from 0
    if len(arr) == 0:
        return arr
    validity, offs_buf, data_buf = arr.buffers()
    offs = np.frombuffer(offs_buf, dtype=np.int32, count=len(arr) + 1)
    start, end = int(offs[0]), int(offs[-1])
    if end == start:
        return arr
    buf = np.frombuffer(data_buf, dtype=np.uint8, count=end - start, offset=start)
    after = buf[:-1]
    cand = np.flatnonzero((buf[1:] == 32) & ((after == 44) | (after == 58))) + 1
    if not len(cand):
        return arr
    quotes = (buf == 34).view(np.uint8)
    escaped = np.flatnonzero(quotes[1:] & (after == 92)) + 1
    if len(escaped):  # a quote after an odd run of backslashes is data
        backslash = buf == 92
        runs = np.flatnonzero(backslash & np.concatenate(([True], ~backslash[:-1])))
        run = escaped - runs[np.searchsorted(runs, escaped - 1, side="right") - 1]
        quotes[escaped[run % 2 == 1]] = 0
    # 1 inside a string: the parity of the quotes up to each position
    inside = np.bitwise_xor.accumulate(quotes)[cand - 1]
    drop = cand[inside == 0]
    if not len(drop):
        return arr
    rel = offs.astype(np.int64) - start
    new_offs = (rel - np.searchsorted(drop, rel, side="left")).astype(np.int32)
    return pa.StringArray.from_buffers(
        len(arr),
        pa.py_buffer(new_offs),
        pa.py_buffer(np.delete(buf, drop)),
        validity,
        arr.null_count,
    )


def _to_type(pa, arr, target):
    """A driver column as exactly ``target`` (opaque/extension types by their storage)."""
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if arr.type == target:
        return arr
    return arr.cast(target)


def open_adbc_snapshot_connection(dsn: str, snapshot_name: str):
    """An ADBC (dbapi) connection inside ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``
    at the exported snapshot, with the session settings text values assume."""
    import adbc_driver_postgresql.dbapi as adbc

    conn = adbc.connect(dsn, autocommit=True)
    try:
        cur = conn.cursor()
        try:
            cur.execute(f"SET application_name = {quote_literal('pgcdc snapshot')}")
            for name, value in PINNED_GUCS.items():
                cur.execute(f"SET {name} = {quote_literal(value)}")
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute(f"SET TRANSACTION SNAPSHOT {quote_literal(snapshot_name)}")
        finally:
            cur.close()
    except Exception as e:
        conn.close()
        raise pgsnap.SnapshotError(
            f"cannot import snapshot {snapshot_name!r}: {str(e).strip()} (the exporting "
            "replication connection must stay open and idle until every reader has started)"
        ) from None
    return conn
