"""The hand-written vectors drive the decoder, the encoder, and the error paths."""

from __future__ import annotations

import pytest

import pgoutput_codec as pgc
from tests.support.vectors import BAD, VECTORS

IDS = [v[0] for v in VECTORS]
# every test here runs through the C accelerator and through pure Python
pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("codec_impl")]


@pytest.mark.parametrize("name,ctx,wire,expected", VECTORS, ids=IDS)
def test_decode(name, ctx, wire, expected):
    assert pgc.decode(wire, **ctx) == expected


@pytest.mark.parametrize("name,ctx,wire,expected", VECTORS, ids=IDS)
def test_encode(name, ctx, wire, expected):
    assert pgc.encode(expected, **ctx) == wire


@pytest.mark.parametrize("name,ctx,wire,expected", VECTORS, ids=IDS)
def test_every_truncation_is_an_error(name, ctx, wire, expected):
    for cut in range(len(wire)):
        with pytest.raises(pgc.DecodeError) as exc:
            pgc.decode(wire[:cut], **ctx)
        err = exc.value
        assert 0 <= err.offset <= cut, (cut, str(err))
        assert isinstance(err.path, tuple)


@pytest.mark.parametrize("name,ctx,wire,expected", VECTORS, ids=IDS)
def test_trailing_bytes_are_an_error(name, ctx, wire, expected):
    with pytest.raises(pgc.DecodeError, match="trailing") as exc:
        pgc.decode(wire + b"\x01\x02", **ctx)
    assert exc.value.offset == len(wire)


@pytest.mark.parametrize("name,ctx,wire,offset,path,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input(name, ctx, wire, offset, path, words):
    with pytest.raises(pgc.DecodeError) as exc:
        pgc.decode(wire, **ctx)
    err = exc.value
    assert (err.offset, err.path) == (offset, path)
    assert words in str(err)
    assert f"byte {offset}" in str(err)


def test_helpers_are_views_not_replacements():
    begin = pgc.Begin(final_lsn=0x16B374D848, commit_time=0, xid=1)
    assert begin.final_lsn_text == "16/B374D848"
    assert begin.commit_time_datetime.isoformat() == "2000-01-01T00:00:00+00:00"
    assert begin.final_lsn == 0x16B374D848


ENCODE_ERRORS = [
    (
        "lsn-negative",
        pgc.Begin(final_lsn=-1, commit_time=0, xid=1),
        dict(protocol_version=1),
        ("Begin", "final_lsn"),
        "outside",
    ),
    (
        "xid-too-big",
        pgc.Begin(final_lsn=0, commit_time=0, xid=2**32),
        dict(protocol_version=1),
        ("Begin", "xid"),
        "outside",
    ),
    (
        "missing-xid-in-stream",
        pgc.Insert(relation_oid=1, new_tuple=pgc.TupleData(columns=())),
        dict(protocol_version=2, streaming="on", in_stream=True),
        ("Insert", "xid"),
        "missing",
    ),
    (
        "xid-outside-stream",
        pgc.Insert(xid=3, relation_oid=1, new_tuple=pgc.TupleData(columns=())),
        dict(protocol_version=2),
        ("Insert", "xid"),
        "must be None",
    ),
    (
        "abort-lsn-without-parallel",
        pgc.StreamAbort(xid=1, subxid=1, abort_lsn=5, abort_time=5),
        dict(protocol_version=4, streaming="on"),
        ("StreamAbort", "abort_lsn"),
        "must be None",
    ),
    (
        "abort-lsn-missing-in-parallel",
        pgc.StreamAbort(xid=1, subxid=1),
        dict(protocol_version=4, streaming="parallel"),
        ("StreamAbort", "abort_lsn"),
        "missing",
    ),
    (
        "message-too-new",
        pgc.StreamStop(),
        dict(protocol_version=1),
        ("StreamStop",),
        "protocol_version 2",
    ),
    (
        "nul-in-string",
        pgc.Origin(origin_lsn=0, origin_name="a\x00b"),
        dict(protocol_version=1),
        ("Origin", "origin_name"),
        "NUL",
    ),
    (
        "text-without-value",
        pgc.Insert(
            relation_oid=1,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=None),)),
        ),
        dict(protocol_version=1),
        ("Insert", "new_tuple", "columns", 0, "value"),
        "missing",
    ),
    (
        "null-with-value",
        pgc.Insert(
            relation_oid=1,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="n", value=b"x"),)),
        ),
        dict(protocol_version=1),
        ("Insert", "new_tuple", "columns", 0, "value"),
        "must be None",
    ),
    (
        "bad-kind",
        pgc.Insert(
            relation_oid=1,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="z", value=None),)),
        ),
        dict(protocol_version=1),
        ("Insert", "new_tuple", "columns", 0, "kind"),
        "not one of",
    ),
    (
        "old-tuple-without-kind",
        pgc.Update(
            relation_oid=1, old_tuple=pgc.TupleData(columns=()), new_tuple=pgc.TupleData(columns=())
        ),
        dict(protocol_version=1),
        ("Update", "old_tuple"),
        "must be None",
    ),
    (
        "truncate-oid-range",
        pgc.Truncate(options=0, relation_oids=(1, -1)),
        dict(protocol_version=1),
        ("Truncate", "relation_oids", 1),
        "not a valid",
    ),
]


