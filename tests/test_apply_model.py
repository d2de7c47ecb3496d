"""apply (SCD1) on one table with a key, against a model: the transactions folded in commit
order over a dict key -> row.

One keyed table takes apply's single pass, written on the guess that the run has no truncate
and no unchanged TOAST column; the stats gathered on the way then confirm the guess or make
apply write the table again. The generated histories have inserts, updates (nulls, unchanged
TOAST columns of rows that exist), key changes (full new rows), deletes and truncates, cut
into units of a few records; some are applied in two runs (a capture of the first
transactions, then one of all of them, into the same state).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

import pgoutput_codec as pgc  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pgoutput_codec import capture as capfmt  # noqa: E402

from pgcdc.lsn import format_lsn  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.apply.state import STATE_FILE  # noqa: E402
from tests.delta_support import read_table  # noqa: E402
from tests.spark_support import spark  # noqa: E402, F401
from tests.test_apply_ops import UNCHANGED, _tuple  # noqa: E402

OID = 16700
TABLE = "public.m"
# (name, type oid, key); a and b are the TOASTable ones
COLUMNS = (("id", 23, True), ("a", 25, False), ("b", 25, False), ("c", 23, False))
NAMES = [n for n, _t, _k in COLUMNS]
U = UNCHANGED  # a 'u' column (unchanged TOAST) in a generated update
KEYS = range(8)


# --- the histories --------------------------------------------------------------------------


_text = st.one_of(st.none(), st.sampled_from(["", "x", "yy", "long " * 3]))
_int = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))


@st.composite
def _history(draw):
    """Transactions of changes, each valid where it happens (as a server sends them):
    ("I", key, a, b, c) of an absent key; ("U", key, a, b, c) of a present one, a and b
    maybe U; ("K", old, new, a, b, c) from a present key to an absent one; ("D", key) of a
    present key; ("T",)."""
    live: set = set()
    txns = []
    for _ in range(draw(st.integers(2, 7))):
        changes = []
        for _ in range(draw(st.integers(1, 6))):
            absent = [k for k in KEYS if k not in live]
            present = sorted(live)
            kinds = ["I"] * 3 if absent else []
            if present:
                kinds += ["U"] * 4 + ["D"] * 2 + (["K"] * 2 if absent else [])
            kinds.append("T")  # rarely: a truncate makes apply write the table again
            kind = draw(st.sampled_from(kinds))
            if kind == "I":
                key = draw(st.sampled_from(absent))
                changes.append(("I", key, draw(_text), draw(_text), draw(_int)))
                live.add(key)
            elif kind == "U":
                key = draw(st.sampled_from(present))
                a, b = draw(st.one_of(_text, st.just(U))), draw(st.one_of(_text, st.just(U)))
                changes.append(("U", key, a, b, draw(_int)))
            elif kind == "K":
                old, new = draw(st.sampled_from(present)), draw(st.sampled_from(absent))
                changes.append(("K", old, new, draw(_text), draw(_text), draw(_int)))
                live.discard(old)
                live.add(new)
            elif kind == "D":
                key = draw(st.sampled_from(present))
                changes.append(("D", key))
                live.discard(key)
            else:
                changes.append(("T",))
                live.clear()
        txns.append(changes)
    return txns


def _lsns(txns):
    """(begin LSN, commit LSN) of each transaction: a change every 0x10 bytes."""
    out = []
    lsn = 0x20000
    for changes in txns:
        final = lsn + 0x10 * (len(changes) + 1)
        out.append((lsn, final))
        lsn = final + 0x28
    return out


def reference(txns) -> dict:
    """{key: (row dict, commit LSN, tx ordinal)} after the transactions, in commit order."""
    state: dict = {}
    for (_begin, commit), changes in zip(_lsns(txns), txns):
        for ordinal, change in enumerate(changes, 1):
            kind = change[0]
            if kind == "I":
                key, *values = change[1:]
                state[key] = (dict(zip(NAMES, [key, *values])), commit, ordinal)
            elif kind == "U":
                key, *values = change[1:]
                prev = state[key][0]  # the generator sends 'u' only for a row that exists
                row = {"id": key}
                for name, v in zip(NAMES[1:], values):
                    row[name] = prev[name] if v == U else v
                state[key] = (row, commit, ordinal)
            elif kind == "K":
                old, new, *values = change[1:]
                del state[old]
                state[new] = (dict(zip(NAMES, [new, *values])), commit, ordinal)
            elif kind == "D":
                del state[change[1]]
            else:
                state.clear()
    return state


def _key_only(key):
    return _tuple([key] + [None] * (len(COLUMNS) - 1))


RELATION = pgc.Relation(
    relation_oid=OID,
    namespace="public",
    relation_name="m",
    replica_identity=ord("d"),
    columns=tuple(
        pgc.RelationColumn(flags=int(key), name=n, type_oid=t, type_modifier=-1)
        for n, t, key in COLUMNS
    ),
)


def write_capture(path, txns) -> None:
    """A protocol 1 capture of ``txns`` (the Relation message in the first one only, as the
    server sends it once)."""
    relation = RELATION
    pairs = []
    for i, ((begin, final), changes) in enumerate(zip(_lsns(txns), txns)):
        time = 1_000_000 * (i + 1)
        pairs.append((begin, pgc.Begin(final_lsn=final, commit_time=time, xid=5000 + i)))
        if i == 0:
            pairs.append((0, relation))
        for j, change in enumerate(changes, 1):
            kind = change[0]
            if kind in "IU":
                cls = pgc.Insert if kind == "I" else pgc.Update
                msg = cls(relation_oid=OID, new_tuple=_tuple(change[1:]))
            elif kind == "K":
                msg = pgc.Update(
                    relation_oid=OID,
                    old_kind="K",
                    old_tuple=_key_only(change[1]),
                    new_tuple=_tuple(change[2:]),
                )
            elif kind == "D":
                msg = pgc.Delete(relation_oid=OID, old_kind="K", old_tuple=_key_only(change[1]))
            else:
                msg = pgc.Truncate(options=0, relation_oids=(OID,))
            pairs.append((begin + 0x10 * j, msg))
        pairs.append(
            (final, pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=time))
        )
    encoded = [(lsn, pgc.encode(m, protocol_version=1)) for lsn, m in pairs]
    capfmt.write(path, capfmt.from_payloads(encoded, 1))


# --- checking a state -----------------------------------------------------------------------


def check_state(out, txns, report) -> None:
    want = reference(txns)
    table = read_table(out / TABLE)
    assert set(table.column_names) == {*NAMES, "_pg_text", "_commit_lsn", "_tx_ordinal"}
    rows = table.to_pylist()
    got = {r["id"]: r for r in rows}
    assert len(got) == len(rows), "a key twice in the state"
    assert {k: {n: r[n] for n in NAMES} for k, r in got.items()} == {
        k: row for k, (row, _c, _o) in want.items()
    }
    for k, (_row, commit, ordinal) in want.items():  # the change that wrote the row
        assert (got[k]["_commit_lsn"], got[k]["_tx_ordinal"]) == (commit, ordinal), k
        assert not got[k]["_pg_text"], k
    assert report == {TABLE: len(want)}
    doc = json.loads((out / STATE_FILE).read_text())
    assert doc["applied_lsn"] == format_lsn(_lsns(txns)[-1][1])
    assert doc["tables"][TABLE]["keys"] == ["id"]


def _has(txns, what) -> bool:
    return any(c[0] == what or (what == U and U in c) for changes in txns for c in changes)


# a run with both: apply's guess (no truncate, no 'u') fails and the table is written again
BOTH = [
    [("I", 1, "a1", "b1", 1), ("I", 2, "a2", "b2", 2), ("I", 3, None, "b3", 3)],
    [("U", 1, U, "B1", 10), ("K", 2, 5, "a5", "b5", 5), ("D", 3)],
    [("T",), ("I", 2, "x", "y", None), ("U", 2, U, U, 7)],
    [("I", 4, "a4", None, 4), ("U", 4, U, "bb", 4)],
    [("K", 4, 6, "a6", "b6", 6), ("U", 6, U, U, 66), ("U", 2, "z", U, 2)],
]
UNCHANGED_ONLY = [
    [("I", k, f"a{k}", f"b{k}", k) for k in range(6)],
    [("U", k, U, f"B{k}", -k) for k in range(0, 6, 2)],
    [("K", 1, 7, "a7", "b7", 7), ("U", 7, U, U, 70), ("D", 3), ("U", 5, "A5", U, None)],
]
TRUNCATE_ONLY = [
    [("I", k, f"a{k}", f"b{k}", k) for k in range(5)],
    [("U", 0, "A0", "B0", 0), ("T",), ("I", 1, "one", None, 1)],
    [("I", 0, None, None, None), ("K", 1, 2, "two", "2", 2), ("D", 0)],
]
PLAIN = [
    [("I", k, f"a{k}", None, k) for k in range(7)],
    [("U", k, None, f"b{k}", None) for k in range(0, 7, 3)],
    [("K", 6, 7, "a7", "b7", 7), ("D", 1), ("I", 1, "again", "", 0), ("K", 7, 6, "", "", 0)],
]


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(txns=_history(), split=st.integers(3, 40), cut=st.one_of(st.none(), st.integers(1, 6)))
@example(txns=BOTH, split=4, cut=None)
@example(txns=UNCHANGED_ONLY, split=5, cut=None)
@example(txns=TRUNCATE_ONLY, split=3, cut=None)
@example(txns=PLAIN, split=6, cut=None)
@example(txns=BOTH, split=7, cut=2)  # the second run has the truncate and the 'u' columns
def test_apply_equals_the_model(spark, tmp_path_factory, txns, split, cut):  # noqa: F811
    tmp = tmp_path_factory.mktemp("model")
    out = tmp / "out"
    runs = [txns]
    if cut is not None and len(txns) > 1:
        cut = min(cut, len(txns) - 1)
        runs = [txns[:cut], txns]  # the second capture repeats the first's transactions
    for n, part in enumerate(runs):
        cap = tmp / f"cap{n}.pgcap"
        write_capture(cap, part)
        report = apply_changes(spark, [str(cap)], out, split_records=split)
        check_state(out, part, report)


def test_the_examples_cover_the_guesses():
    """The explicit examples above make apply's guess hold and fail both ways."""
    assert _has(BOTH, "T") and _has(BOTH, U)
    assert _has(UNCHANGED_ONLY, U) and not _has(UNCHANGED_ONLY, "T")
    assert _has(TRUNCATE_ONLY, "T") and not _has(TRUNCATE_ONLY, U)
    assert not _has(PLAIN, "T") and not _has(PLAIN, U)
    assert _has(BOTH[2:], "T") and _has(BOTH[2:], U)


