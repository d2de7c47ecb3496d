"""Hostile values and hostile bytes for the generated codecs (issue 12, the codec side).

- encode: every field of every message of every spec, given a wrong type or value (derived
  from the spec model), raises EncodeError naming that field, and nothing else;
- decode: every entry point rejects input that is not bytes-like with a TypeError that says
  what it got;
- capture: malformed files, records and values raise the codec's own errors with a path;
- StreamDecoder: sequences of messages fuzzed against a small model of PostgreSQL's
  apply-worker rules, written here independently of the spec, in strict and lenient mode.

The installed codecs run through the C accelerator and pure Python (`codec_impl`); the toy
spec's codec is rendered and imported from memory, so it runs in pure Python.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
import replication_codec as rc
from codegen.model import BYTE1, BYTEN, REST, STRING, Block, implicit_fields
from codegen.sample import int_bounds
from tests.support import kaitai as K
from tests.support import spec_strategies as S

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "specs" / "toy.yaml"
SPECS = {
    "pgoutput": (ROOT / "spec" / "pgoutput.yaml", pgc),
    "replication": (ROOT / "spec" / "replication.yaml", rc),
}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def toy():
    r = K.rendered(TOY)
    return r.spec, K.fresh_codec(r)


@functools.cache
def _specs():
    return {key: (K.load_spec(path), codec) for key, (path, codec) in SPECS.items()}


# -- encode: hostile values for every field -------------------------------------------------
class _Other:
    """An object of no codec class."""


def _kinds(spec) -> dict:
    """class name -> {attribute: (kind, field or element class, optional tagged head)}."""
    out: dict = {}

    def scan(class_name: str, blocks) -> None:
        attrs = out.setdefault(class_name, {})
        implicit = implicit_fields(blocks)
        for b in blocks:
            if b.kind == "repeat":
                if len(b.fields) == 1:
                    attrs[b.name] = ("repeat", b.fields[0], False)
                else:
                    attrs[b.name] = ("repeat", b.struct, False)
                    scan(b.struct, (Block("header", b.fields),))
                continue
            for i, f in enumerate(b.fields):
                if f.is_literal or f.name in implicit:
                    continue
                attrs[f.name] = ("field", f, b.kind == "tagged" and b.optional and i == 0)

    for m in spec.messages:
        scan(m.class_name, m.blocks)
    for p in spec.parts:
        scan(p.class_name, p.blocks)
    return out


def _field_hostiles(spec, f, optional_head: bool) -> list:
    """Values that are never right for field f (None only where the field is required)."""
    if f.is_int:
        lo, hi = int_bounds(f)
        values = [True, False, lo - 1, hi + 1, 1.5, "1", b"\x01", None]
    elif f.type == BYTE1:
        values = ["", "??", "\x00", 1, True, b"x", ["x"], None]
    elif f.type == STRING:
        values = [b"x", 1, True, "a\x00b", ("a",), None]
    elif f.type in (BYTEN, REST):
        values = ["x", 1, True, 2**40, [1, 2], None]
    else:
        assert f.type in spec.parts_by_name, f"no hostile values for {f.type}"
        values = [None, 1, "x", b"", _Other(), (1,)]
    return [v for v in values if not (v is None and optional_head)]


def _locations(kinds: dict, obj, path: tuple):
    """(path, hostile-value builder) for every field and element under obj."""
    for name, (kind, info, optional_head) in kinds[type(obj).__name__].items():
        value = getattr(obj, name)

        def put(new, name=name):
            return dataclasses.replace(obj, **{name: new})

        yield (*path, name), kind, info, optional_head, value, put
        if kind == "repeat":
            for i, el in enumerate(value):

                def put_el(new, i=i, name=name, value=value):
                    return dataclasses.replace(obj, **{name: (*value[:i], new, *value[i + 1 :])})

                yield (*path, name, i), "element", info, False, el, put_el
                if dataclasses.is_dataclass(el):
                    for loc in _locations(kinds, el, (*path, name, i)):
                        yield (*loc[:5], lambda new, loc=loc, put_el=put_el: put_el(loc[5](new)))
        elif dataclasses.is_dataclass(value) and type(value).__name__ in kinds:
            for loc in _locations(kinds, value, (*path, name)):
                yield (*loc[:5], lambda new, loc=loc, put=put: put(loc[5](new)))


def _hostiles(spec, kind, info, optional_head, current) -> list:
    if kind == "field":
        values = _field_hostiles(spec, info, optional_head)
    elif kind == "repeat":
        values = [None, 1, "ab", b"ab", {1: 2}, 1.5, iter(())]
    elif isinstance(info, str):  # an element of a repeat of parts
        values = [None, 1, "x", _Other(), (1,)]
    else:  # a scalar element
        values = _field_hostiles(spec, info, False)
    return [v for v in values if not (v is None and current is None)]


def _assert_hostile_encode(spec, codec, data) -> None:
    kinds = _kinds(spec)
    gates, msg = data.draw(S.cases(spec, codec), label="valid message")
    locations = list(_locations(kinds, msg, (type(msg).__name__,)))
    if not locations:
        return
    path, kind, info, optional_head, current, put = data.draw(st.sampled_from(locations))
    bad = data.draw(st.sampled_from(_hostiles(spec, kind, info, optional_head, current)))
    hostile = put(bad)
    with pytest.raises(codec.EncodeError) as err:
        codec.encode_gates(hostile, *gates)
    assert err.value.path == path, (str(err.value), path, bad)


@pytest.mark.parametrize("key", sorted(SPECS))
@FUZZ
@given(data=st.data())
def test_every_wrong_field_value_raises_encode_error_naming_it(codec_impl, key, data):
    spec, codec = _specs()[key]
    _assert_hostile_encode(spec, codec, data)


@FUZZ
@given(data=st.data())
def test_every_wrong_field_value_raises_encode_error_naming_it_toy(toy, data):
    spec, codec = toy
    _assert_hostile_encode(spec, codec, data)


@pytest.mark.parametrize("codec", [pgc, rc], ids=["pgoutput", "replication"])
def test_what_is_not_a_message_raises_encode_error(codec_impl, codec):
    gates = codec.PARAMS.resolve(*[next(iter(a)) for a in _first_args(codec)])
    part = next((cls for cls in vars(codec).values() if isinstance(cls, type)), None)
    message_cls = next(iter(codec._encoder.ENCODERS))

    class Sub(message_cls):
        __slots__ = ()

    for obj in (None, 1, True, b"B", "B", object(), part, Sub.__new__(Sub)):
        with pytest.raises(codec.EncodeError) as err:
            codec.encode_gates(obj, *gates)
        assert err.value.path == ()
    if codec is pgc:
        with pytest.raises(codec.EncodeError, match="TupleData is not a message"):
            pgc.encode(pgc.TupleData(columns=()), protocol_version=1)


def _first_args(codec):
    return (
        [codec.PARAMS.versions]
        + [tuple(m.enables) for m in codec.PARAMS.modes]
        + [(False,) for _ in codec.PARAMS.per_message]
    )


BEGIN = pgc.Begin(final_lsn=1, commit_time=2, xid=3)


def _rel(**kw):
    return pgc.Relation(relation_oid=1, namespace="s", relation_name="t", **kw)


def test_known_holes_of_issue_12(codec_impl):
    """The cases named in the issue: None or an int where bytes or a sequence go (len() ran
    before the type check), a bool as an int, a str as bytes."""
    cases = [
        (pgc.Message(flags=0, lsn=1, prefix="p", content=None), ("Message", "content")),
        (pgc.Message(flags=0, lsn=1, prefix="p", content=7), ("Message", "content")),
        (pgc.Message(flags=0, lsn=1, prefix="p", content="text"), ("Message", "content")),
        (pgc.Message(flags=True, lsn=1, prefix="p", content=b""), ("Message", "flags")),
        (
            pgc.Insert(relation_oid=1, new_tuple=pgc.TupleData(columns=None)),
            ("Insert", "new_tuple", "columns"),
        ),
        (
            pgc.Insert(relation_oid=1, new_tuple=pgc.TupleData(columns=3)),
            ("Insert", "new_tuple", "columns"),
        ),
        (_rel(replica_identity=0, columns=None), ("Relation", "columns")),
        (_rel(replica_identity=False, columns=()), ("Relation", "replica_identity")),
        (pgc.Truncate(options=0, relation_oids=None), ("Truncate", "relation_oids")),
        (pgc.Truncate(options=0, relation_oids=5), ("Truncate", "relation_oids")),
        (pgc.Truncate(options=0, relation_oids=(1, True)), ("Truncate", "relation_oids", 1)),
        (pgc.Begin(final_lsn=1, commit_time=2, xid=True), ("Begin", "xid")),
    ]
    for msg, path in cases:
        with pytest.raises(pgc.EncodeError) as err:
            pgc.encode(msg, protocol_version=1)
        assert err.value.path == path, str(err.value)
    # bytes-likes and lists are accepted, and encode as bytes and tuples do
    good = pgc.Message(flags=0, lsn=1, prefix="p", content=b"abc")
    wire = pgc.encode(good, protocol_version=1)
    for content in (bytearray(b"abc"), memoryview(b"abc")):
        assert pgc.encode(dataclasses.replace(good, content=content), protocol_version=1) == wire


# -- decode: input that is not bytes-like ---------------------------------------------------
NOT_BYTES = [None, 2**40, 7, "B\x00", 1.5, [66, 0], (66,), object()]


def _entry_points(codec):
    args = [next(iter(a)) for a in _first_args(codec)]
    gates = codec.PARAMS.resolve(*args)
    names = [codec.PARAMS.version, *(m.name for m in codec.PARAMS.modes)]
    kw = dict(zip(names, args))
    dec = codec.StreamDecoder(**kw)
    return {
        "decode": lambda d: codec.decode(d, **kw),
        "decode_gates": lambda d: codec.decode_gates(d, *gates),
        "decode_tuple": lambda d: codec._decoder.decode_tuple(d, gates),
        "StreamDecoder.decode": dec.decode,
        "capture.loads": codec.capture.loads,
        "capture.iter_records": lambda d: list(codec.capture.iter_records(d)),
    }


@pytest.mark.parametrize("codec", [pgc, rc], ids=["pgoutput", "replication"])
def test_decode_rejects_what_is_not_bytes_like(codec_impl, codec):
    for name, fn in _entry_points(codec).items():
        for value in NOT_BYTES:
            with pytest.raises(TypeError) as err:
                fn(value)
            assert type(value).__name__ in str(err.value), (name, value, str(err.value))
            assert not isinstance(err.value, codec.CodecError)


def test_bytes_likes_decode_alike(codec_impl):
    wire = pgc.encode(BEGIN, protocol_version=1)
    for data in (bytearray(wire), memoryview(wire), memoryview(b"xx" + wire)[2:]):
        assert pgc.decode(data, protocol_version=1) == BEGIN
        assert pgc.StreamDecoder(protocol_version=1).decode(data) == BEGIN


# -- capture: the codec's own errors ----------------------------------------------------------
def test_capture_errors_are_the_codecs_own(codec_impl):
    cap = pgc.capture
    wire = pgc.encode(BEGIN, protocol_version=1)
    for items, path in [
        ([("0/16B3748", wire)], ("capture", "records", 0, "lsn")),
        ([(1, wire), (True, wire)], ("capture", "records", 1, "lsn")),
        ([(-1, wire)], ("capture", "records", 0, "lsn")),
        ([(2**64, wire)], ("capture", "records", 0, "lsn")),
        ([(1, 2**40)], ("capture", "records", 0, "message")),
        ([(1, "B")], ("capture", "records", 0, "message")),
        ([(1,)], ("capture", "records", 0)),
        ([None], ("capture", "records", 0)),
    ]:
        with pytest.raises(pgc.DecodeError) as err:
            list(cap.from_payloads(items, protocol_version=1))
        assert err.value.path == path, str(err.value)

    good = cap.Record(1, False, False, 5, wire)
    blob = cap.dumps([good])
    assert cap.loads(blob) == [good]
    for record, field in [
        (dataclasses.replace(good, lsn=-1), "lsn"),
        (dataclasses.replace(good, lsn=2**64), "lsn"),
        (dataclasses.replace(good, lsn="0/5"), "lsn"),
        (dataclasses.replace(good, protocol_version=9), "version"),
        (dataclasses.replace(good, protocol_version=True), "version"),
        (dataclasses.replace(good, in_stream=1), "in_stream"),
        (dataclasses.replace(good, data="B"), "data"),
        (dataclasses.replace(good, data=2**40), "data"),
        (dataclasses.replace(good, data=None), "data"),
    ]:
        with pytest.raises(pgc.EncodeError) as err:
            cap.dumps([good, record])
        assert err.value.path == ("capture", "records", 1, field), str(err.value)
        assert err.value.offset == len(blob)
    with pytest.raises(pgc.EncodeError) as err:
        cap.dumps([(1, False, False, 5, wire)])
    assert err.value.path == ("capture", "records", 0)

    header = len(cap.MAGIC) + 1
    for data, offset, path in [
        (b"NOTACAPT\x01", 0, ("capture", "magic")),
        (cap.MAGIC + b"\x07", len(cap.MAGIC), ("capture", "format_version")),
        (blob[:-1], header + 14, ("capture", "records", 0, "message")),
        (blob + b"\x01", header + 14 + len(wire), ("capture", "records", 1)),
        (
            blob[: header + 1] + b"\x80" + blob[header + 2 :],
            header + 1,
            ("capture", "records", 0, "flags"),
        ),  # fmt: skip
    ]:
        with pytest.raises(pgc.DecodeError) as err:
            cap.loads(data)
        assert (err.value.offset, err.value.path) == (offset, path), str(err.value)

    for record, path in [
        (dataclasses.replace(good, protocol_version=9), ("capture", "protocol_version")),
        (dataclasses.replace(good, protocol_version=None), ("capture", "protocol_version")),
        (dataclasses.replace(good, in_stream=None), ("capture", "in_stream")),
        (dataclasses.replace(good, data=None), ("capture", "data")),
        (dataclasses.replace(good, data=b""), ()),
    ]:
        with pytest.raises(pgc.DecodeError) as err:
            record.decode()
        assert err.value.path == path, str(err.value)


# -- StreamDecoder: sequences against a model of PostgreSQL's apply worker ------------------
class ApplyWorkerModel:
    """What PostgreSQL's logical replication apply worker (worker.c) accepts, by tag:
    STREAM START inside a block is a "duplicate STREAM START"; STREAM STOP outside one is
    "STREAM STOP message without STREAM START"; STREAM COMMIT, ABORT and PREPARE inside one
    are "... without STREAM STOP"; transaction boundaries (BEGIN, COMMIT, the two-phase
    messages) are never sent inside a block. Everything else may come anywhere. A Stream
    Abort outside a block is legal (PostgreSQL 18 sends one after a non-streamed commit).

    `step` returns (legal, the block state the message is decoded in, the state after it),
    following StreamDecoder's documented policy: strict rejects and keeps the state; lenient
    takes the message's own requirement as the truth and carries on."""

    def __init__(self, open_tag: str, close_tag: str, outside_only: str):
        self.open, self.close, self.outside_only = open_tag, close_tag, set(outside_only)

    def step(self, inside: bool, tag: str, strict: bool) -> tuple[bool, bool, bool]:
        if tag == self.open:
            return not inside, False, True if not strict or not inside else inside
        if tag == self.close:
            return inside, False, False if not strict or inside else inside
        if tag in self.outside_only:
            legal = not inside
            return legal, False, False if not strict or legal else inside
        return True, inside, inside


