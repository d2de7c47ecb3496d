"""Arrow's casts of text values (pgcdc.spark.text_arrow) against the exact path, on text a real
PostgreSQL 18 printed.

The exact path is what a change event's value goes through: ``pgcdc.values.RowLoader`` (psycopg's
loaders) then the column's converter (``pgcdc.spark.types.value_converter``, a value Spark's type
cannot hold becoming NULL plus its text). For every type ``text_array`` handles, on values the
server printed (edge values, values it generated at random, timestamptz under several time
zones, with NULLs):

- common values: ``text_array`` makes the column, equal value by value (NaN to NaN, -0.0 to -0.0);
- any column: it makes it equal, or it says no (None); never a value where the exact path
  keeps the text aside.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from psycopg import pq

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pgcdc.spark import types as pgtypes  # noqa: E402
from pgcdc.spark.table_batches import arrow_type  # noqa: E402
from pgcdc.spark.text_arrow import handles, text_array  # noqa: E402
from pgcdc.values import RowLoader  # noqa: E402

# (SQL type, values every path must type in Arrow, values that may go the exact way)
CASES = [
    ("bool", ["true", "false"], []),
    ("int2", ["0", "-32768", "32767"], []),
    ("int4", ["0", "-2147483648", "2147483647"], []),
    ("int8", ["0", "-9223372036854775808", "9223372036854775807"], []),
    ("oid", ["0", "4294967295"], []),
    ("xid", ["'0'", "'4294967295'"], []),
    (
        "float4",
        [
            "0",
            "'-0'",
            "1.1",
            "'3.4028235e38'",
            "'1e-45'",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "0.1",
        ],
        [],
    ),  # fmt: skip
    (
        "float8",
        [
            "0",
            "'-0'",
            "0.1",
            "'1.7976931348623157e308'",
            "'5e-324'",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1e100",
        ],
        [],
    ),  # fmt: skip
    (
        "numeric(12,2)",
        ["0", "-0.5", "1234567890.12", "-1234567890.99", "0.01"],
        ["'NaN'"],
    ),  # fmt: skip  (a typmod refuses infinity)
    ("numeric(38,10)", ["0", "1234567890123456789012345678.0123456789", "-1e-10"], ["'NaN'"]),
    ("text", ["''", "'hello'", "'ünïcödé ✓ 𝄞'", "'tab\there'", "repeat('x', 5000)"], []),
    ("varchar(10)", ["''", "'abc'"], []),
    ("bpchar(5)", ["'ab'", "'abcde'"], []),
    ("name", ["'abc'", "'ünïcode'"], []),
    (
        "date",
        ["'2024-02-29'", "'0001-01-01'", "'9999-12-31'", "'1970-01-01'"],
        ["'infinity'", "'-infinity'", "'0044-03-15 BC'", "'10000-01-01'"],
    ),  # fmt: skip
    (
        "timestamp",
        [
            "'2024-02-29 12:34:56.789012'",
            "'0001-01-01 00:00:00'",
            "'9999-12-31 23:59:59.999999'",
            "'2000-01-01 00:00:00.5'",
        ],
        ["'infinity'", "'-infinity'", "'0044-03-15 12:00 BC'", "'10000-01-01 00:00'"],
    ),  # fmt: skip
    (
        "timestamptz",
        [
            "'2024-02-29 12:34:56.789012+00'",
            "'2000-01-01 00:00:00.5+05:30'",
            "'1999-12-31 23:59:59-03:30'",
        ],
        [
            "'infinity'",
            "'-infinity'",
            "'0001-01-01 00:00:00+00'",
            "'9999-12-31 23:59:59+00'",
            "'1890-01-01 00:00:00+00'",
            "'0044-03-15 12:00+00 BC'",
            # in UTC before year 1 or after 9999, printed in a zone without seconds in its offset
            "'0001-01-01 03:00:00+14'",
            "'9999-12-31 23:00:00-12'",
        ],
    ),  # fmt: skip
]
# timestamptz prints in the session's zone: offsets of half hours, and local mean time with
# seconds (Amsterdam before 1937), fixed offsets of whole hours (years 1 and 9999 in them)
ZONES = ["UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Amsterdam", "Pacific/Kiritimati",
         "Etc/GMT-14", "Etc/GMT+12"]  # fmt: skip
# values the server makes at random, per type (SQL over g in 1..N)
RANDOM = {
    "int8": "(random() * 2 ^ 62)::int8 * (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END)",
    "float8": "((random() - 0.5) * 10 ^ (random() * 600 - 300))::float8",
    "float4": "((random() - 0.5) * 10 ^ (random() * 70 - 35))::float4",
    "numeric(12,2)": "round(((random() - 0.5) * 10 ^ (random() * 10))::numeric, 2)",
    "timestamptz": "'0001-01-02'::timestamptz + random() * interval '3652000 days'",
    "timestamp": "'0001-01-01'::timestamp + random() * interval '3652000 days'",
    "date": "'0001-01-01'::date + (random() * 3652000)::int",
    "text": "md5(g::text) || repeat('é', g % 7)",
}


@pytest.fixture(scope="module")
def pg(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("SELECT setseed(0.25)")
        yield conn


def _texts(conn, sql_type: str, exprs: list[str], zone: str = "UTC") -> list[bytes | None]:
    """The server's text of each value (its output function), and a NULL."""
    conn.execute(f"SET TimeZone = '{zone}'")
    return [*(_printed(conn, f"SELECT ({e})::{sql_type}")[0] for e in exprs), None]


