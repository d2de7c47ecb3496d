"""The table of every built-in type and its edge values (tests/values/test_values_live.py,
tests/snapshot/test_snapshot_types.py)."""

from __future__ import annotations


# (SQL type, literals, first server major that has the type or these literals)
BIG = "repeat('ünï 𝄞 ', 30000)"


TYPES: list[tuple[str, list[str], int]] = [
    ("bool", ["true", "false"], 15),
    ("bytea", ["'\\x'", "'\\x00ff10'", "decode(repeat('ab', 5000), 'hex')"], 15),
    # bytes above 0x7F print as \ooo (octal), the zero byte as '' (charout, PG 15+)
    ('"char"', ["'a'", "'Z'", "'\\200'", "'\\303'", "'\\377'", "''"], 15),
    ("name", ["'abc'", "'ünïcode'"], 15),
    ("int2", ["0", "-32768", "32767"], 15),
    ("int4", ["0", "-2147483648", "2147483647"], 15),
    ("int8", ["0", "-9223372036854775808", "9223372036854775807"], 15),
    ("text", ["''", "'hello'", "'ünïcödé ✓ 𝄞'", "'q\"uo''te\\back'", BIG], 15),
    ("oid", ["0", "4294967295"], 15),
    ("tid", ["'(0,1)'", "'(4294967295,65535)'"], 15),
    ("xid", ["'0'", "'4294967295'"], 15),
    ("cid", ["'0'", "'4294967295'"], 15),
    ("xid8", ["'0'", "'18446744073709551615'"], 15),
    (
        "json",
        [
            """'{"a": 1.10, "b": [1, null, "x", 2e400], "c": {"d": true}}'""",
            "'[]'",
            """'"str"'""",
            "'123456789012345678901234567890.5'",
            """'{"dup": 1, "dup": 2}'""",
        ],
        15,
    ),
    ("xml", ["'<a>x</a>'", "'text &amp; <b/>'"], 15),
    (
        "point",
        [
            "'(1e15,0.0001)'",
            "'(1,2)'",
            "'(1.5,-2.25e20)'",
            "'(NaN,Infinity)'",
            "'(1e-5,123456789012345)'",
        ],
        15,
    ),
    ("lseg", ["'[(1,2),(3,4)]'"], 15),
    ("path", ["'[(1,2),(3,4)]'", "'((0,0),(1,1),(2,0))'"], 15),
    ("box", ["'(3,4),(1,2)'", "'(0.5,0.25),(-1,-2)'"], 15),
    ("polygon", ["'((0,0),(1,1),(2,0))'"], 15),
    ("line", ["'{1,-1,0}'", "'{0.5,2,-3.25}'"], 15),
    (
        "float4",
        [
            "1.1",
            "0",
            "'-0'",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "3.4028235e38",
            "1e-45",
            "123456.7",
        ],
        15,
    ),
    (
        "float8",
        [
            "0.1",
            "1e15",
            "1e-5",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1.7976931348623157e308",
            "5e-324",
            "123456789.123",
        ],
        15,
    ),
    ("circle", ["'<(1,2),3>'"], 15),
    ("macaddr8", ["'08:00:2b:01:02:03:04:05'"], 15),
    ("money", ["'1000.5'", "'-92233720368547758.08'", "'0'"], 15),
    ("macaddr", ["'08:00:2b:01:02:03'"], 15),
    ("inet", ["'192.168.0.1'", "'192.168.0.1/24'", "'::1'", "'2001:db8::1/64'"], 15),
    ("cidr", ["'10.0.0.0/8'", "'2001:db8::/32'"], 15),
    ("aclitem", ["'postgres=arwdDxt/postgres'", "'=r/postgres'"], 15),
    ("char(5)", ["'ab'", "'ünï'"], 15),
    ("varchar", ["'x'", "'ünï'"], 15),
    (
        "date",
        [
            "'2020-02-29'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 BC'",
            "'10000-01-01'",
            "'0001-01-01'",
            "'9999-12-31'",
            "'4713-01-01 BC'",
            "'5874897-12-31'",
        ],
        15,
    ),
    ("time", ["'00:00:00'", "'12:34:56.789'", "'24:00:00'", "'23:59:59.999999'"], 15),
    (
        "timestamp",
        [
            "'2020-02-29 12:34:56.5'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 10:00 BC'",
            "'10000-01-01 00:00'",
            "'294276-12-31 23:59:59.999999'",
            "'4713-01-01 00:00 BC'",
            "'1999-12-31 23:59:59.999999'",
        ],
        15,
    ),
    (
        "timestamptz",
        [
            "'2020-02-29 12:34:56.5+02'",
            "'infinity'",
            "'-infinity'",
            "'0044-03-15 10:00+00 BC'",
            "'10000-01-01 00:00+00'",
            "'9999-12-31 23:00:00+00'",
            "'0001-01-01 00:00:00+00'",
            "'2000-01-01 00:00:00.000001+05:30'",
        ],
        15,
    ),
    (
        "interval",
        [
            "'1 year 2 mons 3 days 04:05:06.5'",
            "'-1 days +02:00:00'",
            "'0'",
            "'-00:00:00.000001'",
            "'178000000 years'",
            "'1 mon -1 days'",
            "'100 days 100:00:00'",
            "'-1 years -2 mons'",
        ],
        15,
    ),
    ("interval", ["'infinity'", "'-infinity'", "'1 day'"], 17),
    ("timetz", ["'12:00:00+05:30'", "'00:00:00-14:59'", "'24:00:00+00'", "'12:00+05:53:28'"], 15),
    ("bit(4)", ["B'1010'", "B'0001'"], 15),
    ("varbit", ["B''", "B'1'", "B'101010101'"], 15),
    (
        "numeric",
        [
            "0",
            "1.50",
            "-1234567890.0123456789",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1e-300",
            "0.0000000",
            "repeat('9', 1000)::numeric",
            "1e20",
        ],
        15,
    ),
    ("refcursor", ["'cur'"], 15),
    ("regproc", ["'now'"], 15),
    ("regprocedure", ["'sum(int4)'"], 15),
    ("regoper", ["'||/'"], 15),
    ("regoperator", ["'+(int4,int4)'"], 15),
    ("regclass", ["'pg_class'"], 15),
    ("regtype", ["'int4'"], 15),
    ("regconfig", ["'english'"], 15),
    ("regdictionary", ["'simple'"], 15),
    ("regnamespace", ["'pg_catalog'"], 15),
    ("regrole", ["'postgres'"], 15),
    ("regcollation", ["'\"C\"'"], 15),
    (
        "uuid",
        ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"],
        15,
    ),
    ("txid_snapshot", ["'10:20:10,14,15'", "'10:10:'"], 15),
    ("pg_snapshot", ["'10:20:10,14,15'"], 15),
    ("pg_lsn", ["'16/B374D848'", "'0/0'", "'FFFFFFFF/FFFFFFFF'"], 15),
    ("tsvector", ["$$a fat cat:1A,2B sat's:3 back\\\\slash:4C$$", "''"], 15),
    (
        "tsquery",
        [
            "'fat & (rat | cat)'",
            "'!a <-> b:*AB'",
            "'a <2> b & c'",
            "'(a | b) <-> c'",
            "'!(a & b)'",
            "'a <-> (b <-> c)'",
        ],
        15,
    ),
    ("jsonb", ["""'{"a": 1.10, "n": null, "s": "ü"}'""", "'1e-7'", "'true'", "'[1, [2, []]]'"], 15),
    ("jsonpath", ["'$.a[*] ? (@ > 1)'", "'strict $.b'"], 15),
    ("int2vector", ["'1 2 3'", "''"], 15),
    ("oidvector", ["'1 2'"], 15),
    ("int4range", ["'[1,5)'", "'empty'", "'(,)'", "'[,3]'"], 15),
    ("int8range", ["'[1,9223372036854775806]'"], 15),
    ("numrange", ["'[1.5,2.50]'", "'(,0)'"], 15),
    (
        "tsrange",
        ["'[2020-01-01,infinity)'", "'[-infinity,\"2020-01-01 10:00\"]'", "'[0044-03-15 BC,)'"],
        15,
    ),
    ("tstzrange", ['\'["2020-01-01 00:00+02","2021-01-01 00:00+00")\''], 15),
    ("daterange", ["'[2020-01-01,2020-02-01)'", "'[-infinity,infinity)'"], 15),
    ("int4multirange", ["'{[1,3), [5,7)}'", "'{}'"], 15),
    ("int8multirange", ["'{[1,3)}'"], 15),
    ("nummultirange", ["'{[1.5,2.5], (3,)}'"], 15),
    ("tsmultirange", ["'{[2020-01-01,2020-01-02)}'"], 15),
    ("tstzmultirange", ["'{[2020-01-01 00:00+00,infinity)}'"], 15),
    ("datemultirange", ["'{[2020-01-01,2020-01-05), [2020-02-01,)}'"], 15),
]


