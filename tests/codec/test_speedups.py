"""The C accelerator against the pure-Python codec: same values, same errors, no leaks.

The pure-Python code is the reference here (it is checked against the hand-written vectors,
Kaitai and real servers elsewhere); these tests feed both the same valid, damaged and
ill-typed input and require identical outcomes.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from pgoutput_codec import _decoder
from tests.support import strategies as S

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "generated" / "pgoutput_codec" / "_speedups.c"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("PGOUTPUT_CODEC_PURE")), reason="PGOUTPUT_CODEC_PURE is set"
)


def outcome(fn, *args, **kw):
    """What a call gives: ("ok", value) or the exception's type, offset, path and text."""
    try:
        return ("ok", fn(*args, **kw))
    except pgc.CodecError as exc:
        return (type(exc).__name__, exc.offset, exc.path, str(exc))
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return (type(exc).__name__, str(exc))


def both(fn, *args, **kw):
    """The outcome through the accelerator and through pure Python."""
    assert pgc.use_speedups(True), "the C accelerator is not built"
    try:
        fast = outcome(fn, *args, **kw)
        pgc.use_speedups(False)
        pure = outcome(fn, *args, **kw)
    finally:
        pgc.use_speedups(True)
    return fast, pure


SPEEDUPS = _decoder.DISPATCH.speedups


def test_accelerator_is_built_and_current():
    assert SPEEDUPS is not None, "build it: pip install -e . (or make generate)"
    assert SPEEDUPS.ACCEL_ID == _decoder.DISPATCH.accel_id
    assert pgc.speedups_enabled()
    # the decode tables really hold the C functions
    assert type(_decoder.DISPATCH.tables[1][ord("I")]).__name__ == "builtin_function_or_method"


def test_a_stale_build_is_refused(monkeypatch):
    monkeypatch.setattr(SPEEDUPS, "ACCEL_ID", "0" * 16)
    with pytest.warns(RuntimeWarning, match="other generated code"):
        assert _decoder.DISPATCH._load_speedups(vars(_decoder)) is None


def test_switching_off_reaches_existing_stream_decoders(monkeypatch):
    dec = pgc.StreamDecoder(protocol_version=1)
    seen = []
    monkeypatch.setattr(_decoder, "_decode_begin", _decoder._decode_begin)
    begin = pgc.encode(pgc.Begin(final_lsn=1, commit_time=2, xid=3), protocol_version=1)
    try:
        pgc.use_speedups(False)
        assert not pgc.speedups_enabled()
        assert _decoder.DISPATCH.tables[1][ord("B")] is _decoder._decode_begin
        seen.append(dec.decode(begin))
    finally:
        pgc.use_speedups(True)
    assert _decoder.DISPATCH.tables[1][ord("B")] is SPEEDUPS.decode_begin
    assert dec.decode(begin) == seen[0]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_generated_c_compiles_without_warnings(tmp_path):
    """The generated source is clean under -Wall -Wextra, as a compiler sees it."""
    include = sysconfig.get_paths()["include"]
    proc = subprocess.run(
        [
            "cc",
            "-std=c99",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Wno-unused-parameter",
            "-Wno-missing-field-initializers",
            "-Werror",
            "-fPIC",
            "-c",
            f"-I{include}",
            f"-I{ROOT / 'pgcdc' / 'runtime'}",
            str(SOURCE),
            "-o",
            str(tmp_path / "speedups.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


# -- decoding: valid input, then the same input damaged ---------------------------------------
def _damage(wire: bytes, how: int, at: int, byte: int) -> bytes:
    at %= len(wire) + 1
    if how == 0:
        return wire[:at]  # truncated
    if how == 1:
        return wire[:at] + bytes([byte]) + wire[at + 1 :]  # one byte replaced
    if how == 2:
        return wire[:at] + bytes([byte]) + wire[at:]  # one byte inserted
    return wire[:at] + wire[at + 1 :]  # one byte dropped


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=S.message_cases(),
    how=st.integers(0, 4),
    at=st.integers(0, 1 << 16),
    byte=st.sampled_from([0, 1, 0x4E, 0x4B, 0x4F, 0x6E, 0x74, 0x75, 0x62, 0x7F, 0xFF]),
)
def test_decode_agrees_on_valid_and_damaged_input(case, how, at, byte):
    pv, streaming, in_stream, msg = case
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    wire = pgc.encode(msg, **kw)
    fast, pure = both(pgc.decode, wire, **kw)
    assert fast == pure == ("ok", msg)
    if how < 4:
        bad = _damage(wire, how, at, byte)
        fast, pure = both(pgc.decode, bad, **kw)
        assert fast == pure


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=64),
    pv=st.sampled_from([1, 2, 3, 4]),
    in_stream=st.booleans(),
    tag=st.sampled_from(sorted({m.tag for m in S.spec().messages})),
)
def test_decode_agrees_on_random_bytes(data, pv, in_stream, tag):
    kw = dict(
        protocol_version=pv, streaming="off" if pv < 2 else "on", in_stream=in_stream and pv >= 2
    )
    wire = tag.encode("latin-1") + data
    fast, pure = both(pgc.decode, wire, **kw)
    assert fast == pure


