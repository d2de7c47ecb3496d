"""pgcdc.values without a server: the sentinels, strict and lenient loading errors, UNCHANGED
versus NULL, and the Catalog. (Values against real servers: tests/values/test_values_live.py.)

Binary inputs are made with psycopg's own dumpers, an implementation independent of the code
under test."""

from __future__ import annotations

import copy
import math
import pickle
import struct
from datetime import date, timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg import pq
from psycopg.types.range import Range

import pgoutput_codec as pgc
from pgcdc.values import (
    UNCHANGED,
    Catalog,
    Float4Range,
    OutOfRange,
    PgInterval,
    RawValue,
    RowLoader,
    ValueLoadError,
    dumps,
    dumps_row,
    range_text,
    to_json_value,
)
from pgcdc.values._json import dumps_row_stdlib

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

INT4, TEXT, NUMERIC, DATE, INT4_ARRAY = 23, 25, 1700, 1082, 1007


def col(kind: str, value: bytes | None = None) -> pgc.TupleColumn:
    return pgc.TupleColumn(kind=kind, value=value)


def binary(oid: int, value) -> bytes:
    dumper = psycopg.adapters.get_dumper_by_oid(oid, pq.Format.BINARY)(type(value))
    return bytes(dumper.dump(value))


# --- sentinels -------------------------------------------------------------------------------


def test_unchanged_is_a_singleton_that_is_not_none():
    assert UNCHANGED is not None
    assert UNCHANGED != None  # noqa: E711 - the point of the test
    assert repr(UNCHANGED) == "UNCHANGED"
    assert type(UNCHANGED)() is UNCHANGED
    assert pickle.loads(pickle.dumps(UNCHANGED)) is UNCHANGED
    assert copy.deepcopy(UNCHANGED) is UNCHANGED
    with pytest.raises(TypeError, match="is UNCHANGED"):
        bool(UNCHANGED)


def test_unchanged_and_null_load_differently_in_every_slot_format():
    loader = RowLoader([INT4, TEXT, TEXT])
    assert loader.load([col("t", b"7"), col("u"), col("n")]) == (7, UNCHANGED, None)
    got = loader.load([col("b", binary(INT4, 7)), col("n"), col("u")])
    assert got == (7, None, UNCHANGED) and got[2] is UNCHANGED and got[1] is None
    got = loader.load([col("b", binary(INT4, 7)), col("t", b"x"), col("u")])  # mixed row
    assert got == (7, "x", UNCHANGED)
    values, errors = loader.load_lenient([col("u"), col("n"), col("u")])
    assert values[0] is UNCHANGED and values[1] is None and values[2] is UNCHANGED
    assert errors == []


def test_unchanged_has_no_json_value():
    with pytest.raises(ValueError, match="UNCHANGED"):
        to_json_value(UNCHANGED)
    with pytest.raises(ValueError, match="UNCHANGED"):
        dumps_row(["a"], [UNCHANGED], [TEXT])


def test_out_of_range_and_interval_values():
    inf = OutOfRange(DATE, "infinity")
    assert inf.is_infinite and not OutOfRange(DATE, "10000-01-01").is_infinite
    assert inf == OutOfRange(DATE, "infinity") and hash(inf) == hash(OutOfRange(DATE, "infinity"))
    iv = PgInterval(14, 3, 5_000_000)
    # psycopg's rule: a year is 365 days, a month 30
    assert iv == timedelta(days=365 + 60 + 3, seconds=5)
    assert str(iv) == "1 year 2 mons 3 days 00:00:05"
    assert pickle.loads(pickle.dumps(iv)) == iv and pickle.loads(pickle.dumps(iv)).months == 14


def test_loading_infinity_and_bc_dates_never_raises():
    loader = RowLoader([DATE, DATE, DATE])
    text = loader.load([col("t", b"infinity"), col("t", b"0044-03-15 BC"), col("t", b"2020-02-29")])
    inf = struct.pack("!i", 0x7FFFFFFF)  # date_send of 'infinity' (DATEVAL_NOEND)
    day = binary(DATE, date(2020, 2, 29))
    binary_row = loader.load([col("b", inf), col("t", b"0044-03-15 BC"), col("b", day)])
    assert text[0] == binary_row[0] == OutOfRange(DATE, "infinity")
    assert text[1] == binary_row[1] == OutOfRange(DATE, "0044-03-15 BC")
    assert text[2] == binary_row[2] == date(2020, 2, 29)


# --- errors ----------------------------------------------------------------------------------


