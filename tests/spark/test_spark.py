"""Spark target: MESSAGE_SCHEMA, the lossless mapping, and decode_messages against the Python codec.

Every hypothesis example is one DataFrame (one Spark job), so examples are few but wide: each
draws a message for every message x protocol version x context at once.
"""

from __future__ import annotations

import dataclasses
import json
from functools import reduce
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.spark import normalize


import pgoutput_codec as pgc  # noqa: E402
from pgoutput_codec import capture  # noqa: E402
from pgoutput_codec import spark as pgs  # noqa: E402
from pgcdc.runtime.codec_errors import format_path  # noqa: E402
from pgoutput_codec.spark_schema import MESSAGE_SCHEMA, STRUCTS  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)
from tests.support import strategies as S  # noqa: E402
from tests.support.spark_cases import _every_combination, _rc, _replication_cases, slow  # noqa: E402

CAPTURES = Path(__file__).resolve().parents[1] / "captures"
INPUT = StructType(
    [
        StructField("id", LongType(), False),
        StructField("pv", IntegerType(), False),
        StructField("streaming", StringType(), False),
        StructField("data", BinaryType(), True),
        StructField("in_stream", BooleanType(), True),
    ]
)


def _frame(spark, cases):
    rows = [
        (
            i,
            pv,
            streaming,
            pgc.encode(m, protocol_version=pv, streaming=streaming, in_stream=ins),
            ins,
        )
        for i, (pv, streaming, ins, m) in enumerate(cases)
    ]
    return spark.createDataFrame(rows, INPUT)


def _decode_grouped(df, mode="PERMISSIVE"):
    """decode_messages once per (protocol version, streaming) group, unioned: one Spark job."""
    groups = [(r.pv, r.streaming) for r in df.select("pv", "streaming").distinct().collect()]
    parts = [
        pgs.decode_messages(
            df.where((F.col("pv") == pv) & (F.col("streaming") == streaming)),
            "data",
            protocol_version=pv,
            streaming=streaming,
            in_stream_col="in_stream",
            mode=mode,
        )
        for pv, streaming in groups
    ]
    return reduce(lambda a, b: a.unionByName(b), parts)


def _python(pv, streaming, ins, data):
    return pgc.decode(data, protocol_version=pv, streaming=streaming, in_stream=ins)


# -- schema ------------------------------------------------------------------------------------
def test_schema_survives_json():
    assert StructType.fromJson(MESSAGE_SCHEMA.jsonValue()) == MESSAGE_SCHEMA
    assert StructType.fromJson(json.loads(MESSAGE_SCHEMA.json())) == MESSAGE_SCHEMA
    for struct in STRUCTS.values():
        assert StructType.fromJson(struct.jsonValue()) == struct


def test_schema_has_a_struct_per_message_with_the_spec_names():
    names = MESSAGE_SCHEMA.fieldNames()
    assert names[0] == "type"
    assert len(names) == len(set(n.lower() for n in names))  # no case-insensitive clash
    for m in S.spec().messages:
        stored = [f.name for f in STRUCTS[m.class_name].fields]
        expected = [f.name for f in dataclasses.fields(getattr(pgc, m.class_name))]
        assert [n for n in stored if n in expected] == expected
        assert all(n in expected or n[:-5] in expected or n[:-3] in expected for n in stored)
        column = pgs.MESSAGE_COLUMNS.get(m.class_name)
        assert (column is None) == (not stored)
        if column:
            assert MESSAGE_SCHEMA[column].dataType == STRUCTS[m.class_name]
            assert MESSAGE_SCHEMA[column].nullable


# -- lossless mapping ----------------------------------------------------------------------------
@slow(6)
@given(every=_every_combination(), extra=st.lists(S.message_cases(valid_utf8=True), max_size=40))
def test_create_dataframe_accepts_mapped_messages_and_gives_them_back(spark, every, extra):
    cases = list(every) + extra
    rows = [(i, pgs.message_to_row(m)) for i, (_, _, _, m) in enumerate(cases)]
    schema = StructType(
        [StructField("id", LongType(), False), StructField("message", MESSAGE_SCHEMA, True)]
    )
    df = spark.createDataFrame(rows, schema, verifySchema=True)
    got = {r.id: r.message for r in df.collect()}
    assert len(got) == len(cases)
    for i, (_, _, _, m) in enumerate(cases):
        assert pgs.row_to_message(got[i]) == m
        assert normalize(got[i]) == pgs.message_to_row(m)


