"""decode_messages' JVM engine (the Java decoder generated from the spec) against its Python
engine (the codec's own decoder in mapInArrow): the same rows, row for row, and the same
decode_error text, on samples, real captures, generated messages and broken bytes; for both
specs.

Every comparison decodes one DataFrame with both engines and collects both in one go per
(protocol version, streaming) group.
"""

from __future__ import annotations

import json
import logging
import random
from functools import reduce
from pathlib import Path

import pytest
from hypothesis import given


import pgoutput_codec as pgc  # noqa: E402
from pgcdc.runtime.spark import jvm as spark_jvm  # noqa: E402
from pgoutput_codec import capture  # noqa: E402
from pgoutput_codec import spark as pgs  # noqa: E402
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
from tests.support.spark_cases import _every_combination, _replication_cases, slow  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "captures"
SAMPLES = ROOT / "generated" / "samples"
INPUT = StructType(
    [
        StructField("id", LongType(), False),
        StructField("pv", IntegerType(), False),
        StructField("streaming", StringType(), False),
        StructField("data", BinaryType(), True),
        StructField("in_stream", BooleanType(), True),
    ]
)


@pytest.fixture(scope="module", autouse=True)
def _needs_the_jvm_engine(spark):
    try:
        spark_jvm.prepare(pgs.CODEC, spark)
    except spark_jvm.JvmUnavailable as exc:
        pytest.skip(f"no JVM engine here: {exc}")


def _streaming(rec) -> str:
    if rec.parallel_streaming:
        return "parallel"
    return "on" if rec.protocol_version >= 2 else "off"


def _decoded(df, engine, mode="PERMISSIVE", in_stream_col="in_stream"):
    """decode_messages per (protocol version, streaming) group, unioned."""
    groups = sorted((r.pv, r.streaming) for r in df.select("pv", "streaming").distinct().collect())
    parts = [
        pgs.decode_messages(
            df.where((F.col("pv") == pv) & (F.col("streaming") == streaming)),
            "data",
            protocol_version=pv,
            streaming=streaming,
            in_stream_col=in_stream_col,
            mode=mode,
            engine=engine,
        )
        for pv, streaming in groups
    ]
    return reduce(lambda a, b: a.unionByName(b), parts)


def _rows(df) -> dict:
    return {r.id: r.asDict(recursive=True) for r in df.collect()}


def assert_engines_agree(df, collect=True, **kwargs) -> dict | None:
    """Both engines decode df alike: the same schema, and per row the same message and
    decode_error (compared in Spark). Returns the rows by id when `collect`."""
    jvm, python = _decoded(df, "jvm", **kwargs), _decoded(df, "python", **kwargs)
    assert jvm.schema == python.schema
    pair = F.struct("message", "decode_error")
    joined = jvm.select("id", pair.alias("jvm")).join(
        python.select("id", pair.alias("python")), "id", "full_outer"
    )
    wrong = joined.where(~F.col("jvm").eqNullSafe(F.col("python"))).limit(3).collect()
    assert not wrong, [r.asDict(recursive=True) for r in wrong]
    return _rows(jvm) if collect else None


def _frame(spark, rows):
    return spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], INPUT)


# -- what decodes ---------------------------------------------------------------------------
def _capture_rows(paths) -> list[tuple]:
    rows = []
    for path in paths:
        for rec in capture.read(path):
            rows.append((rec.protocol_version, _streaming(rec), rec.data, rec.in_stream))
    return rows


def _capture_files() -> list[Path]:
    manifest = json.loads((CAPTURES / "manifest.json").read_text())
    return [CAPTURES / f["path"] for f in manifest["files"] if (CAPTURES / f["path"]).exists()]


def test_the_sample_session(spark):
    rows = _capture_rows([SAMPLES / "pgoutput_sample.pgcap"])
    out = assert_engines_agree(_frame(spark, rows))
    assert all(r["decode_error"] is None for r in out.values())


def test_real_captures_pg15_to_18(spark):
    """Every captured message of PostgreSQL 15-18, protocols 1-4 and their options."""
    files = _capture_files()
    if not files:
        pytest.skip("no captures")
    rows = _capture_rows(files)
    df = _frame(spark, rows).cache()
    assert_engines_agree(df, collect=False)
    out = _decoded(df, "jvm")
    assert out.count() == len(rows)
    assert out.where(F.col("decode_error").isNotNull()).count() == 0
    types = {r.type for r in out.select("message.type").distinct().collect()}
    assert types >= {"Begin", "Insert", "Update", "Delete", "Commit", "Relation"}
    df.unpersist()


