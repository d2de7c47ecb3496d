"""apply's per-unit reduction of operations (pgcdc.apply.ops, ``reduce=True``) drops nothing
apply needs: the same units turned into operations with and without it give, per table with
a key, the same winning operation per key (the row ordered last by (commit LSN, ordinal,
sub), every column of it), the same value wherever a later unchanged TOAST column looks back,
and only rows the unreduced operations also have; tables without a key are left whole, and
the stats the tasks gather are the same.

No Spark: the operations are built as a task builds them, on the real captures of PostgreSQL
15-18 and on generated codec captures (one or two tables, key changes, deletes, truncates,
unchanged TOAST, nulls, a relation version that adds a column), cut into small units, with
``HELD_ROWS`` and ``HELD_RAW`` small so that a unit's kept keys are drained to Arrow (and
combined again) many times. Runs of changes come raw (their values loaded only for the changes
kept), as apply reads them, and loaded, as without reduction.
"""

from __future__ import annotations

import gzip
import shutil
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import pgoutput_codec as pgc  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pgoutput_codec import capture as capfmt  # noqa: E402

from pgcdc.spark import changes as ch  # noqa: E402
from pgcdc.apply import ops  # noqa: E402
from tests.support.apply_model import UNCHANGED, _tuple  # noqa: E402

CAPTURES = sorted(Path(__file__).parents[1].glob("captures/pg1*/*.pgcap*"))

# ((split_records, HELD_ROWS), ...): a real capture is checked under one of these (in turn),
# so that every combination meets several servers and protocol versions and the module stays
# fast (a unit costs a few milliseconds however small it is)
REAL_CONFIGS = ((5, 2), (16, 3), (40, 2), (9, 3), (3, 2))
REAL_CAPTURES = CAPTURES[::3]


# --- building and comparing the operations ------------------------------------------------------


def _units(path, split):
    files = ch.list_capture_files([str(path)])
    grain = min(ch.SPLIT_GRAIN, split)
    summaries = [ch.summarize_file(i, f, grain) for i, f in enumerate(files)]
    return ch.plan(files, summaries, split, None)


def _operations(units, tables, keys, reduce):
    """[(the unit's operations as row dicts, its stats["tables"])] per unit."""
    schema = ops.ops_schema(tables)
    arrow_schema = pa.schema(list(ch.arrow_type(schema)))
    out = []
    for unit in units:
        stats = {"after": None}
        batches = list(
            ops.ops_to_batches(
                unit, tables, schema, keys, reduce=reduce, lenient=False, stats=stats
            )
        )
        for b in batches:
            assert b.schema == arrow_schema
        rows = pa.Table.from_batches(batches, schema=arrow_schema).to_pylist()
        out.append((rows, stats["tables"]))
    return out