# aclitem has no binary send function: pgoutput sends a scalar aclitem as text in a binary
# slot, but an aclitem[] fails the whole binary slot ("no binary output function available for
# type aclitem"), so no aclitem[] column.
NO_ARRAY = {"aclitem"}


def _column_types(major: int, has_xml: bool) -> list[tuple[str, str, list[str]]]:
    """(column name, SQL type, literals): one scalar and one array column per type."""
    merged: dict[str, list[str]] = {}
    for sql_type, literals, since in TYPES:
        if major >= since and (has_xml or sql_type != "xml"):
            merged.setdefault(sql_type, []).extend(literals)
    cols = []
    for i, (sql_type, literals) in enumerate(merged.items()):
        cols.append((f"c{i}", sql_type, literals))
    return cols


def _array_literal(sql_type: str, literals: list[str], row: int) -> str | None:
    """Row 0: every value plus a NULL element; 1: empty; 2: a 2x2 array; 3: NULL elements only;
    4: dimensions with a non-default lower bound."""
    base = sql_type
    values = [f"({v})::{base}" for v in literals if v != BIG]
    if row == 0:
        return f"ARRAY[{', '.join(values + ['NULL'])}]::{base}[]"
    if row == 1:
        return f"'{{}}'::{base}[]"
    if row == 2:
        a, b = values[0], values[-1]
        return f"ARRAY[[{a}, {b}], [{b}, NULL]]::{base}[]"
    if row == 3:
        return f"ARRAY[NULL, NULL]::{base}[]"
    if row == 4:
        return f"array_fill({values[0]}, ARRAY[2, 1], ARRAY[3, -1])"
    return None


def _has_xml(conn) -> bool:
    """The PyPI server builds have no libxml: their xml type rejects every value."""
    try:
        conn.execute("SELECT '<a/>'::xml")
        return True
    except Exception:
        return False


# Types that are not built in: a Catalog from pg_type says how to load them.
CUSTOM_SQL = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ü')",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE DOMAIN cents AS numeric(10, 2)",
    "CREATE DOMAIN when_d AS timestamptz",
    "CREATE TYPE pair AS (a int, b text)",
    "CREATE TABLE custom (id int PRIMARY KEY, m mood, p posint, n cents, t when_d,"
    " ms mood[], ps posint[], pr pair)",
]


CUSTOM_ROWS = [
    "INSERT INTO custom VALUES (1, 'ok', 5, 1.5, 'infinity', '{sad,NULL,\"happy ü\"}',"
    " '{1,2}', '(1,x)')",
    "INSERT INTO custom (id) VALUES (2)",
    "INSERT INTO custom VALUES (3, 'happy ü', 2147483647, -0.01, '2020-01-01 00:00+00', '{}',"
    " '{}', '(,)')",
]