@slow(3)
@given(every=_every_combination(valid_utf8=False))
def test_generated_messages_of_every_kind_and_context(spark, every):
    """One message per (message, protocol version, context) from the spec's strategies,
    strings that are not UTF-8 included (errors on both engines alike)."""
    rows = [
        (pv, streaming, pgc.encode(m, protocol_version=pv, streaming=streaming, in_stream=ins), ins)
        for pv, streaming, ins, m in every
    ]
    assert_engines_agree(_frame(spark, rows))


# -- what does not ---------------------------------------------------------------------------
def _real_messages(limit_per_type: int = 2, longest: int = 160) -> list[tuple]:
    """A few real messages of each type and context, the longest up to `longest` bytes."""
    rows = _capture_rows(_capture_files() or [SAMPLES / "pgoutput_sample.pgcap"])
    seen: dict = {}
    for row in sorted(rows, key=lambda r: -len(r[2])):
        if len(row[2]) > longest:
            continue
        key = (row[0], row[1], row[2][:1], row[3])
        if len(seen.setdefault(key, [])) < limit_per_type:
            seen[key].append(row)
    return [row for group in seen.values() for row in group]


def test_every_truncation_and_flipped_bytes(spark):
    """Real messages cut at every offset, and with each byte flipped or replaced: the same
    rows fail, with the same offset, field path and reason; the job never fails."""
    rnd = random.Random(7)
    rows = []
    for pv, streaming, data, ins in _real_messages():
        for cut in range(len(data)):
            rows.append((pv, streaming, data[:cut], ins))
        for at in range(len(data)):
            for new in (data[at] ^ 0xFF, rnd.randrange(256)):
                rows.append((pv, streaming, data[:at] + bytes([new]) + data[at + 1 :], ins))
        rows.append((pv, streaming, data + b"\x00", ins))  # a trailing byte
    out = assert_engines_agree(_frame(spark, rows))
    errors = [r["decode_error"] for r in out.values() if r["decode_error"]]
    assert len(errors) > len(rows) // 3
    assert all(e.startswith("cannot decode at byte ") for e in errors)
    assert all(r["message"] is None for r in out.values() if r["decode_error"])


def test_hostile_rows(spark):
    """Garbage tags, empty and null data, absurd counts and lengths, bad UTF-8, a null or
    impossible context: errors on the same rows with the same text."""
    rnd = random.Random(11)
    begin = pgc.encode(pgc.Begin(final_lsn=1, commit_time=2, xid=3), protocol_version=1)
    relation = b"R" + bytes(4) + b"public\x00t\x00d" + b"\xff\xff"  # 65535 columns, none sent
    rows = [
        (1, "off", b"", False),
        (1, "off", None, False),
        (1, "off", begin, None),
        (1, "off", begin, True),  # in_stream needs protocol 2
        (2, "on", b"\x00" * 5, False),
        (1, "off", b"Z", False),
        (1, "off", b"S" + bytes(5), False),  # Stream Start needs protocol 2
        (1, "off", relation, False),
        (1, "off", b"T" + b"\xff" * 5, False),  # 2^32-1 truncated relations
        (1, "off", b"I" + bytes(4) + b"N\x00\x01t\xff\xff\xff\xff", False),  # 4 GB value
        (1, "off", b"I" + bytes(4) + b"N\x00\x01x", False),  # unknown column kind
        (1, "off", b"I" + bytes(4) + b"X\x00\x00", False),  # literal N expected
        (1, "off", b"D" + bytes(4) + b"Q\x00\x00", False),  # unknown old_kind
        (1, "off", b"M" + b"\x01" + bytes(8) + b"pre\xc3(fix\x00" + bytes(4), False),
        (1, "off", b"M" + b"\x01" + bytes(8) + b"\xe0\x80\x00" + bytes(4), False),
        (1, "off", b"M" + b"\x01" + bytes(8) + b"\xf0\x90\x80\x00" + bytes(4), False),
        (1, "off", b"M" + b"\x01" + bytes(8) + b"\xed\xa0\x80\x00" + bytes(5), False),
        (1, "off", b"O" + bytes(8) + b"\xff", False),
        (4, "parallel", b"A" + bytes(12), False),
        (4, "parallel", b"A" + bytes(12), True),
    ]
    for _ in range(300):
        rows.append((1, "off", bytes(rnd.randrange(256) for _ in range(rnd.randrange(40))), False))
    for tag in b"BMCORYIUDTSEcAbPKrp":
        for _ in range(20):
            tail = bytes(rnd.randrange(256) for _ in range(rnd.randrange(60)))
            rows.append((4, "parallel", bytes([tag]) + tail, rnd.random() < 0.5))
    out = assert_engines_agree(_frame(spark, rows))
    errors = [out[i]["decode_error"] for i in range(20)]
    assert errors[0] == "cannot decode at byte 0 in <message>: empty message: no tag byte"
    assert errors[1] == "cannot decode at byte 0 in <message>: the data column is null"
    assert errors[2] == "cannot decode at byte 0 in <message>: the in_stream column is null"
    assert "Relation.columns[0].flags" in errors[7]
    assert "string is not valid UTF-8" in errors[13]


