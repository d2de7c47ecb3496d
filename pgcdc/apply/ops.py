"""What apply reads of the change events: flat per-key operations, built by the event tasks.

The wide change-event DataFrame (:mod:`pgcdc.spark.changes`) nests each table's ``before``
and ``after`` in a struct per table and carries the source block; apply needs neither, and
the JVM's cost of turning nested Arrow into rows was most of its time. So the tasks that read
the units also turn each table's events into *operations*, one flat row each:

- an **upsert** (``_upsert`` true, ``_sub`` 1): the ``after`` image of an insert or update;
- a **delete** (``_upsert`` false, ``_sub`` 0): the ``before`` image of a delete, of an update
  that moved its row to another key, and (tables without a key) of every update, whose old row
  leaves the multiset. ``_bad`` marks one without the old row it needs (no key to match by).

Each row has ``_t`` (the table's number in :attr:`ChangeEvents.tables` order), the change's
``_commit_lsn``, ``_tx_ordinal`` and ``_commit_time``, ``_unchanged`` (unchanged TOAST columns),
``_moved`` (an upsert whose update changed the key), and the table's columns ``_c<t>_<j>`` (in
``TableSchema.names`` order, then ``_s<t>``: its ``_pg_text`` map); other tables' are null.

``reduce`` (SCD1): a unit keeps, per key, only the operation ordered last among its own, unless
the unit has an upsert of that table with unchanged TOAST columns. Dropping the others changes
nothing apply computes: the latest operation per key wins; a truncate or a snapshot's position
only drops operations before a point, and the last one of a key is after every dropped one; and
a later 'u' column looks back for the latest known value, which the kept row (not 'u') holds.

Runs of changes come raw (:class:`pgcdc.events.reader.RawRun`: decoded, values not loaded) when
``reduce``: their key columns' raw bytes are grouped in Arrow when the unit drains, and only
each key's last change is loaded. Equal raw bytes of one key type and one format (text or
binary) are equal values; raw keys and loaded ones are kept apart, so nothing Spark keeps
apart is combined, only some equal keys are not (Spark's window then does it). A value that
does not load fails the unit, with the message path's error, when its change is kept; one in
a change that a later change of its key replaces within the unit is never loaded.
"""

from __future__ import annotations

from itertools import chain, compress, groupby, repeat
from operator import attrgetter, is_not, itemgetter

from pgcdc.events.reader import RawRun
from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.tablekey import table_key
from pgcdc.spark import types as pgtypes
from pgcdc.spark.table_batches import (
    BATCH_ROWS,
    EventStats,
    TableBuffer,
    arrow_type,
    image_columns,
    same_layout,
    text_image,
)
from pgcdc.spark.changes import unit_parts
from pgcdc.events.gcpause import paused

__all__ = ["change_ops", "ops_schema", "ops_to_batches", "value_column", "special_column"]

HELD_ROWS = 262_144  # a unit's operations of a table reduced so far once there are more
HELD_RAW = 1 << 21  # changes in raw runs held before they are combined
HELD_BYTES = 32 << 20  # ... or the bytes their values hold

_FIXED = (
    ("_t", "int"),
    ("_upsert", "boolean"),
    ("_sub", "int"),
    ("_moved", "boolean"),
    ("_bad", "boolean"),
    ("_commit_lsn", "long"),
    ("_tx_ordinal", "long"),
    ("_commit_time", "timestamp"),
    ("_unchanged", "array<string>"),
)


def value_column(number: int, j: int) -> str:
    """The flat column of table ``number``'s ``j``-th column (``TableSchema.names``)."""
    return f"_c{number}_{j}"


def special_column(number: int) -> str:
    return f"_s{number}"


