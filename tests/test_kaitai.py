"""The generated Kaitai Struct files, compiled with the real kaitai-struct-compiler 0.11 (npm,
pinned in package-lock.json) and run against the Python codec.

* both .ksy files compile with no error and no warning (Python and the other target languages);
* the .ksy follows the spec: params, ids, key order;
* hypothesis messages for every message x protocol version x context: the compiled parser
  consumes every byte and every field equals the codec's field of the same name; both reject
  the same damaged bytes;
* the capture container: multi-record files, the committed sample, and every real-server
  capture listed in tests/captures/manifest.json.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from pgoutput_codec import capture as pgc_capture
from tests import kaitai_support as K
from tests import strategies as S

CASES = S.every_message_in_every_context()
CAPTURES = K.ROOT / "tests" / "captures"
MANIFEST = CAPTURES / "manifest.json"


@pytest.fixture(scope="session")
def parsers(tmp_path_factory) -> K.Parsers:
    """The committed .ksy files compiled to Python once per session, in a temp dir."""
    out = tmp_path_factory.mktemp("ksc")
    return K.load_parsers(K.compile_python(K.KAITAI_DIR, out))


# -- compilation ----------------------------------------------------------------------------
def test_compiler_is_the_pinned_0_11():
    lock = json.loads((K.ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/kaitai-struct-compiler"]["version"] == "0.11.0"
    installed = json.loads(
        (K.ROOT / "node_modules" / "kaitai-struct-compiler" / "package.json").read_text())
    assert installed["version"] == "0.11.0", "run `npm ci`"


# Every language of ksc 0.11 but nim, whose translator has no `_io` expressions yet
# (NotImplementedError in NimTranslator.doInternalName; needed for the read-ahead of Update).
LANGUAGES = ["python", "javascript", "java", "cpp_stl", "csharp", "go", "rust", "ruby", "php",
             "perl", "lua"]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_ksy_compiles_without_errors_or_warnings(lang, tmp_path):
    K.ksc([K.KAITAI_DIR / K.CAPTURE_KSY, K.KAITAI_DIR / K.MESSAGE_KSY], tmp_path, langs=[lang])
    assert any((tmp_path / lang).rglob("*")), f"no {lang} output"


def test_ksc_reports_warnings(tmp_path):
    """The wrapper really surfaces the warnings the npm build swallows (so the test above can
    fail): a length not named len_<field> is a style warning."""
    bad = tmp_path / "bad.ksy"
    bad.write_text("meta:\n  id: bad\nseq:\n  - id: size_body\n    type: u1\n"
                   "  - id: body\n    size: size_body\n")
    with pytest.raises(K.CompileError, match="len_body"):
        K.ksc([bad], tmp_path / "out")


# -- the .ksy text --------------------------------------------------------------------------
def _ksy(name):
    return yaml.safe_load((K.KAITAI_DIR / name).read_text())


def _attrs(doc):
    for t in [doc, *doc.get("types", {}).values()]:
        yield from t.get("seq", [])
        yield from ({"id": k, **v} for k, v in t.get("instances", {}).items())
    yield from doc.get("params", [])


def test_message_ksy_shape():
    doc = _ksy(K.MESSAGE_KSY)
    assert list(doc) == ["meta", "doc", "doc-ref", "params", "seq", "types", "enums"]
    assert list(doc["meta"]) == ["id", "title", "application", "license", "ks-version", "endian"]
    assert doc["meta"]["ks-version"] == "0.11"
    assert [(p["id"], p["type"]) for p in doc["params"]] == [
        ("protocol_version", "u1"), ("in_stream", "bool"), ("parallel_streaming", "bool")]
    assert doc["seq"][0]["id"] == "tag" and doc["seq"][0]["type"] == "u1"
    cases = doc["seq"][1]["type"]["cases"]
    assert len(cases) == len(S.spec().messages) == 19
    assert doc["enums"]["kind"][0x6E]["id"] == "null"  # quoted in the YAML, a string here
    for a in _attrs(doc):
        keys = list(a)
        assert keys[0] == "id" and keys[-1] in ("doc", "doc-ref"), a
        if "doc-ref" in keys:
            assert keys[-2:] == ["doc", "doc-ref"], a
    for name, t in doc["types"].items():
        assert list(t)[0] == "doc", name
        assert list(t) == [k for k in ("doc", "doc-ref", "seq", "instances") if k in t], name


def test_message_ksy_ids_are_the_spec_field_names():
    doc = _ksy(K.MESSAGE_KSY)
    for m in S.spec().messages:
        seq_ids = [a["id"] for a in doc["types"][m.snake_name].get("seq", [])]
        for f in __import__("dataclasses").fields(getattr(pgc, m.class_name)):
            assert f.name in seq_ids, (m.name, f.name)
        assert doc["seq"][1]["type"]["cases"][f"message_type::{m.snake_name}"] == m.snake_name
        assert doc["enums"]["message_type"][ord(m.tag)]["id"] == m.snake_name


def test_capture_ksy_shape():
    doc = _ksy(K.CAPTURE_KSY)
    assert list(doc) == ["meta", "doc", "seq", "types"]
    assert doc["meta"]["imports"] == ["pgoutput_message"]
    assert [a["id"] for a in doc["types"]["record"]["seq"]] == [
        "protocol_version", "flags", "lsn", "len_message", "message"]
    assert "params" not in doc  # opens in the Web IDE with nothing to set


# -- messages -------------------------------------------------------------------------------
def _check(parsers, pv, streaming, in_stream, msg):
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    wire = bytes(pgc.encode(msg, **kw))
    expected = pgc.decode(wire, **kw)
    assert expected == msg
    K.check_message(parsers, wire, pv, in_stream, streaming == "parallel", expected)


CONTEXTS = S.contexts()


@pytest.mark.parametrize("ctx", CONTEXTS, ids=[f"v{pv}-{mode}{'-in_stream' if ins else ''}"
                                               for pv, mode, ins in CONTEXTS])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_in_every_context(parsers, ctx, data):
    """Each example draws one of every message the context allows (all 19 from protocol 2)."""
    names = [m.name for c, m in CASES if c == ctx]
    assert names
    for name in names:
        _check(parsers, *ctx, data.draw(S.message_in_context(ctx, name), label=name))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.message_cases())
def test_message_cases(parsers, case):
    _check(parsers, *case)


def _damage(wire: bytes, op: str, pos: int, byte: int) -> bytes:
    pos %= len(wire) + 1
    if op == "cut":
        return wire[:pos]
    if op == "append":
        return wire + bytes([byte])
    if op == "insert":
        return wire[:pos] + bytes([byte]) + wire[pos:]
    if pos == len(wire):
        pos -= 1
    return wire[:pos] + bytes([byte]) + wire[pos + 1:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.message_cases(), st.sampled_from(["cut", "append", "insert", "replace"]),
       st.integers(0, 1 << 16), st.integers(0, 255))
def test_accepts_and_rejects_what_the_codec_does(parsers, case, op, pos, byte):
    pv, streaming, in_stream, msg = case
    kw = dict(protocol_version=pv, streaming=streaming, in_stream=in_stream)
    data = _damage(bytes(pgc.encode(msg, **kw)), op, pos, byte)
    try:
        expected = pgc.decode(data, **kw)
    except pgc.DecodeError:
        expected = None
    ks = K.ksy_accepts(parsers, data, pv, in_stream, streaming == "parallel")
    if expected is None:
        assert ks is None, f"the .ksy accepts what the codec rejects: {data.hex()}"
    else:
        assert ks is not None, f"the .ksy rejects what the codec accepts: {data.hex()}"
        K.check_parsed(ks, expected, data)


def test_message_newer_than_the_protocol_is_rejected(parsers):
    start = bytes(pgc.encode(pgc.StreamStart(xid=1, first_segment=1), protocol_version=2,
                             streaming="on"))
    assert K.ksy_accepts(parsers, start, 2, False, False) is not None
    assert K.ksy_accepts(parsers, start, 1, False, False) is None
    assert K.ksy_accepts(parsers, b"Z", 4, False, False) is None


# -- capture container ----------------------------------------------------------------------
def _check_capture(parsers, data: bytes, records) -> Counter:
    ks = parsers.parse_capture(data)
    assert ks._io.is_eof()
    assert ks.format_version == 1
    assert len(ks.records) == len(records)
    seen = Counter()
    for i, (rec, kr) in enumerate(zip(records, ks.records)):
        where = f"record {i} (lsn {rec.lsn:X})"
        assert kr.protocol_version == rec.protocol_version, where
        assert kr.flags.in_stream is rec.in_stream, where
        assert kr.flags.parallel_streaming is rec.parallel_streaming, where
        assert kr.lsn == rec.lsn, where
        assert kr.len_message == len(rec.data), where
        try:
            K.check_parsed(kr.message, rec.decode(), bytes(rec.data))
        except K.Mismatch as exc:
            raise K.Mismatch(f"{where}: {exc}") from None
        seen[type(kr.message.body).__name__] += 1
    return seen


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(S.message_cases(), st.integers(0, (1 << 64) - 1)), max_size=8))
def test_capture_container(parsers, items):
    records = []
    for (pv, streaming, in_stream, msg), lsn in items:
        data = bytes(pgc.encode(msg, protocol_version=pv, streaming=streaming,
                                in_stream=in_stream))
        records.append(pgc_capture.Record(pv, in_stream, streaming == "parallel", lsn, data))
    blob = pgc_capture.dumps(records)
    assert pgc_capture.loads(blob) == records
    _check_capture(parsers, blob, records)


def test_sample_capture_covers_every_message(parsers):
    data = K.SAMPLE.read_bytes()
    records = pgc_capture.read(K.SAMPLE)
    assert pgc_capture.dumps(records) == data
    seen = _check_capture(parsers, data, records)
    assert set(seen) == {m.class_name for m in S.spec().messages}
    assert any(r.in_stream for r in records)
    assert all(r.parallel_streaming for r in records)
    # the optional Update part both absent and present, every TupleData kind
    updates = [r.decode() for r in records if r.data[:1] == b"U"]
    assert {u.old_kind for u in updates} >= {None, "K"}
    kinds = {c.kind for r in records for msg in [r.decode()]
             for t in (getattr(msg, "new_tuple", None), getattr(msg, "old_tuple", None)) if t
             for c in t.columns}
    assert kinds == {"n", "u", "t", "b"}


# -- real-server captures -------------------------------------------------------------------
def _manifest_files():
    if not MANIFEST.exists():
        return []
    return json.loads(MANIFEST.read_text()).get("files", [])


def test_real_captures(parsers):
    """Every record of every capture the manifest lists parses to the codec's values."""
    if not MANIFEST.exists():
        pytest.skip("no tests/captures/manifest.json")
    total = Counter()
    files = _manifest_files()
    for entry in files:
        path = CAPTURES / entry["path"]
        raw = path.read_bytes()
        data = gzip.decompress(raw) if path.name.endswith(".gz") else raw
        records = pgc_capture.read(path)
        try:
            total.update(_check_capture(parsers, data, records))
        except AssertionError as exc:
            raise AssertionError(f"{entry['path']}: {exc}") from None
    assert sum(total.values()) > 0, f"{MANIFEST} lists {len(files)} files but no records"