def test_keys_the_type_cannot_hold_stay_apart(spark, tmp_path):  # noqa: F811
    """Key values a Spark type cannot hold (timestamptz ±infinity) are null in the typed
    column with their text in _pg_text; apply tells them apart by that text: inserting
    'infinity', '-infinity' and a plain time keeps three rows, and deleting 'infinity'
    removes that one only (one keyed table: the single pass; two: the cached one)."""

    def tup(*values):
        return pgc.TupleData(
            columns=tuple(
                pgc.TupleColumn(kind="n")
                if v is None
                else pgc.TupleColumn(kind="t", value=v.encode())
                for v in values
            )
        )

    def relation(oid, name):
        return pgc.Relation(
            relation_oid=oid,
            namespace="public",
            relation_name=name,
            replica_identity=ord("d"),
            columns=(
                pgc.RelationColumn(flags=1, name="k", type_oid=1184, type_modifier=-1),
                pgc.RelationColumn(flags=0, name="v", type_oid=25, type_modifier=-1),
            ),
        )

    keys = ["infinity", "-infinity", "2024-01-01 00:00:00+00"]
    for tables in (["inf"], ["inf", "other"]):
        pairs = [(0x100, pgc.Begin(final_lsn=0x900, commit_time=0, xid=9))]
        lsn = 0x200
        for n, name in enumerate(tables):
            pairs.append((0, relation(17000 + n, name)))
            for i, k in enumerate(keys):
                lsn += 0x10
                pairs.append((lsn, pgc.Insert(relation_oid=17000 + n, new_tuple=tup(k, f"v{i}"))))
            lsn += 0x10
            old = tup("infinity", None)
            pairs.append((lsn, pgc.Delete(relation_oid=17000 + n, old_kind="K", old_tuple=old)))
        pairs.append((0x900, pgc.Commit(flags=0, commit_lsn=0x900, end_lsn=0x908, commit_time=0)))
        cap = tmp_path / f"inf{len(tables)}.pgcap"
        capfmt.write(
            cap, capfmt.from_payloads([(x, pgc.encode(m, protocol_version=1)) for x, m in pairs], 1)
        )
        out = tmp_path / f"out{len(tables)}"
        report = apply_changes(spark, [str(cap)], out, split_records=3)
        assert report == {f"public.{t}": 2 for t in tables}
        for t in tables:
            rows = read_table(out / f"public.{t}").to_pylist()
            got = sorted((r["v"], (r["_pg_text"] or [("k", str(r["k"].year))])[0][1]) for r in rows)
            assert got == [("v1", "-infinity"), ("v2", "2024")], t