def ops_schema(tables: dict, kind: str = "spark"):
    """The schema of the operations of ``tables`` ({qualified: TableSchema}): Spark's
    StructType, or (kind "arrow") the Arrow struct Spark exchanges for it."""
    T = pgtypes.type_namespace(kind)
    fixed = {
        "int": T.IntegerType(),
        "boolean": T.BooleanType(),
        "long": T.LongType(),
        "timestamp": T.TimestampType(),
        "array<string>": T.ArrayType(T.StringType()),
    }
    fields = [T.StructField(n, fixed[t], True) for n, t in _FIXED]
    for i, ts in enumerate(tables.values()):
        *values, side = ts.column_types(kind)
        fields += [T.StructField(value_column(i, j), t, True) for j, t in enumerate(values)]
        fields.append(T.StructField(special_column(i), side, True))
    return T.StructType(fields)


def ops_arrow_schema(tables: dict):
    """:func:`ops_schema` as an Arrow schema, without Spark: the driver's own cycles use it."""
    import pyarrow as pa

    return pa.schema(list(ops_schema(tables, "arrow")))


class _TableOps:
    """One table's operations of one unit, a batch of events at a time."""

    def __init__(self, ts, number: int, arrow_schema, keys, reduce: bool):
        import pyarrow as pa

        self.ts = ts
        self.number = number
        first = arrow_schema.get_field_index(value_column(number, 0) if ts.names else "")
        if first < 0:
            first = arrow_schema.get_field_index(special_column(number))
        self.first = first  # where this table's columns start in the schema
        width = len(ts.names) + 1
        cols_type = pa.struct(list(arrow_schema)[first : first + width])
        renamed = pa.struct(
            [
                pa.field(n, cols_type.field(j).type)
                for j, n in enumerate([*ts.names, pgtypes.SPECIAL_COLUMN])
            ]
        )
        self.buf = TableBuffer(ts, number, renamed, fill_defaults=True)
        self.schema = arrow_schema
        self.keys = [ts.names.index(k) for k in keys] if keys else None
        self.reduce = reduce and self.keys is not None
        self.events: list = []
        self.parts: list = []  # RecordBatches of operations
        self.has_unchanged = False
        self.key_names = list(keys) if keys else []
        self.last: dict = {}  # reducing: key -> (sequence number, its last change)
        # ... and the changes still in raw runs, combined by their raw keys when drained:
        # apart from `last`, as a raw key and a loaded value are not comparable (bytea)
        self.runs: list = []
        self.raw_cols: list = []  # each run's key columns' raw values
        self.run_starts: list[int] = []  # each run's first sequence number
        self.raw_count = 0  # changes in self.runs
        self.raw_sig = None  # (key column types, format) of the raw keys held
        self.raw_where: dict = {}  # id(relation version) -> (it, key positions, types)
        self.held = 0  # about the bytes the raw runs hold
        self.seq = 0
        self.drains = 0
        self.where: dict = {}  # id(relation version) -> (it, key positions)

    def add(self, events, unchanged: bool) -> None:
        """Add a run of events of this table (``unchanged``: one has 'u' columns)."""
        if self.reduce and not self.has_unchanged:
            if not unchanged:
                self._remember(events)
                return
            # a 'u' column looks back at earlier changes of its key: from here on, every
            # change goes to Spark (what was combined before stays combined: sound)
            self._drain()
            self.has_unchanged = True
        self.events.extend(events)
        if len(self.events) >= BATCH_ROWS:
            self.flush()

    def add_run(self, run) -> None:
        """Add a :class:`~pgcdc.events.reader.RawRun` of this table: when combining, by its raw
        keys (grouped in Arrow when drained), loading only the changes kept; else its
        events."""
        if not self.reduce or self.has_unchanged:
            self.add(run.events(), False)
            return
        rel = run.rel
        w = self.raw_where.get(id(rel))
        if w is None or w[0] is not rel:
            names = rel.names
            positions = types = None
            if all(k in names for k in self.key_names):
                positions = tuple(names.index(k) for k in self.key_names)
                types = tuple(rel.value_type_oids[i] for i in positions)
            w = self.raw_where[id(rel)] = (rel, positions, types)
        raw = None if w[1] is None else run.raw_keys(w[1])
        if raw is None:
            self.add(run.events(), False)
            return
        fmt, cols = raw
        sig = (w[2], fmt)
        if sig != self.raw_sig:
            if self.runs:  # equal raw keys of other types need not be equal values
                self._drain()
            self.raw_sig = sig
        self.runs.append(run)
        self.raw_cols.append(cols)
        self.run_starts.append(self.seq + 1)
        self.seq += run.m
        self.raw_count += run.m
        self.held += run.size
        if self.raw_count >= HELD_RAW or self.held >= HELD_BYTES:
            self._drain()

    def _raw_picks(self):
        """(run, the positions in it of the changes to keep) per raw run with any: the
        last change of each raw key, in stream order."""
        import numpy as np
        import pyarrow as pa

        ncols = len(self.raw_cols[0])
        cols = [list(chain.from_iterable(c[j] for c in self.raw_cols)) for j in range(ncols)]
        if len(set(cols[0] if ncols == 1 else zip(*cols))) == self.raw_count:
            for r, run in enumerate(self.runs):  # every key once (inserts of new keys): all
                yield r, list(range(run.m))  # (a set: a third of Arrow's grouping's time)
            return
        table = pa.table({f"k{j}": pa.array(col, pa.binary()) for j, col in enumerate(cols)})
        table = table.append_column("p", pa.array(np.arange(self.raw_count, dtype=np.int64)))
        last = table.group_by([f"k{j}" for j in range(ncols)], use_threads=False).aggregate(
            [("p", "max")]
        )
        where = np.sort(last.column("p_max").to_numpy())  # positions among the raw changes
        sizes = np.fromiter((r.m for r in self.runs), np.int64, len(self.runs))
        firsts = np.concatenate(([0], np.cumsum(sizes)))  # each run's first position
        run_of = np.searchsorted(firsts, where, "right") - 1
        cuts = np.flatnonzero(np.diff(run_of)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(where)]):
            r = int(run_of[lo])
            yield r, (where[lo:hi] - firsts[r]).tolist()

    def _raw_kept(self, kept: dict) -> None:
        """Add to ``kept`` (sequence number -> event) the raw runs' last change of each raw
        key, loaded."""
        for r, picks in self._raw_picks():
            start = self.run_starts[r]
            kept.update(zip([start + i for i in picks], self.runs[r].events(picks)))

    def _raw_operations(self):
        """The operations of the raw runs' kept changes, with no event made (when nothing
        else is kept: the runs' order is then the stream's)."""
        kept = list(self._raw_picks())
        after = self._raw_after(kept)
        ops, rels, keyed, befores, afters = [], [], [], [], []
        commits, ordinals, times = [], [], []
        for r, picks in kept:
            run = self.runs[r]
            n = len(picks)
            ops.append(run.op * n)
            rels.append(repeat(run.rel, n))
            keyed.append(repeat(run.before_is_key, n))
            if after is not None:  # typed already, inserts and updates only
                befores.append(repeat(None, n))
            elif run.op == "d":
                rows = run.rows(picks)
                befores.append(run.key_images(rows) if run.before_is_key else rows)
                afters.append(repeat(None, n))
            else:
                befores.append(repeat(None, n))
                afters.append(run.rows(picks))
            commit_lsn, commit_time, _xid, _origin = run.txn
            commits.append(repeat(commit_lsn, n))
            ordinals.append([run.first + i for i in picks])
            times.append(repeat(commit_time, n))
        flat = chain.from_iterable
        n = sum(map(len, ops))
        return self._operations_of(
            "".join(ops),
            list(flat(rels)),
            list(flat(keyed)),
            list(flat(befores)),
            list(flat(afters)),
            [()] * n,
            list(flat(commits)),
            list(flat(ordinals)),
            list(flat(times)),
            after=after,
        )

    def _raw_after(self, kept):
        """The kept changes' new rows as :func:`image_columns` makes them, typed from their
        text by Arrow (:func:`text_image`); None unless every kept change is an insert or
        update of one relation layout and every column takes that path."""
        rel = None
        for r, _picks in kept:
            run = self.runs[r]
            if run.op == "d":
                return None
            if rel is None:
                rel = run.rel
            elif run.rel is not rel and not same_layout(run.rel, rel):
                return None
        if rel is None:
            return None
        kinds, values = [], []
        for r, picks in kept:
            k, v = self.runs[r].flat(picks)
            kinds += k
            values += v
        return text_image(self.buf, rel, False, kinds, values)

    def _remember(self, events) -> None:
        """Keep each key's last change, by the keys its operations write (``events``: a run
        of one relation version's, in stream order)."""
        last = self.last
        n = len(events)
        seqs = range(self.seq + 1, self.seq + 1 + n)
        self.seq += n
        rel = events[0][1]
        w = self.where.get(id(rel))
        if w is None or w[0] is not rel:
            w = self.where[id(rel)] = (rel, self._key_of(rel.names), self._key_of(rel.key_names))
        new_key, old_key = w[1], w[2]
        afters = list(map(itemgetter(3), events))
        nones = afters.count(None)
        if nones:  # deletes, truncates
            present = list(map(is_not, afters, repeat(None)))
            afters = list(compress(afters, present))
            with_after = zip(compress(seqs, present), compress(events, present))
        else:
            with_after = zip(seqs, events)
        keys = None
        if new_key.getter is not None:
            try:
                keys = list(map(new_key.getter, afters))
            except IndexError:  # a short row (lenient): one at a time
                keys = None
        if keys is None or not _PLAIN.issuperset(map(type, keys)):
            keys = list(map(new_key, afters))
        last.update(zip(keys, with_after))  # a later change of a key replaces an earlier one
        # old rows (deletes, key changes, FULL identity) after, each only if it is later
        if nones or list(map(itemgetter(2), events)).count(None) != n:
            for s, ev in zip(seqs, events):
                before = ev[2]
                if before is not None:
                    k = (old_key if ev.before_is_key else new_key)(before)
                elif ev[0] == "d" and ev[3] is None:
                    k = None  # a delete without a row: Spark's key is null too
                else:
                    continue
                cur = last.get(k)
                if cur is None or cur[0] < s:
                    last[k] = (s, ev)
        if len(last) >= HELD_ROWS:
            self._drain()

    def _key_of(self, names):
        """row -> its key (see :func:`_reduce_key`) for rows of these column names."""
        positions = tuple(names.index(k) if k in names else None for k in self.key_names)
        if len(positions) != 1 or positions[0] is None:

            def key(row):
                return _reduce_key(row, positions)

            key.getter = None
            return key
        p = positions[0]

        def key(row):
            try:
                v = row[p]
            except IndexError:
                return None
            return v if v.__class__ in _PLAIN else _reduce_key(row, positions)

        key.getter = itemgetter(p)  # for rows known to be long enough
        return key

    def _drain(self) -> None:
        """Turn the changes kept so far into operations, in stream order."""
        if self.runs and not self.last:  # only raw runs: their operations, no events
            self.flush()
            batch = self._raw_operations()
            if batch is not None and batch.num_rows:
                self.parts.append(batch)
            kept = {}
        else:
            kept = dict(self.last.values())
            if self.runs:
                self._raw_kept(kept)
        self.last = {}
        self.runs = []
        self.raw_cols = []
        self.raw_count = 0
        self.run_starts = []
        self.held = 0
        self.events = [kept[seq] for seq in sorted(kept)]
        self.flush()  # one batch: the kept changes are at most HELD_ROWS
        self.drains += 1

    def flush(self) -> None:
        if self.events:
            batch = self._operations(self.events)
            self.events = []
            if batch is not None and batch.num_rows:
                self.parts.append(batch)

    def _operations(self, events):
        """A RecordBatch of the operations of ``events`` (c, u, d of this table), upserts
        then deletes."""
        op_text = "".join(map(itemgetter(0), events))
        if op_text.strip("cud"):  # truncates (logical messages are not grouped here)
            events = [ev for ev in events if ev.op in "cud"]
            if not events:
                return None
            op_text = "".join(map(itemgetter(0), events))
        return self._operations_of(
            op_text,
            list(map(itemgetter(1), events)),
            list(map(itemgetter(11), events)),
            list(map(itemgetter(2), events)),
            list(map(itemgetter(3), events)),
            list(map(itemgetter(4), events)),
            list(map(itemgetter(6), events)),
            list(map(itemgetter(7), events)),
            list(map(itemgetter(8), events)),
        )

    def _operations_of(
        self, op_text, rels, keyed, befores, afters, unchanged, commits, ordinals, times,
        after=None,
    ):  # fmt: skip
        """:meth:`_operations` of the events' fields, a list each (``op_text``: their ops;
        ``after``: the new rows' struct, when made already)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(op_text)
        if not n:
            return None
        ops = np.frombuffer(op_text.encode(), dtype="S1")
        if after is None:
            after = image_columns(self.buf, afters, rels, keyed, "after")
        after_cols = after.flatten()
        has_before = np.fromiter(map(is_not, befores, repeat(None)), bool, n)
        if has_before.any():
            before_cols = image_columns(self.buf, befores, rels, keyed, "before").flatten()
        else:  # inserts, updates without an old row: only deletes (without one) read it
            before_cols = [pa.nulls(n, f.type) for f in self.buf.cols_type]
        upsert = ops != b"d"
        if self.keys is None:  # a multiset: every update's old row leaves it
            moved = np.zeros(n, bool)
            delete = ~upsert | (ops == b"u")
            bad = delete & (~has_before | np.array(keyed))
        else:
            moved = np.zeros(n, bool)
            if has_before.any():
                for k in self.keys:
                    moved |= _differ(before_cols[k], after_cols[k])
                    # a key value the type cannot hold is null there, its text in _pg_text
                    name = self.ts.names[k]
                    moved |= _differ(
                        _special(before_cols[-1], name), _special(after_cols[-1], name)
                    )
                moved &= has_before & (ops == b"u")
            delete = ~upsert | moved
            bad = np.zeros(n, bool)
        if unchanged.count(()) != n:
            unchanged_arr = pa.array(unchanged, pa.list_(pa.string()))
        else:
            unchanged_arr = pa.ListArray.from_arrays(
                pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], pa.string())
            )
        commit = pa.array(commits, pa.int64())
        ordinal = pa.array(ordinals, pa.int64())
        times = pa.array(times, pa.int64())
        times = pc.add_checked(times, PG_EPOCH_UNIX_US)
        times = times.cast(pa.timestamp("us", tz="UTC"))
        common = [commit, ordinal, times]
        empty = pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], pa.string())
        )
        halves = []
        for is_upsert, rows, cols, unch in (
            (True, upsert, after_cols, unchanged_arr),
            (False, delete, before_cols, empty),
        ):
            if not rows.any():
                continue
            fixed = [
                pa.repeat(pa.scalar(self.number, pa.int32()), n),
                pa.repeat(pa.scalar(is_upsert), n),
                pa.repeat(pa.scalar(1 if is_upsert else 0, pa.int32()), n),
                pa.array(moved & is_upsert),
                pa.array(bad),
                *common,
                unch,
            ]
            arrays = [*fixed, *cols]
            if not rows.all():  # (inserts and updates only, the usual: every row, no copy)
                mask = pa.array(rows)
                arrays = [a.filter(mask) for a in arrays]
            halves.append(arrays)
        if len(halves) == 1:
            return self._batch(halves[0])
        return self._batch([pa.concat_arrays(list(parts)) for parts in zip(*halves)])

    def _batch(self, arrays):
        """A RecordBatch of the whole schema from the fixed and this table's columns."""
        import pyarrow as pa

        m = len(arrays[0])
        nfixed = len(_FIXED)
        out = arrays[:nfixed]
        mine = arrays[nfixed:]
        for i in range(nfixed, len(self.schema)):
            f = self.schema.field(i)
            k = i - self.first
            out.append(mine[k] if 0 <= k < len(mine) else pa.nulls(m, f.type))
        return pa.RecordBatch.from_arrays(out, schema=self.schema)

    def finish(self):
        """The unit's operations of this table, in batches (reduced when asked and sound)."""

        if self.reduce and not self.has_unchanged:
            self._drain()
            if self.drains > 1:  # combine across the drains
                self.parts = self._reduced()
        self.flush()
        return [
            b.slice(i, BATCH_ROWS) for b in self.parts for i in range(0, b.num_rows, BATCH_ROWS)
        ]

    def _reduced(self) -> list:
        import pyarrow as pa

        table = pa.Table.from_batches(self.parts)
        keys = [value_column(self.number, k) for k in self.keys]
        special = table.column(special_column(self.number))
        for k in self.keys:  # and the key's text where its type cannot hold it (infinity)
            keys.append(f"_kt{k}")
            table = table.append_column(keys[-1], _special(special, self.ts.names[k]))
        reduced = _last_per_key(table, keys)
        if reduced is None:  # keys Arrow cannot group by: Spark does it all
            self.reduce = False
            return self.parts
        return reduced.drop_columns(keys[len(self.keys) :]).to_batches()