def test_missing_context_hint_and_no_context_column(spark):
    """Without in_stream_col, in_stream is false for every row (and errors say so)."""
    xid_insert = b"I" + (7).to_bytes(4, "big") + bytes(4) + b"N\x00\x00"
    rows = [(2, "on", xid_insert, True), (2, "on", b"B" + bytes(20), False)]
    out = assert_engines_agree(_frame(spark, rows), in_stream_col=None)
    assert "hint: no in_stream_col was given" in out[0]["decode_error"]


@pytest.mark.parametrize("bad", [b"B\x00", b"Z", b"I" + bytes(4) + b"X"])
def test_failfast_fails_the_job_with_the_offset_and_path(spark, bad):
    df = _frame(spark, [(1, "off", b"B" + bytes(20), False), (1, "off", bad, False)])
    want = _rows(_decoded(df, "python"))[1]["decode_error"]
    with pytest.raises(Exception) as info:
        _decoded(df, "jvm", mode="FAILFAST").collect()
    assert want + " (decode_messages FAILFAST)" in str(info.value)
    ok = _decoded(df.where("id = 0"), "jvm", mode="FAILFAST")
    assert ok.columns == ["id", "pv", "streaming", "data", "in_stream", "message"]
    assert ok.collect()[0].message.type == "Begin"


# -- the replication protocol: the same generator, another spec ------------------------------------
REPLICATION_INPUT = StructType(
    [
        StructField("id", LongType(), False),
        StructField("v", IntegerType(), False),
        StructField("data", BinaryType(), True),
    ]
)


def _replication_agree(spark, rows):
    from replication_codec import spark as rcs

    df = spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], REPLICATION_INPUT)
    out = {}
    for v in sorted({v for v, _ in rows}):
        part = df.where(F.col("v") == v)
        jvm = rcs.decode_messages(part, server_version=v, engine="jvm")
        python = rcs.decode_messages(part, server_version=v, engine="python")
        assert jvm.schema == python.schema
        got, want = _rows(jvm), _rows(python)
        assert got == want
        out.update(got)
    return out


def test_replication_sample_and_broken_messages(spark):
    from replication_codec import capture as rcap

    records = list(rcap.read(SAMPLES / "replication_sample.pgrcap"))
    rows = [(rec.server_version, rec.data) for rec in records]
    good = len(rows)
    for v, data in list(rows):
        rows += [(v, data[:cut]) for cut in range(len(data))]
        rows += [(v, data + b"\x01"), (18, data), (v, b"\x00" + data[1:])]
    out = _replication_agree(spark, rows)
    assert all(out[i]["decode_error"] is None for i in range(good))


@slow(3)
@given(every=_replication_cases())
def test_replication_generated_messages(spark, every):
    import replication_codec as rc

    _replication_agree(spark, [(v, rc.encode(m, server_version=v)) for v, m in every])


# -- picking the engine ----------------------------------------------------------------------------
def test_engine_is_checked(spark):
    df = _frame(spark, [(1, "off", b"B" + bytes(20), False)])
    with pytest.raises(ValueError, match="engine must be one of"):
        pgs.decode_messages(df, protocol_version=1, engine="gpu")