@slow(8)
@given(every=_every_combination(), extra=st.lists(S.message_cases(valid_utf8=True), max_size=60))
def test_decode_messages_equals_the_python_decoder(spark, every, extra):
    cases = list(every) + extra
    out = _decode_grouped(_frame(spark, cases)).collect()
    assert len(out) == len(cases)
    for r in out:
        pv, streaming, ins, m = cases[r.id]
        assert r.decode_error is None, (r.decode_error, m)
        decoded = _python(pv, streaming, ins, r.data)
        assert normalize(r.message) == pgs.message_to_row(decoded)
        assert pgs.row_to_message(r.message) == decoded == m


@slow(4)
@given(cases=st.lists(S.message_cases(valid_utf8=False), min_size=20, max_size=80))
def test_strings_that_are_not_utf8_become_decode_errors(spark, cases):
    out = _decode_grouped(_frame(spark, cases)).collect()
    assert len(out) == len(cases)
    for r in out:
        pv, streaming, ins, m = cases[r.id]
        decoded = _python(pv, streaming, ins, r.data)
        bad = _first_non_utf8(decoded, (type(decoded).__name__,))
        if bad is None:
            assert r.decode_error is None
            assert pgs.row_to_message(r.message) == decoded
        else:
            assert r.message is None
            assert "not valid UTF-8" in r.decode_error
            assert f" in {format_path(bad)}: string is not valid UTF-8" in r.decode_error