_PLAIN = frozenset((int, str, bytes, type(None)))


def _reduce_key(values, positions):
    """A key by which two changes are combined only if Spark sees the same key: a value of a
    plain type is itself; any other goes by its type and repr (Decimal('1.0') and
    Decimal('1.00') stay apart, as their text does in a string column)."""
    key = []
    for p in positions:
        v = None if p is None or p >= len(values) else values[p]
        if type(v) not in _PLAIN:
            v = (type(v).__name__, repr(v))
        key.append(v)
    return key[0] if len(key) == 1 else tuple(key)


def _special(special, name: str):
    """The PostgreSQL text of column ``name`` in a _pg_text map array (null where none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if special.null_count == len(special):
        return pa.nulls(len(special), pa.string())
    return pc.map_lookup(special, pa.scalar(name, pa.string()), "first")


def _differ(a, b):
    """numpy bools: a[i] and b[i] differ, as Spark compares key structs (null equals null)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        ne = pc.not_equal(a, b)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # nested types: in Python
        return np.array([x != y for x, y in zip(a.to_pylist(), b.to_pylist())], bool)
    ne = pc.fill_null(ne, pc.xor(pc.is_null(a), pc.is_null(b)))
    return ne.to_numpy(zero_copy_only=False).astype(bool)


def _last_per_key(table, keys):
    """The rows of ``table`` ordered last, by (commit LSN, ordinal, sub), among those with
    the same key; None where Arrow cannot group by these key types."""
    import pyarrow as pa

    table = table.sort_by(
        [("_commit_lsn", "ascending"), ("_tx_ordinal", "ascending"), ("_sub", "ascending")]
    )
    table = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    try:
        last = table.group_by(keys, use_threads=False).aggregate([("_row", "max")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    rows = last.column("_row_max").combine_chunks().sort()
    return table.take(rows).drop_columns(["_row"])


def ops_to_batches(
    unit, tables: dict, schema, keys: dict, *, reduce: bool, lenient: bool, stats: dict | None
):
    """Arrow RecordBatches of one unit's operations (runs in a task). ``schema``:
    :func:`ops_schema` (Spark's) or :func:`ops_arrow_schema`; ``keys``: {qualified: key column
    names, or None for a table without a key}; ``stats``: as in
    :func:`pgcdc.spark.changes.events_to_batches` (``{"after": LSN or None}``); events
    committed at or before ``stats["after"]`` are not operations."""
    import pyarrow as pa

    arrow_schema = schema if isinstance(schema, pa.Schema) else pa.schema(list(arrow_type(schema)))
    after = stats.get("after") if stats is not None else None
    with paused():  # a unit holds many small objects a while, none in a cycle
        yield from _unit_ops(unit, tables, arrow_schema, keys, reduce, lenient, stats, after)


def _unit_ops(unit, tables, arrow_schema, keys, reduce, lenient, stats, after):
    found: dict = {}
    table_ops = {  # (a table passed over: its changes count in the stats only)
        name: _TableOps(ts, i, arrow_schema, keys.get(name), reduce)
        for i, (name, ts) in enumerate(tables.items())
        if name not in unit.passed_over
    }
    raw_last: dict = {}  # table -> the last raw run's last (commit LSN, ordinal)
    # lenient: every change is loaded (a raw run loads only each key's last), so that each
    # value kept raw is counted and reported
    for part in unit_parts(unit, lenient, raw_runs=reduce and not lenient):
        if type(part) is RawRun:
            rel = part.rel
            name = table_key(rel.schema, rel.table)
            if after is not None and part.txn[0] <= after:
                continue
            raw_last[name] = (part.txn[0], part.first + part.m - 1)
            t = table_ops.get(name)
            if t is not None:
                t.add_run(part)
            continue
        for rel, group in groupby(part, attrgetter("relation")):
            if rel is None:  # logical messages
                continue
            name = table_key(rel.schema, rel.table)
            t = table_ops.get(name)
            if t is None:  # passed over, or (lenient) an unknown relation: in the stats
                _note(found, name, [ev for ev in group if after is None or ev.commit_lsn > after])
                continue
            events = list(group)
            if after is not None:
                events = [ev for ev in events if ev.commit_lsn > after]
                if not events:
                    continue
            t.add(events, _note(found, name, events))
    for name, last in raw_last.items():  # no truncate, no unchanged TOAST in a raw run
        EventStats.addInPlace(found, {name: {"last": last, "truncate": None, "unchanged": set()}})
    for t in table_ops.values():
        yield from t.finish()
    if stats is not None:
        stats["tables"] = found


def _note(found: dict, name: str, events) -> bool:
    """Add events (in stream order) to the stats of :class:`EventStats`; whether one has
    unchanged TOAST columns."""
    if not events:
        return False
    last = events[-1]
    truncs = [ev for ev in events if ev.op == "t"] if "t" in map(itemgetter(0), events) else ()
    unchanged = set()
    if any(map(itemgetter(4), events)):
        unchanged = {c for ev in events if ev.unchanged for c in ev.unchanged}
    entry = {
        "last": (last.commit_lsn, last.tx_ordinal),
        "truncate": (truncs[-1].commit_lsn, truncs[-1].tx_ordinal) if truncs else None,
        "unchanged": unchanged,
    }
    if any(map(itemgetter(13), events)):  # lenient: values kept raw, and why
        entry["errors"] = {(ev.lsn, str(e)) for ev in events if ev.errors for e in ev.errors}
    EventStats.addInPlace(found, {name: entry})
    return bool(unchanged)


def change_ops(spark, ce, keys: dict, *, reduce: bool):
    """(DataFrame of the operations of ``ce``'s units, EventStats accumulator filled as it is
    computed); ``keys`` and ``reduce`` as in :func:`ops_to_batches`."""
    schema = ops_schema(ce.tables)
    acc = spark.sparkContext.accumulator({}, EventStats())
    if ce.seeds is None:
        return spark.createDataFrame([], schema), acc
    units = {u.unit_no: u for u in ce.units}
    tables, lenient, after = ce.tables, ce.lenient, ce.min_commit_lsn

    def run_units(batches):
        for batch in batches:
            for unit_no in batch.column(0).to_pylist():
                stats = {"after": after}
                yield from ops_to_batches(
                    units[unit_no],
                    tables,
                    schema,
                    keys,
                    reduce=reduce,
                    lenient=lenient,
                    stats=stats,
                )
                acc.add(stats["tables"])

    return ce.seeds.mapInArrow(run_units, schema), acc