def test_corrupt_binary_int4_raises_with_the_column():
    loader = RowLoader([TEXT, INT4])
    with pytest.raises(ValueLoadError) as info:
        loader.load([col("t", b"ok"), col("b", b"\x00\x01\x02")])  # 3 bytes, not 4
    err = info.value
    assert (err.column, err.type_oid, err.kind) == (1, INT4, "b")
    assert "column 1" in str(err) and "4 bytes, got 3" in str(err)


def test_bad_utf8_text_raises_with_the_column():
    loader = RowLoader([INT4, TEXT])
    with pytest.raises(ValueLoadError) as info:
        loader.load([col("t", b"1"), col("t", b"caf\xe9")])
    assert (info.value.column, info.value.type_oid, info.value.kind) == (1, TEXT, "t")
    assert "utf-8" in str(info.value)


def test_bad_text_number_raises():
    with pytest.raises(ValueLoadError) as info:
        RowLoader([INT4]).load([col("t", b"12abc")])
    assert info.value.column == 0 and info.value.kind == "t"


def test_lenient_keeps_raw_values_and_lists_errors():
    loader = RowLoader([INT4, TEXT, NUMERIC, INT4])
    row = [col("b", b"\x01"), col("t", b"\xff\xfe"), col("t", b"1.50"), col("u")]
    values, errors = loader.load_lenient(row)
    assert values == (
        RawValue("b", b"\x01", INT4),
        RawValue("t", b"\xff\xfe", TEXT),
        Decimal("1.50"),
        UNCHANGED,
    )
    assert [(e.column, e.type_oid, e.kind) for e in errors] == [(0, INT4, "b"), (1, TEXT, "t")]
    assert all(isinstance(e, ValueError) for e in errors)
    # a raw value still renders: text as its text, binary as \x hex
    assert to_json_value(values[0]) == "\\x01"
    assert to_json_value(RawValue("t", b"abc", 0)) == "abc"


def test_lenient_reports_a_row_of_the_wrong_width():
    loader = RowLoader([INT4, INT4])
    with pytest.raises(ValueError, match="Relation message"):
        loader.load([col("t", b"1")])
    values, errors = loader.load_lenient([col("t", b"1")])
    assert values == (1,) and [e.column for e in errors] == [1]
    values, errors = loader.load_lenient([col("t", b"1"), col("t", b"2"), col("t", b"3")])
    assert values == (1, 2, RawValue("t", b"3", 0)) and [e.column for e in errors] == [2]


def test_a_bad_value_inside_an_array_is_an_error_not_a_crash():
    loader = RowLoader([INT4_ARRAY])
    # array_send: ndim, has-null flag, element type, (size, lower bound), (length, bytes)...
    good = struct.pack("!iiIii", 1, 1, INT4, 3, 1) + struct.pack("!ii", 4, 1)
    good += struct.pack("!i", -1) + struct.pack("!ii", 4, 3)
    assert loader.load([col("b", good)]) == ([1, None, 3],)
    values, errors = loader.load_lenient([col("b", good[:-2])])  # truncated
    assert isinstance(values[0], RawValue) and errors[0].column == 0


# --- types not known offline, and the Catalog ------------------------------------------------

ENUM, ENUM_ARRAY, DOMAIN, DOMAIN_ARRAY, COMPOSITE = 70_001, 70_002, 70_003, 70_004, 70_005


def test_types_no_catalog_describes_are_refused_not_passed_off():
    """An enum's bytes are not a bytea and a composite's text is not a string: without a
    catalog such values do not load (lenient reading keeps them raw, with the reason)."""
    loader = RowLoader([ENUM, COMPOSITE])
    for kind, values in (("t", (b"happy", b"(1,x)")), ("b", (b"happy", b"\x00\x01"))):
        with pytest.raises(ValueLoadError, match="not built in and the capture's catalog"):
            loader.load([col(kind, values[0]), col(kind, values[1])])
        raw, errors = loader.load_lenient([col(kind, values[0]), col(kind, values[1])])
        assert [r.data for r in raw] == list(values)
        assert [(e.column, e.type_oid) for e in errors] == [(0, ENUM), (1, COMPOSITE)]
    assert loader.load([col("n"), col("n")]) == (None, None)  # NULL is NULL whatever the type


