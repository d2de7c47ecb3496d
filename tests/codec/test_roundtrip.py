"""Property tests: every message x protocol version x context round-trips both ways."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from tests.support import strategies as S

CASES = S.every_message_in_every_context()
# every test here runs through the C accelerator and through pure Python
pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("codec_impl")]


def _id(case):
    (pv, streaming, in_stream), m = case
    return f"{m.class_name}-v{pv}-{streaming}{'-in_stream' if in_stream else ''}"


def test_every_message_and_context_is_covered():
    names = {m.name for _, m in CASES}
    assert len(names) == len(S.spec().messages) == 19
    assert {ctx for ctx, _ in CASES} == set(S.contexts())


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_roundtrip(case, data):
    (pv, streaming, in_stream), m = case
    msg = data.draw(S.message_in_context((pv, streaming, in_stream), m.name))
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    wire = pgc.encode(msg, **kw)
    assert wire[:1] == m.tag.encode("latin-1")
    back = pgc.decode(wire, **kw)
    assert back == msg
    assert type(back) is type(msg)
    _assert_public_and_frozen(back)
    assert pgc.encode(back, **kw) == wire
    # memoryview and bytearray input decode the same
    assert pgc.decode(memoryview(wire), **kw) == msg
    assert pgc.decode(bytearray(wire), **kw) == msg


def _assert_public_and_frozen(value):
    """Decoders build values through private mutable subclasses: what they return must be the
    public frozen class, at every level."""
    if isinstance(value, tuple):
        for item in value:
            _assert_public_and_frozen(item)
        return
    if not dataclasses.is_dataclass(value):
        return
    cls = type(value)
    assert getattr(pgc, cls.__name__) is cls
    hash(value)
    for f in dataclasses.fields(value):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, f.name, None)
        _assert_public_and_frozen(getattr(value, f.name))


@settings(max_examples=200, deadline=None)
@given(S.message_cases())
def test_decode_of_encode_and_truncation(case):
    pv, streaming, in_stream, msg = case
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    wire = pgc.encode(msg, **kw)
    # Every proper prefix is an error that points inside the message; never a wrong value.
    for cut in range(len(wire)):
        with pytest.raises(pgc.DecodeError) as exc:
            pgc.decode(wire[:cut], **kw)
        assert 0 <= exc.value.offset <= cut
    with pytest.raises(pgc.DecodeError) as exc:
        pgc.decode(wire + b"\x00", **kw)
    assert exc.value.offset == len(wire)
    assert "trailing" in str(exc.value)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64), st.sampled_from(S.contexts()))
def test_arbitrary_bytes_never_crash(data, ctx):
    """Garbage either decodes to a message that re-encodes to the same bytes, or is a DecodeError."""
    pv, streaming, in_stream = ctx
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    try:
        msg = pgc.decode(data, **kw)
    except pgc.DecodeError as exc:
        assert 0 <= exc.offset <= len(data)
        return
    assert pgc.encode(msg, **kw) == data


@settings(max_examples=50, deadline=None)
@given(st.lists(S.message_cases(), min_size=1, max_size=20))
def test_stream_decoder_tracks_stream_blocks(cases):
    """Feed a slot-like sequence: StreamDecoder must infer in_stream from S/E by itself."""
    pv = max(c[0] for c in cases)
    streaming = "parallel" if pv >= 4 else ("on" if pv >= 2 else "off")
    dec = pgc.StreamDecoder(protocol_version=pv, streaming=streaming)
    in_stream = False
    # the in_stream value each rule-bound message needs (others are sent anywhere): the server
    # never sends them elsewhere, and strict mode rejects that (tests/codec/test_hostile_codec.py)
    needs = {"S": False, "E": True, **dict.fromkeys("BCcAbPKrp", False)}
    for _, _, _, msg in cases:
        if msg.SINCE > pv or needs.get(msg.TAG, in_stream) != in_stream:
            continue
        try:
            wire = pgc.encode(msg, protocol_version=pv, streaming=streaming, in_stream=in_stream)
        except pgc.EncodeError:
            continue  # drawn for another context; the decoder is what is under test here
        assert dec.in_stream == in_stream
        assert dec.decode(wire) == msg
        if msg.TAG == "S":
            in_stream = True
        elif msg.TAG == "E":
            in_stream = False
    assert dec.in_stream == in_stream