def test_auto_uses_the_jvm_and_python_stays_python(spark):
    df = _frame(spark, [(1, "off", b"B" + bytes(20), False)])
    auto = pgs.decode_messages(df, protocol_version=1)
    python = pgs.decode_messages(df, protocol_version=1, engine="python")
    assert "pgcdc_decode_" in auto._jdf.queryExecution().analyzed().toString()
    assert "pgcdc_decode_" not in python._jdf.queryExecution().analyzed().toString()


def test_auto_falls_back_without_javac_or_jar(spark, monkeypatch, tmp_path, caplog):
    """No javac and nothing cached: "auto" logs one line and decodes in Python; "jvm" says
    why it cannot."""
    monkeypatch.setenv("PGCDC_JVM_CACHE", str(tmp_path))
    monkeypatch.setattr(spark_jvm, "_javac", lambda: None)
    monkeypatch.setattr(spark_jvm, "_jars", {})
    df = _frame(spark, [(1, "off", b"B" + bytes(20), False)])
    with caplog.at_level(logging.WARNING, logger="pgcdc.spark"):
        out = pgs.decode_messages(df, protocol_version=1)
    assert "pgcdc_decode_" not in out._jdf.queryExecution().analyzed().toString()
    assert out.collect()[0].message.type == "Begin"
    assert "JVM engine is unavailable (no javac" in caplog.text
    with pytest.raises(spark_jvm.JvmUnavailable, match="no javac"):
        pgs.decode_messages(df, protocol_version=1, engine="jvm")


def test_the_jar_is_cached_by_its_sources(spark, tmp_path, monkeypatch):
    """A second build of the same sources is the cached jar: no javac needed."""
    monkeypatch.setenv("PGCDC_JVM_CACHE", str(tmp_path))
    monkeypatch.setattr(spark_jvm, "_jars", {})
    first, cls = spark_jvm.jvm_jars(pgs.CODEC, spark.version)
    assert all(p.parent == tmp_path and p.exists() for p in first)
    monkeypatch.setattr(spark_jvm, "_jars", {})
    monkeypatch.setattr(spark_jvm, "_javac", lambda: None)
    assert spark_jvm.jvm_jars(pgs.CODEC, spark.version) == (first, cls)
    assert not list(tmp_path.glob(".build-*"))


def test_two_builds_of_the_decoder_live_side_by_side(spark, tmp_path, monkeypatch):
    """Changed sources (a pip upgrade under a JVM that outlived its Python, as a notebook's
    Python restart leaves it) are a new build whose classes this session then uses, beside
    the build it loaded first; with fixed class names its class loader kept the first."""
    monkeypatch.setenv("PGCDC_JVM_CACHE", str(tmp_path / "cache"))
    original = pgs.CODEC.jvm_source()
    changed = tmp_path / original.name
    text = original.read_text()
    assert text.count('r.push("Begin");') == 1
    changed.write_text(text.replace('r.push("Begin");', 'r.push("Begin_v2");'))
    upgraded = object.__new__(type(pgs.CODEC))  # not copy.copy: a codec pickles as its module
    upgraded.__dict__.update(vars(pgs.CODEC), jvm_source=lambda: changed)

    df = spark.createDataFrame([(b"B" + bytes(5),)], "data binary")  # a truncated Begin

    def error(codec):
        out = codec.decode_messages(
            df, "data", (1, "off"), {"in_stream": None}, "PERMISSIVE", "jvm"
        )
        (row,) = out.collect()
        return row.decode_error

    assert "in Begin.final_lsn" in error(pgs.CODEC)
    assert "in Begin_v2.final_lsn" in error(upgraded)
    assert "in Begin.final_lsn" in error(pgs.CODEC)
    (_, old), (_, new) = (spark_jvm.jvm_jars(c, spark.version) for c in (pgs.CODEC, upgraded))
    assert old != new and old.rsplit(".", 1)[1] == new.rsplit(".", 1)[1]


# -- a standalone cluster: the jars reach an executor JVM of its own ---------------------------------
CLUSTER_DRIVER = """
import sys

import pgoutput_codec as pgc
from pgoutput_codec import capture, spark as pgs
from pgoutput_codec.spark import local_spark_session
from tests.support.spark import normalize

spark = local_spark_session("jvm-cluster", spark__master=sys.argv[1], spark__executor__cores="1")
rows = [(i, r.data, r.in_stream) for i, r in enumerate(capture.read(sys.argv[2]))]
df = spark.createDataFrame(rows, "id long, data binary, in_stream boolean").repartition(3)
out = pgs.decode_messages(
    df, protocol_version=4, streaming="parallel", in_stream_col="in_stream", engine="jvm"
).collect()
assert len(out) == len(rows)
for r in out:
    _, data, in_stream = rows[r.id]
    want = pgc.decode(data, protocol_version=4, streaming="parallel", in_stream=in_stream)
    assert r.decode_error is None and normalize(r.message) == pgs.message_to_row(want), r.id
print("decoded", len(out), "executors", spark.sparkContext._jsc.sc().getExecutorIds().size())
spark.stop()
"""