@pytest.mark.parametrize(
    "name,msg,ctx,path,words", ENCODE_ERRORS, ids=[e[0] for e in ENCODE_ERRORS]
)
def test_encode_errors(name, msg, ctx, path, words):
    with pytest.raises(pgc.EncodeError) as exc:
        pgc.encode(msg, **ctx)
    assert exc.value.path == path
    assert words in str(exc.value)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError):
        pgc.decode(b"E", protocol_version=1, streaming="on")
    with pytest.raises(ValueError):
        pgc.decode(b"E", protocol_version=3, streaming="parallel")
    with pytest.raises(ValueError):
        pgc.decode(b"E", protocol_version=9)
    with pytest.raises(ValueError):
        pgc.StreamDecoder(protocol_version=4, streaming="sometimes")
    with pytest.raises(ValueError):  # unhashable: still a ValueError, not a TypeError
        pgc.encode(pgc.StreamStop(), protocol_version=[2])


@pytest.mark.parametrize("pv", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("streaming", ["off", "on", "parallel", "sometimes"])
@pytest.mark.parametrize("in_stream", [False, True])
def test_which_contexts_exist(pv, streaming, in_stream):
    """Protocols 1-4; streaming from 2, parallel from 4; a stream block needs streaming's v2."""
    exists = (
        1 <= pv <= 4
        and streaming in ("off", "on", "parallel")
        and (streaming == "off" or pv >= 2)
        and (streaming != "parallel" or pv >= 4)
        and (not in_stream or pv >= 2)
    )
    for call in (
        lambda: pgc.decode(
            b"E" if pv >= 2 else b"B" + bytes(20),
            protocol_version=pv,
            streaming=streaming,
            in_stream=in_stream,
        ),
        lambda: pgc.encode(
            pgc.Begin(final_lsn=0, commit_time=0, xid=0),
            protocol_version=pv,
            streaming=streaming,
            in_stream=in_stream,
        ),
    ):
        if exists:
            call()
        else:
            with pytest.raises(ValueError):
                call()


def test_stream_decoder_survives_a_bad_message():
    dec = pgc.StreamDecoder(protocol_version=2, streaming="on")
    dec.decode(bytes.fromhex("530000000701"))
    with pytest.raises(pgc.DecodeError):
        dec.decode(bytes.fromhex("4900000007"))  # truncated insert inside the stream
    assert dec.in_stream
    assert dec.decode(bytes.fromhex("45")) == pgc.StreamStop()
    assert not dec.in_stream


@pytest.mark.parametrize("pv", [1, 2, 3, 4])
def test_stream_abort_without_streaming_requested(pv):
    """PG 18 was seen sending Stream Abort to slots that never asked for streaming, protocol 1
    clients included (estuary/connectors#5228): it decodes, outside any stream, and re-encodes."""
    wire = bytes.fromhex("41000001F4000001F5")
    dec = pgc.StreamDecoder(protocol_version=pv, streaming="off")
    assert dec.decode(bytes.fromhex("42" + "00" * 20)) == pgc.Begin(
        final_lsn=0, commit_time=0, xid=0
    )
    msg = dec.decode(wire)
    assert msg == pgc.StreamAbort(xid=500, subxid=501)
    assert not dec.in_stream
    assert pgc.encode(msg, protocol_version=pv) == wire