PG_MODEL = ApplyWorkerModel("S", "E", "BCcAbPKrp")
TOY_MODEL = ApplyWorkerModel("O", "C", "")


def _run_sequence(spec, codec, model, context, kw, strict, data) -> None:
    dec = codec.StreamDecoder(**kw, strict=strict)
    names = [c.name for c in codec.PARAMS.contexts]
    version = kw[codec.PARAMS.version]
    messages = {m.tag: m for m in spec.messages if not m.since or m.since <= version}
    tags = data.draw(st.lists(st.sampled_from(sorted(messages)), max_size=30), label="tags")
    inside = False
    violations = 0
    for index, tag in enumerate(tags):
        legal, decoded_inside, after = model.step(inside, tag, strict)
        gates = codec.PARAMS.resolve(*kw.values(), decoded_inside)
        msg = data.draw(S.message(spec, codec, messages[tag].name, gates))
        wire = codec.encode_gates(msg, *gates)
        assert getattr(dec, context) == inside
        if legal or not strict:
            assert dec.decode(wire) == msg
        else:
            with pytest.raises(codec.ProtocolViolation) as err:
                dec.decode(wire)
            v = err.value
            assert isinstance(v, codec.DecodeError)
            assert (v.index, v.tag, v.message) == (index, ord(tag), messages[tag].class_name)
            assert context in str(v) and f"message {index}" in str(v)
        if not legal and not strict:
            violations += 1
            assert dec.violations[-1].index == index
        inside = after
        assert getattr(dec, context) == inside, (tags[: index + 1], names)
    assert len(dec.violations) == violations
    assert dec.received == len(tags)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("pv, streaming", [(1, "off"), (2, "on"), (3, "on"), (4, "parallel")])
