"""apply's model (the transactions folded over a dict key -> row) and the tuples and captures of
its one keyed table: tests/apply/test_apply_model.py, test_apply_driver.py, test_apply_ops.py,
test_delta_apply.py, tests/events/test_summary_cache.py."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import pgoutput_codec as pgc  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pgoutput_codec import capture as capfmt  # noqa: E402
import json  # noqa: E402
import pytest  # noqa: E402
from pgcdc.lsn import format_lsn  # noqa: E402
from pgcdc.apply.state import STATE_FILE  # noqa: E402
from tests.support.delta import read_table  # noqa: E402


UNCHANGED = "<unchanged>"  # the strategies' marker of a 'u' column (never a drawn text)


def _tuple(values):
    cols = []
    for v in values:
        if v is None:
            cols.append(pgc.TupleColumn(kind="n"))
        elif v == UNCHANGED:
            cols.append(pgc.TupleColumn(kind="u"))
        else:
            cols.append(pgc.TupleColumn(kind="t", value=str(v).encode()))
    return pgc.TupleData(columns=tuple(cols))


OID = 16700


TABLE = "public.m"


# (name, type oid, key); a and b are the TOASTable ones
COLUMNS = (("id", 23, True), ("a", 25, False), ("b", 25, False), ("c", 23, False))


NAMES = [n for n, _t, _k in COLUMNS]


U = UNCHANGED  # a 'u' column (unchanged TOAST) in a generated update


KEYS = range(8)


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


# a run with both: apply's guess (no truncate, no 'u') fails and the table is written again
BOTH = [
    [("I", 1, "a1", "b1", 1), ("I", 2, "a2", "b2", 2), ("I", 3, None, "b3", 3)],
    [("U", 1, U, "B1", 10), ("K", 2, 5, "a5", "b5", 5), ("D", 3)],
    [("T",), ("I", 2, "x", "y", None), ("U", 2, U, U, 7)],
    [("I", 4, "a4", None, 4), ("U", 4, U, "bb", 4)],
    [("K", 4, 6, "a6", "b6", 6), ("U", 6, U, U, 66), ("U", 2, "z", U, 2)],
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