def _first_non_utf8(value, path):
    """Path of the first string (in wire order) that is not valid UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            found = _first_non_utf8(v, (*path, i))
            if found:
                return found
        return None
    if hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            found = _first_non_utf8(getattr(value, name), (*path, name))
            if found:
                return found
    return None


def test_invalid_utf8_error_names_field_and_offset(spark):
    rel = pgc.Relation(
        xid=None,
        relation_oid=7,
        namespace="public",
        relation_name="t",
        replica_identity=100,
        columns=(
            pgc.RelationColumn(flags=1, name="id", type_oid=23, type_modifier=-1),
            pgc.RelationColumn(flags=0, name="b\udcffd", type_oid=25, type_modifier=-1),
        ),
    )
    data = pgc.encode(rel, protocol_version=1)
    bad_at = data.index(b"b\xffd") + 1
    df = spark.createDataFrame([(0, 1, "off", data, False)], INPUT)
    (row,) = pgs.decode_messages(df, protocol_version=1).collect()
    assert row.message is None
    assert row.decode_error.startswith(
        f"cannot decode at byte {bad_at} in Relation.columns[1].name:"
    )
    assert pgc.decode(data, protocol_version=1) == rel  # the Python codec keeps it


# -- bad rows ------------------------------------------------------------------------------------
BEGIN = pgc.encode(
    pgc.Begin(final_lsn=2**64 - 1, commit_time=-1, xid=2**32 - 1), protocol_version=1
)
BAD = [
    BEGIN[:9],  # truncated in final_lsn
    b"Z" + BEGIN[1:],  # unknown tag
    BEGIN + b"\x00",  # trailing byte
    b"",  # empty
    None,  # null data
    b"c" + BEGIN[1:],  # Stream Commit needs protocol version 2
    pgc.encode(
        pgc.Insert(
            xid=None,
            relation_oid=1,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=b"x"),)),
        ),
        protocol_version=1,
    )[:-1],  # truncated value
]


def _expected_error(data):
    if data is None:
        return "cannot decode at byte 0 in <message>: the data column is null"
    with pytest.raises(pgc.DecodeError) as info:
        pgc.decode(data, protocol_version=1)
    return str(info.value)


def test_permissive_keeps_every_row_and_reports_errors(spark):
    rows = []
    for i in range(len(BAD) * 3):
        data = BAD[i // 3] if i % 3 == 1 else BEGIN
        rows.append((i, 1, "off", data, False))
    df = spark.createDataFrame(rows, INPUT).repartition(2)
    out = {r.id: r for r in pgs.decode_messages(df, protocol_version=1).collect()}
    assert sorted(out) == list(range(len(rows)))
    for i, r in out.items():
        if i % 3 == 1:
            assert r.message is None
            assert r.decode_error == _expected_error(BAD[i // 3])
        else:
            assert r.decode_error is None
            assert r.message.type == "Begin"
            assert r.message.begin.final_lsn == 2**64 - 1
            assert r.message.begin.final_lsn_text == "FFFFFFFF/FFFFFFFF"
            assert r.message.begin.xid == 2**32 - 1
            assert r.message.begin.commit_time_ts is not None


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_failfast_fails_the_job_with_the_offset(spark, bad):
    rows = [(0, 1, "off", BEGIN, False), (1, 1, "off", BAD[bad], False)]
    df = spark.createDataFrame(rows, INPUT)
    out = pgs.decode_messages(df, protocol_version=1, mode="FAILFAST")
    assert "decode_error" not in out.columns
    with pytest.raises(Exception) as info:
        out.collect()
    expected = _expected_error(BAD[bad])
    assert expected.split(":")[0] in str(info.value)  # "cannot decode at byte N in Path"


def test_null_or_impossible_in_stream_is_an_error(spark):
    rows = [(0, 1, "off", BEGIN, None), (1, 1, "off", BEGIN, True), (2, 1, "off", BEGIN, False)]
    out = {
        r.id: r
        for r in pgs.decode_messages(
            spark.createDataFrame(rows, INPUT), protocol_version=1, in_stream_col="in_stream"
        ).collect()
    }
    assert "in_stream column is null" in out[0].decode_error
    assert "in_stream needs protocol_version >= 2" in out[1].decode_error
    assert out[2].decode_error is None


def test_arguments_are_checked(spark):
    df = spark.createDataFrame([(0, 1, "off", BEGIN, False)], INPUT)
    with pytest.raises(ValueError):
        pgs.decode_messages(df, protocol_version=9)
    with pytest.raises(ValueError):
        pgs.decode_messages(df, protocol_version=1, streaming="parallel")
    with pytest.raises(ValueError):
        pgs.decode_messages(df, protocol_version=1, mode="DROPMALFORMED")
    with pytest.raises(TypeError):
        pgs.decode_messages(df, "streaming", protocol_version=1)
    with pytest.raises(ValueError):
        pgs.decode_messages(df, "nope", protocol_version=1)
    with pytest.raises(ValueError):
        pgs.decode_messages(df.withColumn("message", F.lit(1)), protocol_version=1)


# -- real captures ---------------------------------------------------------------------------------
def _capture_files():
    manifest = json.loads((CAPTURES / "manifest.json").read_text())
    return [CAPTURES / f["path"] for f in manifest["files"] if (CAPTURES / f["path"]).exists()]


def test_real_captures_decode_like_the_python_decoder(spark):
    """Every captured message from PostgreSQL 15-18 (all protocol versions and options)."""
    files = _capture_files()
    if not files:
        pytest.skip("no captures")
    rows, records = [], []
    for fi, path in enumerate(files):
        for seq, rec in enumerate(capture.read(path)):
            streaming = (
                "parallel"
                if rec.parallel_streaming
                else ("on" if rec.protocol_version >= 2 else "off")
            )
            rows.append(
                (len(rows), rec.protocol_version, streaming, rec.data, rec.in_stream, fi, seq)
            )
            records.append(rec)
    schema = StructType(
        INPUT.fields
        + [StructField("file", IntegerType(), False), StructField("seq", LongType(), False)]
    )
    df = spark.createDataFrame(rows, schema)
    derived = pgs.with_in_stream(df, order_by="seq", partition_by="file", out_col="derived")
    out = _decode_grouped(derived).collect()
    assert len(out) == len(rows)
    for r in out:
        rec = records[r.id]
        assert r.decode_error is None, r.decode_error
        assert r.derived == rec.in_stream, (files[r.file], r.seq)
        decoded = rec.decode()
        assert pgs.row_to_message(r.message) == decoded
        assert normalize(r.message) == pgs.message_to_row(decoded)


def test_missing_in_stream_column_names_the_fix(spark):
    df = spark.createDataFrame([(0, 1, "off", BEGIN, False)], INPUT).drop("in_stream")
    with pytest.raises(ValueError, match=r"with_in_stream\(df, 'data', order_by="):
        pgs.decode_messages(df, protocol_version=2, streaming="on", in_stream_col="in_stream")


def test_the_codec_object_pickles_by_reference():
    import pickle

    assert pickle.loads(pickle.dumps(pgs.CODEC)) is pgs.CODEC


# -- the replication protocol's codec: the same runtime, another spec -------------------------------
REPLICATION_INPUT = StructType(
    [
        StructField("id", LongType(), False),
        StructField("data", BinaryType(), True),
    ]
)


def _replication_examples(rc):
    top = 2**64 - 1
    return [
        rc.XLogData(wal_start=top, wal_end=0, server_time=-(2**63), data=b"B" + bytes(20)),
        rc.XLogData(wal_start=0x16_B374D848, wal_end=1, server_time=800_000_000_000_000, data=b""),
        rc.PrimaryKeepalive(wal_end=top, server_time=2**63 - 1, reply_requested=1),
        rc.StandbyStatusUpdate(
            written_lsn=3, flushed_lsn=2, applied_lsn=1, client_time=0, reply_requested=0
        ),
        rc.HotStandbyFeedback(
            client_time=-1, xmin=2**32 - 1, xmin_epoch=0, catalog_xmin=7, catalog_xmin_epoch=1
        ),
    ]


def test_replication_messages_decode_like_the_python_codec(spark):
    rc, rcs = _rc()
    messages = _replication_examples(rc)
    rows = [(i, rc.encode(m, server_version=18)) for i, m in enumerate(messages)]
    df = spark.createDataFrame(rows, REPLICATION_INPUT)
    out = {r.id: r for r in rcs.decode_messages(df, server_version=18).collect()}
    assert "in_stream_col" not in rcs.decode_messages.__kwdefaults__
    for i, m in enumerate(messages):
        r = out[i]
        assert r.decode_error is None, r.decode_error
        assert r.message.type == type(m).__name__
        assert rcs.row_to_message(r.message) == m
        assert normalize(r.message) == rcs.message_to_row(m)
    xlog = out[1].message[rcs.MESSAGE_COLUMNS["XLogData"]]
    assert xlog.wal_start_text == "16/B374D848"
    assert xlog.server_time_ts is not None
    assert out[0].message[rcs.MESSAGE_COLUMNS["XLogData"]].server_time_ts is None  # -infinity


def test_primary_status_update_needs_server_version_19(spark):
    rc, rcs = _rc()
    status = b"s" + (1 << 40).to_bytes(8, "big") + (5).to_bytes(8, "big") + (9).to_bytes(8, "big")
    status += (800_000_000_000_000).to_bytes(8, "big", signed=True)
    df = spark.createDataFrame([(0, status)], REPLICATION_INPUT)
    (old,) = rcs.decode_messages(df, server_version=18).collect()
    assert old.message is None
    assert old.decode_error == str(_decode_error(lambda: rc.decode(status, server_version=18)))
    assert "PrimaryStatusUpdate needs server_version 19" in old.decode_error
    (new,) = rcs.decode_messages(df, server_version=19).collect()
    assert new.decode_error is None
    assert rcs.row_to_message(new.message) == rc.decode(status, server_version=19)
    assert new.message[rcs.MESSAGE_COLUMNS["PrimaryStatusUpdate"]].wal_lsn_text == "100/0"
    with pytest.raises(Exception, match="needs server_version 19"):
        rcs.decode_messages(df, server_version=18, mode="FAILFAST").collect()


def _decode_error(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_real_walsender_traffic_and_its_pgoutput_payloads(spark):
    """Every CopyData message of the PostgreSQL 15-18 fixtures, then the XLogData payloads
    (a column of the first decode) decoded again with pgoutput_codec: the codecs compose."""
    from tests.postgres import replication_fixtures as fixtures
    from tests.postgres import servers

    rc, rcs = _rc()
    fixture_dir = Path(__file__).resolve().parents[1] / "captures" / "replication"
    for key in servers.SERVER_KEYS:
        path = fixtures.fixture_path(fixture_dir, key)
        if not path.exists():
            continue
        fx = fixtures.read(path)
        rows = [(i, payload) for i, (_, payload) in enumerate(fx.records)]
        df = rcs.decode_messages(
            spark.createDataFrame(rows, REPLICATION_INPUT), server_version=fx.server_major
        ).cache()
        for r in df.collect():
            assert r.decode_error is None, (key, r.id, r.decode_error)
            expected = rc.decode(rows[r.id][1], server_version=fx.server_major)
            assert rcs.row_to_message(r.message) == expected
        column = rcs.MESSAGE_COLUMNS["XLogData"]
        payloads = df.where(F.col("message.type") == "XLogData").select(
            F.col("id").alias("seq"), F.col(f"message.{column}.data").alias("data")
        )
        meta = fx.meta
        inner = pgs.decode_messages(
            pgs.with_in_stream(payloads, order_by="seq"),
            protocol_version=meta["protocol_version"],
            streaming=meta["streaming"],
            in_stream_col="in_stream",
        ).collect()
        assert inner and all(r.decode_error is None for r in inner), key
        df.unpersist()


@slow(4)
@given(every=st.deferred(_replication_cases))
def test_replication_spark_rows_equal_the_python_codec(spark, every):
    rc, rcs = _rc()
    schema = StructType(REPLICATION_INPUT.fields + [StructField("v", IntegerType(), False)])
    rows = [(i, rc.encode(m, server_version=v), v) for i, (v, m) in enumerate(every)]
    df = spark.createDataFrame(rows, schema)
    parts = [rcs.decode_messages(df.where(F.col("v") == v), server_version=v) for v in (18, 19)]
    out = parts[0].unionByName(parts[1]).collect()
    assert len(out) == len(rows)
    for r in out:
        v, m = every[r.id]
        assert r.decode_error is None, r.decode_error
        assert rcs.row_to_message(r.message) == m
        assert normalize(r.message) == rcs.message_to_row(m)


# -- the accelerator's batch path into columns ---------------------------------------------------
def _batch_decoders(pv, streaming):
    """A BatchDecoder of decode_messages' (in_stream read from a column), and its message type."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    from pgcdc.runtime.spark.batches import BatchDecoder

    message_type = to_arrow_type(MESSAGE_SCHEMA, timezone="UTC")
    contexts = [("in_stream", 1, "in_stream")]
    return BatchDecoder(pgs.CODEC, (pv, streaming), 0, contexts, False, message_type), pa