def _printed(conn, sql: str) -> list[bytes]:
    """The first column of ``sql``'s rows in the text format (the type's output function, as
    pgoutput sends it; ``::text`` differs for bool)."""
    res = conn.pgconn.exec_(sql.encode())
    assert res.status == pq.ExecStatus.TUPLES_OK, res.error_message
    return [res.get_value(i, 0) for i in range(res.ntuples)]


def _oid_typmod(conn, sql_type: str) -> tuple[int, int]:
    conn.execute("DROP TABLE IF EXISTS tmp_types")
    conn.execute(f"CREATE TEMP TABLE tmp_types (c {sql_type})")
    return conn.execute(
        "SELECT atttypid::int, atttypmod FROM pg_attribute"
        " WHERE attrelid = 'tmp_types'::regclass AND attname = 'c'"
    ).fetchone()


class _Column(NamedTuple):  # a TupleData column, as the codec decodes it
    kind: str
    value: bytes | None


def _exact(values, oid, typmod, target):
    """(the exact path's array, whether it kept any value's text aside)."""
    loader = RowLoader([oid])
    # a row at a time, as a change's values load when a column at a time will not
    loaded = [loader.load([_Column("n" if v is None else "t", v)])[0] for v in values]
    convert = pgtypes.value_converter(oid, typmod)
    out, aside = [], False
    for v in loaded:
        if v is None:
            out.append(None)
            continue
        try:
            out.append(convert(v))
        except pgtypes.Unrepresentable:
            out.append(None)
            aside = True
    return pa.array(out, target), aside


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def _check(values, oid, typmod, must: bool):
    target = arrow_type(pgtypes.spark_type(oid, typmod))
    assert handles(oid, typmod, target)
    exact, aside = _exact(values, oid, typmod, target)
    fast = text_array(values, oid, typmod, target)
    if must:
        assert fast is not None, values
    if fast is None:
        return False
    assert not aside, f"values kept aside by the exact path were typed: {values}"
    assert fast.type == exact.type
    got, want = fast.to_pylist(), exact.to_pylist()
    bad = [(v, g, w) for v, g, w in zip(values, got, want) if not _same(g, w)]
    assert not bad, bad[:5]
    return True


@pytest.mark.parametrize("sql_type,common,special", CASES, ids=[c[0] for c in CASES])
def test_arrow_types_the_server_text_as_the_exact_path(pg, sql_type, common, special):
    oid, typmod = _oid_typmod(pg, sql_type)
    zones = ZONES if sql_type == "timestamptz" else ["UTC"]
    for zone in zones:
        values = _texts(pg, sql_type, common, zone)
        _check(values, oid, typmod, must=True)
        refused = 0
        for e in special:
            alone = _texts(pg, sql_type, [e, *common], zone)
            refused += not _check(alone, oid, typmod, must=False)
        if special and zone == "UTC":
            assert refused, "no special value took the exact path: the test checks nothing"


@pytest.mark.parametrize("sql_type", sorted(RANDOM))
def test_arrow_types_random_server_values_as_the_exact_path(pg, sql_type):
    oid, typmod = _oid_typmod(pg, sql_type)
    for zone in ZONES if sql_type == "timestamptz" else ["UTC"]:
        pg.execute(f"SET TimeZone = '{zone}'")
        values = _printed(
            pg, f"SELECT ({RANDOM[sql_type]})::{sql_type} FROM generate_series(1, 2000) g"
        )
        typed = 0
        for i in range(0, len(values), 200):
            typed += _check([*values[i : i + 200], None], oid, typmod, must=False)
        if zone == "UTC":
            assert typed, f"{sql_type}: no block was typed by Arrow"


def test_columns_it_does_not_handle_say_so():
    assert not handles(pgtypes.NUMERIC, -1, pa.string())  # unconstrained: text, its own digits
    assert not handles(pgtypes.JSONB, -1, pa.string())
    assert not handles(pgtypes.INT4, -1, pa.string())  # a column retyped: text
    assert text_array([b"1"], pgtypes.INT4, -1, pa.string()) is None
    assert text_array([b"x"], pgtypes.BOOL, -1, pa.bool_()) is None
    assert text_array([b"\xff"], pgtypes.TEXT, -1, pa.string()) is None
