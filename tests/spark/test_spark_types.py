"""pgcdc.spark.types: the mapping table and the side column for values a type cannot hold
(the real-server round trip is tests/apply/test_apply_postgres.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import types as T  # noqa: E402

from pgcdc.spark.types import RowConverter, numeric_precision_scale, spark_type  # noqa: E402
from pgcdc.values import UNCHANGED, OutOfRange  # noqa: E402


def typmod(p, s):  # as PostgreSQL's numeric_typmod_in builds it
    return ((p << 16) | (s & 0x7FF)) + 4


def test_mapping_table():
    assert spark_type(1700, typmod(12, 3)) == T.DecimalType(12, 3)
    assert spark_type(1700, typmod(39, 0)) == T.StringType()
    assert spark_type(1700, typmod(5, -2)) == T.StringType()
    assert spark_type(1700) == T.StringType()
    assert spark_type(1184) == T.TimestampType() and spark_type(1114) == T.TimestampNTZType()
    assert spark_type(1007) == T.ArrayType(T.IntegerType())
    assert spark_type(3802) == T.StringType() and spark_type(987654) == T.StringType()
    assert numeric_precision_scale(typmod(5, -2)) == (5, -2)


def test_side_column_keeps_what_the_type_cannot_hold():
    conv = RowConverter(
        ["ts", "grid", "d", "doc"], [1184, 1007, 1700, 25], [-1, -1, typmod(5, 2), -1]
    )
    values, special = conv.convert(
        [OutOfRange(1184, "-infinity"), [[1, 2]], Decimal("NaN"), UNCHANGED]
    )
    assert values == [None, None, None, None]
    assert special == {"ts": "-infinity", "grid": "[[1,2]]", "d": "NaN"}


def _catalog():
    from pgcdc.values import Catalog

    cat = Catalog()
    entries = [
        {"oid": 70_001, "kind": "enum", "name": "mood", "labels": ["sad", "ok"]},
        {"oid": 70_002, "kind": "array", "name": "_mood", "element_oid": 70_001},
        {"oid": 70_003, "kind": "domain", "name": "money2", "base_oid": 1700},
        {"oid": 70_004, "kind": "composite", "name": "pair",
         "fields": [["a", 23], ["b", 25], ["m", 70_001], ["d", 70_003], ["ts", 1184]]},
        {"oid": 70_005, "kind": "composite", "name": "outer",
         "fields": [["p", 70_004], ["ps", 70_006], ["when", 1114]]},
        {"oid": 70_006, "kind": "array", "name": "_pair", "element_oid": 70_004},
        {"oid": 70_007, "kind": "composite", "name": "empty", "fields": []},
        {"oid": 70_008, "kind": "range", "name": "intr", "subtype_oid": 23},
        {"oid": 70_009, "kind": "domain", "name": "ints", "base_oid": 1007},
    ]  # fmt: skip
    cat.add_entries(entries)
    return cat, [e["oid"] for e in entries] + [99_999]  # and one no entry describes


def test_the_arrow_types_are_sparks_own_arrow_types():
    """pg_arrow_type (no Spark imported) gives, for every built-in type and the catalog's
    kinds, the Arrow type Spark itself exchanges with Python for spark_type's type
    (pyspark.sql.pandas.types.to_arrow_type); so do a table's columns and the operations'
    schema the driver's cycles build without Spark."""
    from psycopg import postgres
    from pyspark.sql.pandas.types import to_arrow_type

    from pgcdc.apply.ops import ops_arrow_schema, ops_schema
    from pgcdc.spark.types import pg_arrow_type
    from pgcdc.spark.units import TableSchema

    def spark_arrow(dt):
        return to_arrow_type(dt, timezone="UTC")

    oids = {o for info in postgres.types for o in (info.oid, info.array_oid) if o}
    mods = [-1, typmod(12, 3), typmod(38, 38), typmod(39, 0), typmod(5, -2), typmod(3, 5)]
    assert len(oids) > 150
    for oid in sorted(oids):
        for mod in mods if oid in (1700, 1231) else [-1]:
            assert pg_arrow_type(oid, mod) == spark_arrow(spark_type(oid, mod)), (oid, mod)
    cat, cat_oids = _catalog()
    for oid in cat_oids:
        for mod in (-1, typmod(10, 2)):
            want = spark_arrow(spark_type(oid, mod, cat))
            assert pg_arrow_type(oid, mod, cat) == want, (oid, mod)
    # a table's columns (one whose type changed between Relation messages: text)
    ts = TableSchema("public", "t", names=["id", "p", "n", "x"], type_oids=[20, 70_005, 1700, 23],
                     typmods=[-1, -1, typmod(9, 2), -1], conflicts={"x"}, catalog=cat)  # fmt: skip
    assert ts.columns_struct("arrow") == spark_arrow(ts.columns_struct())
    other = TableSchema("s", "u", names=["k", "a"], type_oids=[25, 70_002], typmods=[-1, -1],
                        catalog=cat)  # fmt: skip
    tables = {"public.t": ts, "s.u": other}
    want = [spark_arrow(f.dataType) for f in ops_schema(tables).fields]
    got = ops_arrow_schema(tables)
    assert [f.type for f in got] == want
    assert got.names == ops_schema(tables).names and all(f.nullable for f in got)
