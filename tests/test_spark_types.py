"""pgcdc.spark.types: the mapping table and the side column for values a type cannot hold
(the real-server round trip is tests/test_apply_postgres.py)."""

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
