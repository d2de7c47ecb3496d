"""decode_messages' fast batch path: the accelerator's decode_arrow writes Arrow buffers and
pgcdc.runtime.spark.buffers wraps them. For every spec (pgoutput, replication and the toy spec
of tests/specs/), a batch decoded that way must equal, value for value and type for type, the
batch decoded row by row into the codec's objects (decode_tuple, then
pgcdc.runtime.spark.arrow): the independent path. A batch holding a row decode_arrow declines
(a string that is not UTF-8, a truncated message) goes down the other paths, which name the
row.

No Spark job runs here: the batches are built with pyarrow, as mapInArrow hands them over.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import spec_strategies as S

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "specs" / "toy.yaml"
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True
)


def gate_args(spec, codec) -> dict:
    """gates tuple -> (codec parameters, per-message flags) that resolve to it."""
    choices = [spec.version.values, *([v for v, _ in m.enables] for m in spec.modes)]
    flags = [(False, True)] * len(spec.per_message_contexts)
    out: dict = {}
    for args in itertools.product(*choices, *flags):
        try:
            gates = codec.PARAMS.resolve(*args)
        except ValueError:
            continue
        params = len(choices)
        out.setdefault(gates, (args[:params], args[params:]))
    return out


def batch_decoder(spark_codec, message_schema, params: tuple, contexts: list):
    """A BatchDecoder as decode_messages makes it, the per-message contexts read from columns
    1, 2, ... of the batch."""
    from pyspark.sql.pandas.types import to_arrow_type

    from pgcdc.runtime.spark.batches import BatchDecoder

    message_type = to_arrow_type(message_schema, timezone="UTC")
    columns = [(name, i + 1, name) for i, name in enumerate(contexts)]
    return BatchDecoder(spark_codec, params, 0, columns, False, message_type)


def check_batches(spec, codec, spark_codec, message_schema, cases) -> int:
    """Decode `cases` ((gates, message) pairs) per parameter set both ways and compare; the
    number of batches the buffer path took."""
    import pyarrow as pa

    args = gate_args(spec, codec)
    contexts = [c.name for c in spec.per_message_contexts]
    groups: dict = {}
    for gates, msg in cases:
        params, flags = args[gates]
        groups.setdefault(params, []).append((codec.encode_gates(msg, *gates), flags))
    fast = 0
    for params, rows in groups.items():
        dec = batch_decoder(spark_codec, message_schema, params, contexts)
        assert dec.decode_arrow is not None
        batch = pa.RecordBatch.from_arrays(
            [pa.array([d for d, _ in rows], pa.binary())]
            + [pa.array([f[i] for _, f in rows], pa.bool_()) for i in range(len(contexts))],
            names=["data", *contexts],
        )
        buffers = dec._decode_arrow(batch)
        dec.decode_arrow = dec.decode_columns = None  # the expected values: through objects
        objects, errors = dec.decode(batch)
        if buffers is None:
            # only a row the codec reports (here: a string Spark cannot hold) is declined
            assert errors is not None, params
            continue
        fast += 1
        assert errors is None, params
        assert buffers.type == objects.type, params
        assert buffers.to_pylist() == objects.to_pylist(), params
        assert buffers.is_valid().to_pylist() == objects.is_valid().to_pylist()
    return fast


def _installed(package: str):
    import importlib

    from codegen.loader import load_spec

    codec = importlib.import_module(package)
    if not codec.speedups_enabled():
        pytest.skip("the C accelerator is not built")
    spark = importlib.import_module(f"{package}.spark")
    schema = importlib.import_module(f"{package}.spark_schema")
    spec = load_spec(ROOT / "spec" / f"{package.split('_')[0]}.yaml")
    return spec, codec, spark.CODEC, schema.MESSAGE_SCHEMA


@pytest.mark.parametrize("package", ["pgoutput_codec", "replication_codec"])
def test_buffers_equal_the_object_path(package):
    spec, codec, spark_codec, schema = _installed(package)

    @EXAMPLES
    @given(cases=st.lists(S.cases(spec, codec), min_size=1, max_size=80))
    def run(cases):
        check_batches(spec, codec, spark_codec, schema, cases)

    run()


@pytest.mark.parametrize("package", ["pgoutput_codec", "replication_codec"])
def test_valid_batches_take_the_buffer_path(package):
    """Messages with valid UTF-8 strings never leave the buffer path."""
    spec, codec, spark_codec, schema = _installed(package)

    def utf8(case):
        return _all_utf8(case[1])

    @EXAMPLES
    @given(cases=st.lists(S.cases(spec, codec).filter(utf8), min_size=1, max_size=40))
    def run(cases):
        groups = len({gate_args(spec, codec)[g][0] for g, _ in cases})
        assert check_batches(spec, codec, spark_codec, schema, cases) == groups

    run()


def _all_utf8(value) -> bool:
    import dataclasses

    if isinstance(value, str):  # UTF-8 holds every code point but the surrogates
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, tuple):
        return all(map(_all_utf8, value))
    if dataclasses.is_dataclass(value):
        return all(_all_utf8(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=16))
def test_strings_are_taken_exactly_when_python_decodes_them(raw):
    """decode_arrow's UTF-8 check agrees with Python's strict decoder on any bytes."""
    import pyarrow as pa

    import pgoutput_codec as pgc

    if not pgc.speedups_enabled():
        pytest.skip("the C accelerator is not built")
    from pgoutput_codec import _decoder

    raw = raw.replace(b"\x00", b"")
    msg = pgc.Message(flags=0, lsn=1, prefix=raw.decode("utf-8", "surrogateescape"), content=b"")
    data = pa.array([pgc.encode(msg, protocol_version=1)], pa.binary())
    _, offsets, values = data.buffers()
    try:
        _decoder.DISPATCH.speedups.decode_arrow(offsets, values, False, 0, 1, (1, False, False))
        taken = True
    except _decoder.Retry:
        taken = False
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert taken == valid, raw


def test_a_truncated_row_sends_the_batch_down_the_row_path():
    """The other rows still decode; the bad one gets its offset."""
    import pyarrow as pa

    import pgoutput_codec as pgc
    from pgoutput_codec import spark as pgs
    from pgoutput_codec.spark_schema import MESSAGE_SCHEMA

    if not pgc.speedups_enabled():
        pytest.skip("the C accelerator is not built")
    dec = batch_decoder(pgs.CODEC, MESSAGE_SCHEMA, (1, "off"), ["in_stream"])
    begin = pgc.encode(pgc.Begin(final_lsn=1, commit_time=2, xid=3), protocol_version=1)
    batch = pa.RecordBatch.from_arrays(
        [pa.array([begin, begin[:-1], begin], pa.binary()), pa.array([False] * 3)],
        names=["data", "in_stream"],
    )
    assert dec._decode_arrow(batch) is None
    message, errors = dec.decode(batch)
    assert message.is_valid().to_pylist() == [True, False, True]
    assert errors.to_pylist()[1].startswith("cannot decode at byte 1")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_toy_spec_buffers_equal_the_object_path(tmp_path):
    """The toy codec (a spec that is not PostgreSQL's: a repeat of scalars, an optional tagged
    part, a rest-of-message field, a mode and a per-message context) compiled on disk."""
    from tests.support import kaitai as K

    K.build_codec(TOY, tmp_path, ("python", "spark"))
    script = textwrap.dedent(f"""
        from hypothesis import HealthCheck, given, settings, strategies as st
        import toy_codec
        from toy_codec import spark, spark_schema
        from codegen.loader import load_spec
        from tests.support import spec_strategies as S
        from tests.spark.test_spark_buffers import check_batches

        assert toy_codec.speedups_enabled()
        spec = load_spec({str(TOY)!r})
        taken = []

        @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
        @given(cases=st.lists(S.cases(spec, toy_codec), min_size=1, max_size=40))
        def run(cases):
            taken.append(check_batches(spec, toy_codec, spark.CODEC,
                                       spark_schema.MESSAGE_SCHEMA, cases))

        run()
        assert sum(taken) > 0
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