def _frozen(v):
    """A hashable stand-in of a collected Arrow value, equal where Spark's values are (NaN
    equals NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return ("NaN",)
    if isinstance(v, dict):
        return tuple((k, _frozen(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    return v


def _row(r: dict):
    """The whole row, hashable (values by their repr: 1 and 1.0, or 0.0 and -0.0, differ)."""
    return tuple((k, repr(_frozen(v))) for k, v in r.items())


def _seq(r: dict):
    return (r["_commit_lsn"], r["_tx_ordinal"], r["_sub"])


def _key_columns(number, ts, keys):
    return [ops.value_column(number, ts.names.index(k)) for k in keys]


def _winners(rows, kcols) -> dict:
    """{key: {rows ordered last among the key's}} (a set: ties are possible in principle)."""
    best: dict = {}
    for r in rows:
        k = tuple(_frozen(r[c]) for c in kcols)
        s = _seq(r)
        cur = best.get(k)
        if cur is None or s > cur[0]:
            best[k] = (s, {_row(r)})
        elif s == cur[0]:
            cur[1].add(_row(r))
    return {k: v[1] for k, v in best.items()}


def _after_truncate(rows, stats_tables, name):
    """The rows apply reads: those ordered after the table's last truncate (of all units)."""
    cuts = [s[name]["truncate"] for s in stats_tables if s.get(name, {}).get("truncate")]
    if not cuts:
        return rows
    cut = max(cuts)
    return [r for r in rows if (r["_commit_lsn"], r["_tx_ordinal"]) > cut]


def _lookbacks(rows, kcols, number, ts) -> dict:
    """What apply fills each unchanged TOAST column of an upsert with: {(the upsert, column):
    ("value", v) of the key's latest earlier upsert that has the column, ("gone",) after a
    delete, or None if nothing earlier is known}."""
    by_key = defaultdict(list)
    for i, r in enumerate(rows):
        by_key[tuple(_frozen(r[c]) for c in kcols)].append((_seq(r), i, r))
    out = {}
    for history in by_key.values():
        history.sort(key=lambda x: (x[0], x[1]))
        for pos, (_s, _i, r) in enumerate(history):
            if not r["_upsert"] or not r["_unchanged"]:
                continue
            for c in r["_unchanged"]:
                found = None
                for _s2, _i2, prev in reversed(history[:pos]):
                    if not prev["_upsert"]:
                        found = ("gone",)
                        break
                    if c not in (prev["_unchanged"] or ()):
                        col = ops.value_column(number, ts.names.index(c))
                        found = ("value", repr(_frozen(prev[col])))
                        break
                out[(_row(r), c)] = found
    return out


def check_reduction(units, tables, monkeypatch, held: int) -> dict:
    """Build the operations of ``units`` both ways and compare (see the module docstring);
    returns counts of what was compared, for the callers' sanity checks."""
    monkeypatch.setattr(ops, "HELD_ROWS", held)
    monkeypatch.setattr(ops, "HELD_RAW", held)
    keys = {n: (list(ts.key_names) if ts.key_names else None) for n, ts in tables.items()}
    full = _operations(units, tables, keys, reduce=False)
    reduced = _operations(units, tables, keys, reduce=True)
    seen = Counter()
    for u, ((rows_f, stats_f), (rows_r, stats_r)) in enumerate(zip(full, reduced)):
        assert stats_r == stats_f, f"unit {u}: the stats differ"
        missing = Counter(map(_row, rows_r)) - Counter(map(_row, rows_f))
        assert not missing, f"unit {u}: reduced rows the unreduced operations lack: {missing}"
        for number, (name, ts) in enumerate(tables.items()):
            mine_f = [r for r in rows_f if r["_t"] == number]
            mine_r = [r for r in rows_r if r["_t"] == number]
            if not keys[name]:  # a multiset: every operation counts
                assert Counter(map(_row, mine_r)) == Counter(map(_row, mine_f)), (u, name)
                continue
            kcols = _key_columns(number, ts, keys[name])
            win_f, win_r = _winners(mine_f, kcols), _winners(mine_r, kcols)
            assert win_r.keys() == win_f.keys(), (u, name)
            for k, tops in win_f.items():
                assert win_r[k] <= tops, (u, name, k)
                if len(tops) == 1:
                    assert win_r[k] == tops, (u, name, k)
            seen["keys"] += len(win_f)
            seen["dropped"] += len(mine_f) - len(mine_r)
    # across units, as apply's window sees them: after the last truncate, the winners and
    # what every unchanged TOAST column looks back at
    all_stats = [s for _rows, s in full]
    for number, (name, ts) in enumerate(tables.items()):
        if not keys[name]:
            continue
        kcols = _key_columns(number, ts, keys[name])
        mine_f = [r for rows, _s in full for r in rows if r["_t"] == number]
        mine_r = [r for rows, _s in reduced for r in rows if r["_t"] == number]
        mine_f = _after_truncate(mine_f, all_stats, name)
        mine_r = _after_truncate(mine_r, all_stats, name)
        win_f, win_r = _winners(mine_f, kcols), _winners(mine_r, kcols)
        assert win_r.keys() == win_f.keys(), name
        for k, tops in win_f.items():
            assert win_r[k] <= tops, (name, k)
        look_f = _lookbacks(mine_f, kcols, number, ts)
        look_r = _lookbacks(mine_r, kcols, number, ts)
        assert look_r == look_f, name
        seen["lookbacks"] += len(look_f)
    return seen


# --- the real captures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_captures(tmp_path_factory):
    """The real captures decompressed once (each unit would inflate its file again)."""
    root = tmp_path_factory.mktemp("captures")
    out = {}
    for path in REAL_CAPTURES:
        target = root / path.parent.name / path.name.removesuffix(".gz")
        target.parent.mkdir(exist_ok=True)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            target.write_bytes(f.read())
        shutil.copy(path.parent / "catalog.jsonl", target.parent)  # the captures' types
        out[path] = target
    return out


@pytest.mark.parametrize(
    "index", range(len(REAL_CAPTURES)), ids=[f"{p.parent.name}/{p.name}" for p in REAL_CAPTURES]
)
def test_reduction_keeps_what_apply_needs_real(index, plain_captures, monkeypatch):
    split, held = REAL_CONFIGS[index % len(REAL_CONFIGS)]
    units, tables = _units(plain_captures[REAL_CAPTURES[index]], split)
    assert len(units) > 3  # cut small: transactions cross units
    seen = check_reduction(units, tables, monkeypatch, held)
    assert seen["keys"] and seen["dropped"]  # it did combine something


def test_real_captures_cover_the_cases(plain_captures):
    """The captures checked above have what makes the reduction hard: unchanged TOAST,
    truncates, key-only old images, tables without a key."""
    found = Counter()
    for path in plain_captures.values():
        units, tables = _units(path, 1000)
        found["keyless"] += sum(1 for ts in tables.values() if not ts.key_names)
        for unit in units:
            for ev in ch.unit_events(unit):
                found["u"] += bool(ev.unchanged)
                found["t"] += ev.op == "t"
                found["key"] += bool(ev.before_is_key)
    assert all(found[k] for k in ("keyless", "u", "t", "key")), found


# --- generated captures -------------------------------------------------------------------------

OID_A, OID_B = 16601, 16602
A_COLUMNS = (("id", 23, True), ("v", 25, False), ("w", 23, False))
A_ADDED = ("x", 25, False)  # what a later relation version of a adds
B_COLUMNS = (("k1", 25, True), ("k2", 23, True), ("p", 25, False))


def _relation(oid, name, columns):
    return pgc.Relation(
        relation_oid=oid,
        namespace="public",
        relation_name=name,
        replica_identity=ord("d"),
        columns=tuple(
            pgc.RelationColumn(flags=1 if key else 0, name=n, type_oid=t, type_modifier=-1)
            for n, t, key in columns
        ),
    )


def _key_tuple(columns, values):
    """An old key image: the key columns' values, every other column null."""
    return _tuple([v if key else None for (_n, _t, key), v in zip(columns, values)])


_text = st.sampled_from(["", "a", "bb", "ccc"])
_int = st.integers(-2, 3).map(str)


def _values(kinds, unchanged: bool):
    """Values of the non-key columns (``kinds``: "t" text, "i" int), null or 'u' at times."""
    parts = []
    for kind in kinds:
        options = [st.none(), _text if kind == "t" else _int]
        if unchanged:
            options.append(st.just(UNCHANGED))
        parts.append(st.one_of(*options))
    return st.tuples(*parts)


@st.composite
def _change(draw, tables: int, extra: bool):
    """One change: (op, table, ...): ("I", t, key, values), ("U", t, key, values), ("K", t,
    old key, new key, values), ("D", t, key), ("T", (tables...)); ``extra``: table a's rows
    have the added column."""
    t = draw(st.integers(0, tables - 1))
    key = draw(
        st.tuples(st.integers(0, 4).map(str))
        if t == 0
        else st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2).map(str))
    )
    kinds = ("t", "i", "t") if t == 0 and extra else ("t", "i") if t == 0 else ("t",)
    op = draw(st.sampled_from("IIUUUKDDT"))
    if op == "I":
        return ("I", t, key, draw(_values(kinds, False)))
    if op == "U":
        return ("U", t, key, draw(_values(kinds, True)))
    if op == "K":
        new = draw(
            st.tuples(st.integers(0, 4).map(str))
            if t == 0
            else st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2).map(str))
        )
        return ("K", t, key, new, draw(_values(kinds, True)))
    if op == "D":
        return ("D", t, key)
    which = draw(st.sampled_from([(0,), (1,), (0, 1)] if tables == 2 else [(0,)]))
    return ("T", which)


