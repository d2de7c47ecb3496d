"""apply on a table without a key (a multiset of rows), from a capture made with the codec:
the rows it keeps, and the error naming the LSN of a delete that has no old row image (the
LSN is not in apply's cache of the events: it is looked up in the captures again)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

import pgoutput_codec as pgc  # noqa: E402
from pgoutput_codec import capture as capfmt  # noqa: E402

from pgcdc.lsn import format_lsn  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.apply.state import ApplyError  # noqa: E402
from tests.support.delta import read_table  # noqa: E402

OID = 16500


def _tup(*values):
    return pgc.TupleData(
        columns=tuple(pgc.TupleColumn(kind="t", value=str(v).encode()) for v in values)
    )


def _capture(path, changes):
    """One transaction of ``changes`` ((lsn, message) pairs) on table public.bag (a, b),
    REPLICA IDENTITY DEFAULT without a primary key: no key."""
    rel = pgc.Relation(
        relation_oid=OID,
        namespace="public",
        relation_name="bag",
        replica_identity=ord("d"),
        columns=(
            pgc.RelationColumn(flags=0, name="a", type_oid=23, type_modifier=-1),
            pgc.RelationColumn(flags=0, name="b", type_oid=25, type_modifier=-1),
        ),
    )
    final = 0x5000
    pairs = [
        (0x1000, pgc.Begin(final_lsn=final, commit_time=0, xid=700)),
        (0, rel),
        *changes,
        (final, pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=0)),
    ]
    encoded = [(lsn, pgc.encode(m, protocol_version=1)) for lsn, m in pairs]
    capfmt.write(path, capfmt.from_payloads(encoded, 1))


def test_keyless_rows_are_a_multiset(spark, tmp_path):  # noqa: F811
    cap = tmp_path / "bag.pgcap"
    _capture(
        cap,
        [
            (0x1100, pgc.Insert(relation_oid=OID, new_tuple=_tup(1, "x"))),
            (0x1200, pgc.Insert(relation_oid=OID, new_tuple=_tup(1, "x"))),
            (0x1300, pgc.Insert(relation_oid=OID, new_tuple=_tup(2, "y"))),
            (0x1400, pgc.Delete(relation_oid=OID, old_kind="O", old_tuple=_tup(1, "x"))),
        ],
    )
    report = apply_changes(spark, [str(cap)], tmp_path / "out")
    assert report == {"public.bag": 2}
    rows = read_table(tmp_path / "out" / "public.bag").select(["a", "b"]).to_pylist()
    assert sorted(map(tuple, (r.values() for r in rows))) == [(1, "x"), (2, "y")]


def test_delete_without_old_row_names_its_lsn(spark, tmp_path):  # noqa: F811
    cap = tmp_path / "bag.pgcap"
    _capture(
        cap,
        [
            (0x1100, pgc.Insert(relation_oid=OID, new_tuple=_tup(1, "x"))),
            (0x1234, pgc.Delete(relation_oid=OID, old_kind="K", old_tuple=_tup(1, "x"))),
        ],
    )
    with pytest.raises(ApplyError, match=f"a delete at LSN {format_lsn(0x1234)} has no old"):
        apply_changes(spark, [str(cap)], tmp_path / "out")
    assert not (tmp_path / "out" / "public.bag").exists()


def test_scd2_refuses_a_table_without_a_key(spark, tmp_path):  # noqa: F811
    # SCD2 closes a row's version by its key: without one it has nothing to close by
    cap = tmp_path / "bag.pgcap"
    _capture(cap, [(0x1100, pgc.Insert(relation_oid=OID, new_tuple=_tup(1, "x")))])
    with pytest.raises(ApplyError, match="public.bag: SCD2 needs a key"):
        apply_changes(spark, [str(cap)], tmp_path / "out", scd=2)
    assert not (tmp_path / "out" / "public.bag").exists()