def test_a_standalone_cluster_decodes_with_the_jvm_engine(tmp_path):
    """The executors run in a JVM of their own with a Python without pgcdc: the JVM engine
    needs neither, only the jars the session ships."""
    import subprocess
    import sys

    from tests.support.cluster import bare_python, standalone_cluster

    python = bare_python(tmp_path / "venv")
    with standalone_cluster(tmp_path / "cluster", python=python) as cluster:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                CLUSTER_DRIVER,
                cluster.master_url,
                str(SAMPLES / "pgoutput_sample.pgcap"),
            ],
            cwd=ROOT,
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "decoded 35 executors 1" in proc.stdout, proc.stdout


# -- specs that are not PostgreSQL's ----------------------------------------------------------------
# What neither real spec has: a literal inside a run of fixed fields, a repeat of strings, a
# 64-bit count, a repeat element holding a part, a required tagged block holding a part, a
# field gated on a choice inside a part, quote and backslash choice bytes, a Rest after convenience
# columns, signed 8- and 16-bit values.
WIDE_SPEC = """\
title: Wide test frames
doc_url: https://example.invalid/wide-frames
targets:
  package: wide_codec
  env_prefix: WIDE_CODEC
  kaitai: {message: wide_frame, capture: wide_capture}
  capture: {magic: WIDECAP, extension: widecap}
parameters:
  - name: level
    kind: version
    values: [1, 2]
    description: The format level.
contexts: []
messages:
  - name: Names
    description: A run with a literal inside, then a repeat of strings.
    doc_anchor: NAMES
    blocks:
      - type: header
        fields:
          - {field: tag, type: Byte1, value: N, description: Marks names.}
          - {field: num_names, type: Int32, signed: false, description: How many names.}
          - {field: small, type: Int8, signed: true, description: A signed byte.}
          - {field: mark, type: Byte1, value: x, description: A literal inside the run.}
          - {field: delta, type: Int16, signed: true, description: A signed short.}
          - {field: later, type: Int32, signed: false, since: 2, description: Level 2 only.}
      - type: repeat
        name: names
        count: num_names
        fields:
          - {field: name, type: String, description: One name.}
  - name: Items
    description: A wide count and a repeat of a part.
    doc_anchor: ITEMS
    blocks:
      - type: header
        fields:
          - {field: tag, type: Byte1, value: I, description: Marks items.}
          - {field: num_items, type: Int64, signed: false, description: How many items.}
      - type: repeat
        name: items
        struct: Item
        count: num_items
        fields:
          - {field: item, type: Pair, description: One item.}
          - {field: weight, type: Int16, signed: true, description: Its weight.}
  - name: Choice
    description: A required tagged block holding a part.
    doc_anchor: CHOICE
    since: 2
    blocks:
      - type: header
        fields:
          - {field: tag, type: Byte1, value: C, description: Marks a choice.}
      - type: tagged
        optional: false
        description: The chosen thing.
        fields:
          - field: kind
            type: Byte1
            choices: {a: alpha, "\\\\": backslash, "'": quote}
            description: Which thing.
          - {field: pair, type: Pair, description: Its pair.}
          - {field: extra, type: Int32, signed: true, description: A number.}
  - name: Tail
    description: An LSN, a timestamp and the rest.
    doc_anchor: TAIL
    blocks:
      - type: header
        fields:
          - {field: tag, type: Byte1, value: T, description: Marks a tail.}
          - {field: at, type: Int64, signed: false, semantic: lsn, description: An LSN.}
          - {field: when, type: Int64, signed: true, semantic: timestamp, description: A time.}
          - {field: body, type: Rest, description: The rest.}
parts:
  - name: Pair
    description: A signed choice and a number, with a note for plus.
    doc_anchor: PAIR
    blocks:
      - type: header
        fields:
          - field: sign
            type: Byte1
            choices: {p: plus, m: minus}
            description: The sign.
          - {field: n, type: Int8, signed: false, description: The number.}
          - {field: note, type: String, only_if: {field: sign, in: [p]}, description: A note.}
          - {field: len_blob, type: Int16, signed: false, description: Blob length.}
          - {field: blob, type: Byten, length: len_blob, description: A blob.}
"""