@st.composite
def _stream(draw):
    """(number of tables, the transaction a's relation gains a column at or None, [[change,
    ...], ...])."""
    tables = draw(st.integers(1, 2))
    count = draw(st.integers(1, 8))
    grow = draw(st.one_of(st.none(), st.integers(0, count - 1)))
    txns = []
    for i in range(count):
        extra = grow is not None and i >= grow
        txns.append(draw(st.lists(_change(tables, extra), min_size=1, max_size=7)))
    return tables, grow, txns


def _write(path, tables, grow, txns):
    """A protocol 1 capture of the generated transactions."""
    a_cols = A_COLUMNS
    pairs = []
    lsn = 0x3000
    for i, changes in enumerate(txns):
        begin = lsn
        msgs = []  # Relation messages as the server sends them: first, and on a change
        if i == 0 or i == grow:
            a_cols = A_COLUMNS + (A_ADDED,) if i == grow else A_COLUMNS
            msgs.append(_relation(OID_A, "a", a_cols))
        if i == 0 and tables == 2:
            msgs.append(_relation(OID_B, "b", B_COLUMNS))
        for change in changes:
            op, t = change[0], change[1]
            oid, cols = (OID_A, a_cols) if t == 0 else (OID_B, B_COLUMNS)
            nkey = 1 if t == 0 else 2
            if op == "I":
                msgs.append(pgc.Insert(relation_oid=oid, new_tuple=_tuple(change[2] + change[3])))
            elif op == "U":
                msgs.append(pgc.Update(relation_oid=oid, new_tuple=_tuple(change[2] + change[3])))
            elif op == "K":
                old = change[2] + (None,) * (len(cols) - nkey)
                msgs.append(
                    pgc.Update(
                        relation_oid=oid,
                        old_kind="K",
                        old_tuple=_key_tuple(cols, old),
                        new_tuple=_tuple(change[3] + change[4]),
                    )
                )
            elif op == "D":
                old = change[2] + (None,) * (len(cols) - nkey)
                msgs.append(
                    pgc.Delete(relation_oid=oid, old_kind="K", old_tuple=_key_tuple(cols, old))
                )
            else:
                oids = tuple(OID_A if x == 0 else OID_B for x in change[1])
                msgs.append(pgc.Truncate(options=0, relation_oids=oids))
        final = begin + 0x10 * (len(msgs) + 1)
        pairs.append((begin, pgc.Begin(final_lsn=final, commit_time=1000 * i, xid=900 + i)))
        for j, m in enumerate(msgs):  # Relation messages go with LSN 0, as the server's
            pairs.append((0 if isinstance(m, pgc.Relation) else begin + 0x10 * (j + 1), m))
        pairs.append(
            (final, pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=1000 * i))
        )
        lsn = final + 0x20
    encoded = [(at, pgc.encode(m, protocol_version=1)) for at, m in pairs]
    capfmt.write(path, capfmt.from_payloads(encoded, 1))


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    stream=_stream(),
    split=st.sampled_from([2, 3, 5, 8]),
    held=st.sampled_from([1, 2, 3]),
)
def test_reduction_keeps_what_apply_needs_generated(stream, split, held, tmp_path, monkeypatch):
    path = tmp_path / f"gen-{split}-{held}.pgcap"
    _write(path, *stream)
    units, tables = _units(path, split)
    check_reduction(units, tables, monkeypatch, held)