@pytest.mark.parametrize(
    "txns", [BOTH, UNCHANGED_ONLY, TRUNCATE_ONLY, PLAIN], ids=["both", "u", "truncate", "plain"]
)
def test_scd2_current_rows_equal_the_model(spark, tmp_path, txns):  # noqa: F811
    """SCD2 on one keyed table takes the same single pass on a guess: its current rows are
    the model's state, and no two versions of a key are current."""
    cap = tmp_path / "cap.pgcap"
    write_capture(cap, txns)
    out = tmp_path / "out"
    apply_changes(spark, [str(cap)], out, scd=2, split_records=4)
    rows = [r for r in read_table(out / TABLE).to_pylist() if r["_is_current"]]
    got = {r["id"]: {n: r[n] for n in NAMES} for r in rows}
    assert len(got) == len(rows)
    assert got == {k: row for k, (row, _c, _o) in reference(txns).items()}


def test_a_transaction_committing_at_the_snapshot_point_is_applied(spark, tmp_path):  # noqa: F811
    """A slot sends every transaction whose commit record starts at or after its consistent
    point, and the exported snapshot holds those that committed before it: one committing
    exactly at the point is in the stream only. Loaded in a run of its own, the snapshot must
    leave the table's position before the point, so the next run applies that transaction."""
    import shutil

    a = [("I", 1, "a", "x", 1), ("I", 2, "b", "y", 2)]
    b = [("I", 3, "c", "z", 3), ("U", 1, "a2", "x", 10)]
    (_, commit_a), (_, commit_b) = _lsns([a, b])
    first = tmp_path / "first"  # the rows of the snapshot, committed before the point
    write_capture(tmp_path / "a.pgcap", [a])
    apply_changes(spark, [str(tmp_path / "a.pgcap")], first)
    snap = tmp_path / "snap"
    shutil.copytree(first / TABLE, snap / TABLE)
    (snap / "_snapshot.json").write_text(json.dumps({
        "consistent_point": format_lsn(commit_b), "keys": {TABLE: ["id"]}, "tables": {TABLE: 2},
    }))  # fmt: skip
    out = tmp_path / "out"
    apply_changes(spark, [], out, snapshot=str(snap))  # the snapshot alone: a cycle of sync
    write_capture(tmp_path / "ab.pgcap", [a, b])  # the slot's stream (a is before the point)
    apply_changes(spark, [str(tmp_path / "ab.pgcap")], out)
    rows = {r["id"]: (r["a"], r["c"]) for r in read_table(out / TABLE).to_pylist()}
    assert rows == {1: ("a2", 10), 2: ("b", 2), 3: ("c", 3)}
    assert commit_a < commit_b