SPEC_SCRIPT = """
import importlib
import itertools
import sys
from functools import reduce

from hypothesis import HealthCheck, given, settings, strategies as st
from pyspark.sql import functions as F

from codegen.loader import load_spec
from pgcdc.runtime.spark import local_spark_session
from tests.support import spec_strategies as S

spark = local_spark_session("spec-jvm")


def check(path):
    spec = load_spec(path)
    codec = importlib.import_module(spec.targets.package)
    cs = importlib.import_module(spec.targets.package + ".spark")
    params = codec._decoder.PARAMS
    modes, contexts = spec.modes, spec.per_message_contexts
    combos = []
    for args in itertools.product(
        spec.version.values,
        *([v for v, _ in m.enables] for m in modes),
        *[(False, True)] * len(contexts),
    ):
        try:
            combos.append((args, params.resolve(*args)))
        except ValueError:
            pass
    groups = sorted({args[: 1 + len(modes)] for args, _ in combos})
    flags = [f"flag{i}" for i in range(len(contexts))]
    schema = ", ".join(["id long", "grp int", "data binary", *(f"{f} boolean" for f in flags)])
    checked = []

    def decoded(df, engine):
        parts = []
        for k, group in enumerate(groups):
            kwargs = {spec.version.name: group[0], **{m.name: v for m, v in zip(modes, group[1:])}}
            kwargs.update({f"{c.name}_col": f for c, f in zip(contexts, flags)})
            parts.append(cs.decode_messages(df.where(F.col("grp") == k), engine=engine, **kwargs))
        out = reduce(lambda a, b: a.unionByName(b), parts)
        return {r.id: r.asDict(recursive=True) for r in out.collect()}

    @settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.tuples(*[
        S.blocks(spec, codec, m.blocks, m.class_name, g).map(lambda msg, a=args, g=g: (a, g, msg))
        for args, g in combos
        for m in S.messages_allowed(spec, g)
    ]))
    def run(cases):
        rows = []
        for args, gates, msg in cases:
            wire = codec.encode_gates(msg, *gates)
            grp = groups.index(args[: 1 + len(modes)])
            for data in [wire[:cut] for cut in range(len(wire) + 1)] + [wire + b"x"]:
                rows.append((len(rows), grp, data, *args[1 + len(modes):]))
        df = spark.createDataFrame(rows, schema)
        jvm, python = decoded(df, "jvm"), decoded(df, "python")
        assert jvm == python, [(i, jvm[i], python[i]) for i in python if jvm.get(i) != python[i]][:2]
        checked.append(sum(r["decode_error"] is None for r in python.values()))

    run()
    assert sum(checked) > 0, path


for path in sys.argv[1:]:
    check(path)
print("ok")
"""


def test_other_specs_engines_agree(tmp_path):
    """Specs that are not PostgreSQL's rendered on disk (the toy spec: other parameter and
    context names, a mode, a per-message context, a repeat of scalars, an optional tagged
    part, a rest-of-message field; WIDE_SPEC above): the JVM engine equals the Python one on
    generated messages cut at every offset."""
    import os
    import subprocess
    import sys

    from tests.support import kaitai as K

    wide = tmp_path / "wide.yaml"
    wide.write_text(WIDE_SPEC)
    specs = [ROOT / "tests" / "specs" / "toy.yaml", wide]
    for spec in specs:
        K.build_codec(spec, tmp_path, ("python", "spark", "jvm"))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{ROOT}")
    proc = subprocess.run(
        [sys.executable, "-c", SPEC_SCRIPT, *map(str, specs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


def test_a_cache_that_cannot_be_written_is_unavailable(spark, monkeypatch, tmp_path):
    """engine="auto" then falls back (JvmUnavailable), it does not fail."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PGCDC_JVM_CACHE", str(blocker / "jvm"))
    monkeypatch.setattr(spark_jvm, "_jars", {})
    with pytest.raises(spark_jvm.JvmUnavailable, match="cannot build the decoder's jar"):
        spark_jvm.jvm_jars(pgs.CODEC, spark.version)