def test_reduce_keys_never_join_what_spark_keeps_apart():
    """Two changes are combined only under keys Spark also sees as one: values Python calls
    equal but whose Spark values differ (the text of an unconstrained numeric, a column
    whose type changed and went to text, times with other offsets) stay apart."""
    import datetime as dt
    from decimal import Decimal

    def key(*values):
        return ops._reduce_key(values, range(len(values)))

    apart = [
        (Decimal("1.0"), Decimal("1.00")),
        (True, 1),
        (1, 1.0),
        (
            dt.time(10, tzinfo=dt.timezone(dt.timedelta(hours=1))),
            dt.time(9, tzinfo=dt.timezone.utc),
        ),
    ]
    for a, b in apart:
        assert a == b  # Python would join them
        assert key(a) != key(b) and key(a, 5) != key(b, 5)
    assert key(7) == key(7) and key("x", None) == key("x", None)
    assert key(Decimal("2.5"), b"k") == key(Decimal("2.5"), b"k")


# --- raw runs -----------------------------------------------------------------------------------


def _fixed_history(path, bad=None):
    """Table a: 10 inserts, 10 updates, 5 deletes, 5 updates, each run in its own
    transaction; ``bad``: (transaction, row) whose w is text no int4 loads from."""
    txns = [
        [("I", 0, (str(i),), ("v", str(i))) for i in range(10)],
        [("U", 0, (str(i),), ("u", str(i + 10))) for i in range(10)],
        [("D", 0, (str(i),)) for i in range(5)],
        [("U", 0, (str(i),), ("w", str(i + 20))) for i in range(5, 10)],
    ]
    if bad is not None:
        t, i = bad
        op, table, key, values = txns[t][i]
        txns[t][i] = (op, table, key, (values[0], "not a number"))
    _write(path, 1, None, txns)