def test_catalog_composites_load_as_objects_from_text_and_binary():
    cat = Catalog()
    cat.add_enum(ENUM, "mood", ENUM_ARRAY)
    cat.add_entries([{"oid": COMPOSITE, "kind": "composite", "name": "pair",
                      "namespace": "public", "array_oid": 70_006,
                      "fields": [["a", INT4], ["b", TEXT], ["m", ENUM]]}])  # fmt: skip
    loader = RowLoader([COMPOSITE, 70_006], catalog=cat)
    text = loader.load([col("t", b'(7,"se ven",happy)'), col("t", b'{"(1,x,sad)",NULL}')])
    assert text == ({"a": 7, "b": "se ven", "m": "happy"}, [{"a": 1, "b": "x", "m": "sad"}, None])
    # record_send: field count, then (type OID, length, bytes) per field
    fields = [(INT4, struct.pack("!i", 7)), (TEXT, b"se ven"), (ENUM, b"happy")]
    record = struct.pack("!i", 3) + b"".join(
        struct.pack("!Ii", oid, len(v)) + v for oid, v in fields
    )
    (value,) = RowLoader([COMPOSITE], catalog=cat).load([col("b", record)])
    assert value == text[0] and list(value) == ["a", "b", "m"]
    assert to_json_value(value) == {"a": 7, "b": "se ven", "m": "happy"}


def test_catalog_types_enums_domains_and_their_arrays():
    cat = Catalog()
    cat.add_enum(ENUM, "mood", ENUM_ARRAY)
    cat.add_domain(DOMAIN, INT4, "posint", DOMAIN_ARRAY)
    loader = RowLoader([ENUM, ENUM_ARRAY, DOMAIN, DOMAIN_ARRAY], catalog=cat)
    text = loader.load(
        [col("t", b"happy"), col("t", b'{sad,NULL,"a b"}'), col("t", b"5"), col("t", b"{1,2}")]
    )
    assert text == ("happy", ["sad", None, "a b"], 5, [1, 2])
    # binary: an enum sends its label, a domain its base type's send format
    bin_row = loader.load(
        [
            col("b", b"happy"),
            col("t", b'{sad,NULL,"a b"}'),
            col("b", binary(INT4, 5)),
            col("t", b"{1,2}"),
        ]
    )
    assert bin_row == text
    with pytest.raises(ValueLoadError):  # the domain's base type is fixed-size
        loader.load([col("n"), col("n"), col("b", b"\x05"), col("n")])


def test_a_range_over_float4_says_so_and_pickles():
    """Its text needs its subtype (1e+06 as float4, 1000000 as float8); Spark pickles it."""
    cat = Catalog()
    cat.add_entries([{"oid": 70_010, "kind": "range", "name": "f4r", "subtype_oid": 700},
                     {"oid": 70_011, "kind": "multirange", "name": "f4mr",
                      "range_oid": 70_010}])  # fmt: skip
    loaded = RowLoader([70_010, 70_011], catalog=cat).load(
        [col("t", b"[1e+06,Infinity)"), col("t", b"{[0.1,2],(3,1e+07)}")]
    )
    rng, multi = loaded
    assert type(rng) is Float4Range and rng == Range(1e6, math.inf)
    assert all(type(r) is Float4Range for r in multi)
    assert to_json_value(multi) == "{[0.1,2],(3,1e+07)}"
    again = pickle.loads(pickle.dumps(loaded))
    assert again == loaded and type(again[0]) is Float4Range
    assert (range_text(again[0]), range_text(Range(1e6, math.inf))) == (
        "[1e+06,Infinity)",
        "[1000000,Infinity)",
    )


def test_catalog_records_type_messages_by_name_only():
    cat = Catalog()
    cat.add_type_message(pgc.Type(type_oid=ENUM, namespace="public", type_name="mood"))
    assert cat.types[ENUM].name == "mood" and cat.types[ENUM].kind == "other"
    # a name says nothing of what the type is: its values still do not load
    with pytest.raises(ValueLoadError, match="does not describe it"):
        RowLoader([ENUM], catalog=cat).load([col("t", b"x")])


# --- JSON ------------------------------------------------------------------------------------


def test_json_of_special_numbers_and_bytes():
    values = [Decimal("NaN"), Decimal("-Infinity"), float("nan"), float("inf"), b"\x00\xff"]
    oids = [NUMERIC, NUMERIC, 701, 701, 17]
    names = list("abcde")
    expected = b'{"a":"NaN","b":"-Infinity","c":"NaN","d":"Infinity","e":"\\\\x00ff"}'
    assert dumps_row(names, values, oids) == expected
    assert dumps_row_stdlib(names, values, oids) == expected


def test_json_keeps_numeric_digits():
    d = Decimal("-1234567890.01234567890123456789")
    assert dumps_row(["n"], [d], [NUMERIC]) == b'{"n":-1234567890.01234567890123456789}'
    tree = to_json_value({"x": [Decimal("0E-7"), 10**30]})
    assert dumps(tree) == b'{"x":[0.0000000,1000000000000000000000000000000]}'