@FUZZ
@given(data=st.data())
def test_stream_decoder_against_the_apply_worker_model(codec_impl, pv, streaming, strict, data):
    spec = _specs()["pgoutput"][0]
    kw = {"protocol_version": pv, "streaming": streaming}
    _run_sequence(spec, pgc, PG_MODEL, "in_stream", kw, strict, data)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("revision, link", [(4, "plain"), (5, "signed")])
@FUZZ
@given(data=st.data())
def test_toy_stream_decoder_against_its_model(toy, revision, link, strict, data):
    spec, codec = toy
    kw = {"revision": revision, "link": link}
    _run_sequence(spec, codec, TOY_MODEL, "in_burst", kw, strict, data)


def test_named_violations_and_the_stray_abort(codec_impl):
    kw = {"protocol_version": 4, "streaming": "parallel"}

    def wire(msg, in_stream=False):
        return pgc.encode(msg, **kw, in_stream=in_stream)

    start, stop = wire(pgc.StreamStart(xid=7, first_segment=1)), wire(pgc.StreamStop())
    commit = wire(pgc.Commit(flags=0, commit_lsn=1, end_lsn=2, commit_time=3))
    abort = wire(pgc.StreamAbort(xid=7, subxid=7, abort_lsn=5, abort_time=6))
    # PostgreSQL 18: a Stream Abort after a transaction that was not streamed, outside a block
    dec = pgc.StreamDecoder(**kw)
    for payload in (wire(pgc.Begin(final_lsn=1, commit_time=2, xid=7)), commit, abort):
        dec.decode(payload)
    assert dec.received == 3 and not dec.violations

    for seq, index, rule in [
        ([stop], 0, "StreamStop may only arrive when in_stream=True"),
        ([start, start], 1, "StreamStart may only arrive when in_stream=False"),
        ([start, commit], 1, "Commit may only arrive when in_stream=False"),
        ([start, abort], 1, "StreamAbort may only arrive when in_stream=False"),
    ]:
        dec = pgc.StreamDecoder(**kw)
        *before, last = seq
        for payload in before:
            dec.decode(payload)
        state = dec.in_stream
        with pytest.raises(pgc.ProtocolViolation, match=rule) as err:
            dec.decode(last)
        assert err.value.index == index and dec.in_stream == state  # rejected, not applied
        lenient = pgc.StreamDecoder(**kw, strict=False)
        for payload in seq:
            lenient.decode(payload)
        assert [v.index for v in lenient.violations] == [index]
        assert rule in str(lenient.violations[0])
    # strict: the decoder stays usable after a violation
    dec = pgc.StreamDecoder(**kw)
    with pytest.raises(pgc.ProtocolViolation):
        dec.decode(stop)
    dec.decode(start)
    assert dec.in_stream and dec.received == 2
    with pytest.raises(TypeError, match="strict"):
        pgc.StreamDecoder(**kw, strict="no")