def _count_raw(monkeypatch) -> Counter:
    """Counts the changes that went into raw runs and the drains that loaded them."""
    from pgcdc.events.reader import RawRun

    seen = Counter()
    raw_keys, raw_picks = RawRun.raw_keys, ops._TableOps._raw_picks

    def counting_keys(run, positions):
        got = raw_keys(run, positions)
        seen["raw"] += run.m if got is not None else 0
        return got

    def counting_picks(t):
        seen["drains"] += 1
        return raw_picks(t)

    monkeypatch.setattr(RawRun, "raw_keys", counting_keys)
    monkeypatch.setattr(ops._TableOps, "_raw_picks", counting_picks)
    return seen


@pytest.mark.parametrize("held", [2, 7, 1000])
def test_raw_runs_combine_and_load_only_what_they_keep(held, tmp_path, monkeypatch):
    path = tmp_path / "runs.pgcap"
    _fixed_history(path)
    units, tables = _units(path, 1000)
    assert len(units) == 1
    seen = _count_raw(monkeypatch)
    checked = check_reduction(units, tables, monkeypatch, held)
    assert seen["raw"] == 30  # every change (deletes by their old key tuples)
    assert checked["keys"] == 10
    if held == 1000:
        assert seen["drains"] == 1
        assert checked["dropped"] == 20  # 30 operations in, one per key out
    else:
        assert seen["drains"] > 1


def test_raw_runs_report_a_value_that_does_not_load(tmp_path, monkeypatch):
    """A value that does not load fails the unit with the message path's error when its
    change is kept; one in a change a later change of its key replaces is never loaded."""
    keys = {"public.a": ["id"]}
    path = tmp_path / "bad.pgcap"
    _fixed_history(path, bad=(3, 2))  # key 7's last update
    units, tables = _units(path, 1000)
    errors = []
    for reduce in (False, True):
        with pytest.raises(ValueError) as err:
            list(
                ops.ops_to_batches(
                    units[0],
                    tables,
                    ops.ops_schema(tables),
                    keys,
                    reduce=reduce,
                    lenient=False,
                    stats={"after": None},
                )
            )
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    # the file, the message (Begin, Relation, 10 + 1 + 10 + 1 + 5 + 1 + Begin, then the third
    # update: index 35), where, the column and why
    assert "runs.pgcap" not in errors[0]
    assert (
        "bad.pgcap: message 35 (Update) at LSN 0/3260: column 'w' (#2, type int4, oid 23"
        in errors[0]
    )

    path = tmp_path / "replaced.pgcap"
    _fixed_history(path, bad=(1, 7))  # key 7's first update: the next one replaces it
    units, tables = _units(path, 1000)
    schema = ops.ops_schema(tables)
    with pytest.raises(ValueError):
        list(
            ops.ops_to_batches(
                units[0], tables, schema, keys, reduce=False, lenient=False, stats={"after": None}
            )
        )
    batches = list(
        ops.ops_to_batches(
            units[0], tables, schema, keys, reduce=True, lenient=False, stats={"after": None}
        )
    )
    assert sum(b.num_rows for b in batches) == 10