@slow(15)
@given(every=_every_combination(), extra=st.lists(S.message_cases(valid_utf8=True), max_size=60))
def test_batch_columns_equal_the_object_path(every, extra):
    """The C decoder into columns (decode_columns) gives the Arrow arrays that the decoder into
    objects gives, for every message in every context, in_stream per row."""
    if not pgc.speedups_enabled():
        pytest.skip("the C accelerator is not built")
    cases = list(every) + extra
    groups: dict = {}
    for pv, streaming, ins, m in cases:
        data = pgc.encode(m, protocol_version=pv, streaming=streaming, in_stream=ins)
        groups.setdefault((pv, streaming), []).append((data, ins))
    for (pv, streaming), rows in groups.items():
        dec, pa = _batch_decoders(pv, streaming)
        assert dec.decode_columns is not None
        batch = pa.RecordBatch.from_arrays(
            [pa.array([d for d, _ in rows], pa.binary()), pa.array([i for _, i in rows])],
            names=["data", "in_stream"],
        )
        columns = dec._decode_columns(batch)
        assert columns is not None
        dec.decode_columns = None
        objects, errors = dec.decode(batch)
        assert errors is None
        assert columns.equals(objects), (pv, streaming)


def test_batch_columns_leave_bad_rows_to_the_row_path():
    """A row the accelerator declines (truncated) sends the whole batch down the row path,
    which reports it with its offset; the other rows still decode."""
    if not pgc.speedups_enabled():
        pytest.skip("the C accelerator is not built")
    dec, pa = _batch_decoders(1, "off")
    begin = pgc.encode(pgc.Begin(final_lsn=1, commit_time=2, xid=3), protocol_version=1)
    batch = pa.RecordBatch.from_arrays(
        [pa.array([begin, begin[:-1], begin], pa.binary()), pa.array([False] * 3)],
        names=["data", "in_stream"],
    )
    assert dec._decode_columns(batch) is None
    message, errors = dec.decode(batch)
    assert message.is_valid().to_pylist() == [True, False, True]
    assert errors.to_pylist()[1].startswith("cannot decode at byte 1")