def test_stream_decoder_agrees_on_a_stream():
    """Stream Start/Stop tracking sits in Python; the accelerator sees the same context."""
    msgs = [
        pgc.StreamStart(xid=7, first_segment=1),
        pgc.Insert(
            xid=7,
            relation_oid=16384,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=b"x"),)),
        ),
        pgc.StreamStop(),
        pgc.Insert(
            relation_oid=16384, new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="n"),))
        ),
    ]
    wires = [
        pgc.encode(msgs[0], protocol_version=2, streaming="on"),
        pgc.encode(msgs[1], protocol_version=2, streaming="on", in_stream=True),
        pgc.encode(msgs[2], protocol_version=2, streaming="on"),
        pgc.encode(msgs[3], protocol_version=2, streaming="on"),
    ]

    def run():
        dec = pgc.StreamDecoder(protocol_version=2, streaming="on")
        return [dec.decode(w) for w in wires]

    assert both(run) == (("ok", msgs), ("ok", msgs))


# -- encoding: valid messages, then one attribute swapped for something odd --------------------
ODD = [
    None,
    -1,
    0,
    255,
    256,
    65536,
    2**31,
    2**32,
    2**63,
    2**64,
    -(2**63) - 1,
    1.5,
    True,
    "t",
    "x",
    "",
    "K",
    "a\x00b",
    "caf\u00e9",
    "\udcff",
    b"",
    b"ab",
    bytearray(b"ab"),
    memoryview(b"ab"),
    (),
    [],
    ("x",),
    object(),
]


def _swap(obj, rnd_index: int, value):
    """obj with one attribute (found depth-first, TupleData columns included) set to value."""
    slots = []

    def walk(o, path):
        if dataclasses.is_dataclass(o):
            for f in dataclasses.fields(o):
                slots.append(path + (f.name,))
                walk(getattr(o, f.name), path + (f.name,))
        elif isinstance(o, tuple):
            for i, item in enumerate(o):
                walk(item, path + (i,))

    walk(obj, ())
    if not slots:
        return obj
    target = slots[rnd_index % len(slots)]

    def rebuild(o, path):
        if not path:
            return value
        head, rest = path[0], path[1:]
        if isinstance(head, int):
            items = list(o)
            items[head] = rebuild(items[head], rest)
            return tuple(items)
        return dataclasses.replace(o, **{head: rebuild(getattr(o, head), rest)})

    return rebuild(obj, target)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=S.message_cases(),
    index=st.integers(0, 1000),
    value=st.sampled_from(ODD),
    as_list=st.booleans(),
)
def test_encode_agrees_on_valid_and_odd_values(case, index, value, as_list):
    pv, streaming, in_stream, msg = case
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    fast, pure = both(pgc.encode, msg, **kw)
    assert fast == pure and fast[0] == "ok"
    odd = _swap(msg, index, list(value) if as_list and isinstance(value, tuple) else value)
    fast, pure = both(pgc.encode, odd, **kw)
    assert fast == pure


def test_encode_agrees_on_the_wrong_protocol_and_non_messages():
    begin = pgc.StreamStart(xid=1, first_segment=0)
    assert (
        both(pgc.encode, begin, protocol_version=1)[0]
        == both(pgc.encode, begin, protocol_version=1)[1]
    )
    for thing in (None, 3, b"B", pgc.TupleData(columns=())):
        fast, pure = both(pgc.encode, thing, protocol_version=1)
        assert fast == pure and fast[0] == "EncodeError"


# -- memory: no reference leaks on the fast path or the fallback path -------------------------
@pytest.mark.parametrize("impl", ["c", "python"])
def test_no_leaks_on_success_or_fallback(impl):
    from bench.codec_bench import corpus

    data = corpus(50)
    dec = pgc.StreamDecoder(protocol_version=1)
    msgs = [dec.decode(b) for b in data]
    damaged = [b[:-1] for b in data] + [b + b"\x00" for b in data]

    def cycle():
        d = pgc.StreamDecoder(protocol_version=1)
        for b in data:
            d.decode(b)
        for m in msgs:
            pgc.encode(m, protocol_version=1)
        for b in damaged:
            try:
                pgc.decode(b, protocol_version=1)
            except pgc.DecodeError:
                pass
        for m in msgs[:50]:
            try:
                pgc.encode(_swap(m, 1, 2**70), protocol_version=1)
            except pgc.EncodeError:
                pass

    pgc.use_speedups(impl == "c")
    try:
        _measure(cycle)
    finally:
        pgc.use_speedups(True)


def _measure(cycle):
    for _ in range(3):
        cycle()  # warm caches
    gc.collect()  # errors leave traceback/frame cycles for the collector
    before = sys.getallocatedblocks()
    for _ in range(20):
        cycle()
    gc.collect()
    grown = sys.getallocatedblocks() - before
    # one leaked object per message would add about 20 * 1500 blocks
    assert grown < 500, grown
