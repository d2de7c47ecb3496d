"""The Kaitai Struct files of spec/pgoutput.yaml, compiled with the real kaitai-struct-compiler
0.11 (npm, pinned in package-lock.json) and run against the installed pgoutput_codec.

* both .ksy files compile with no error and no warning (Python and the other target languages);
* the .ksy follows the spec: params, ids, key order;
* hypothesis messages for every message x protocol version x context: the compiled parser
  consumes every byte and every field equals the codec's field of the same name; both reject
  the same damaged bytes;
* the capture container: multi-record files, the sample, and every real-server capture listed
  in tests/captures/manifest.json.

The .ksy pair and the sample are rendered from the spec in memory; test_committed_outputs_are_fresh
checks that generated/ holds the same.
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
from tests.support import kaitai as K
from tests.support import spec_strategies as S
from tests.support.kaitai_damage import DAMAGE, LANGUAGES, damage  # noqa: E402

SPEC_PATH = K.SPEC_DIR / "pgoutput.yaml"
CAPTURES = K.ROOT / "tests" / "captures"
MANIFEST = CAPTURES / "manifest.json"


def _rendered() -> K.Rendered:
    return K.rendered(SPEC_PATH)


SPEC = _rendered().spec
GATES = S.all_gates(SPEC, pgc)


@pytest.fixture(scope="session")
def ksy(tmp_path_factory):
    """The .ksy pair written to a temp dir: (capture, message) paths."""
    return _rendered().write_ksy(tmp_path_factory.mktemp("ksy"))


@pytest.fixture(scope="session")
def parsers(ksy, tmp_path_factory) -> K.Parsers:
    """The .ksy files compiled to Python once per session, in a temp dir."""
    return K.compile_parsers(SPEC, *ksy, tmp_path_factory.mktemp("ksc"))


# -- compilation ----------------------------------------------------------------------------
def test_compiler_is_the_pinned_0_11():
    lock = json.loads((K.ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/kaitai-struct-compiler"]["version"] == "0.11.0"
    installed = json.loads(
        (K.ROOT / "node_modules" / "kaitai-struct-compiler" / "package.json").read_text()
    )
    assert installed["version"] == "0.11.0", "run `npm ci`"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_ksy_compiles_without_errors_or_warnings(ksy, lang, tmp_path):
    K.ksc(ksy, tmp_path, langs=[lang])
    assert any((tmp_path / lang).rglob("*")), f"no {lang} output"


def test_ksc_reports_warnings(tmp_path):
    """The wrapper really surfaces the warnings the npm build swallows (so the test above can
    fail): a length not named len_<field> is a style warning."""
    bad = tmp_path / "bad.ksy"
    bad.write_text(
        "meta:\n  id: bad\nseq:\n  - id: size_body\n    type: u1\n"
        "  - id: body\n    size: size_body\n"
    )
    with pytest.raises(K.CompileError, match="len_body"):
        K.ksc([bad], tmp_path / "out")


def test_committed_outputs_are_fresh():
    """generated/ holds what the Kaitai target renders from the spec (else: make generate)."""
    r = _rendered()
    for rel in (r.message_ksy, r.capture_ksy, "samples/pgoutput_sample.pgcap"):
        committed = (K.GENERATED / rel).read_bytes()
        fresh = r.files[rel]
        assert committed == (fresh if isinstance(fresh, bytes) else fresh.encode()), rel


# -- the .ksy text --------------------------------------------------------------------------
def _ksy(rel):
    return yaml.safe_load(_rendered().files[rel])


def _attrs(doc):
    for t in [doc, *doc.get("types", {}).values()]:
        yield from t.get("seq", [])
        yield from ({"id": k, **v} for k, v in t.get("instances", {}).items())
    yield from doc.get("params", [])


def test_message_ksy_shape():
    doc = _ksy(_rendered().message_ksy)
    assert list(doc) == ["meta", "doc", "doc-ref", "params", "seq", "types", "enums"]
    assert list(doc["meta"]) == ["id", "title", "application", "license", "ks-version", "endian"]
    assert doc["meta"]["id"] == "pgoutput_message"
    assert doc["meta"]["ks-version"] == "0.11"
    assert [(p["id"], p["type"]) for p in doc["params"]] == [
        ("protocol_version", "u1"),
        ("in_stream", "bool"),
        ("parallel_streaming", "bool"),
    ]
    assert doc["seq"][0]["id"] == "tag" and doc["seq"][0]["type"] == "u1"
    cases = doc["seq"][1]["type"]["cases"]
    assert len(cases) == len(SPEC.messages) == 19
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
    import dataclasses

    doc = _ksy(_rendered().message_ksy)
    for m in SPEC.messages:
        seq_ids = [a["id"] for a in doc["types"][m.snake_name].get("seq", [])]
        for f in dataclasses.fields(getattr(pgc, m.class_name)):
            assert f.name in seq_ids, (m.name, f.name)
        assert doc["seq"][1]["type"]["cases"][f"message_type::{m.snake_name}"] == m.snake_name
        assert doc["enums"]["message_type"][ord(m.tag)]["id"] == m.snake_name


def test_capture_ksy_shape():
    doc = _ksy(_rendered().capture_ksy)
    assert list(doc) == ["meta", "doc", "seq", "types"]
    assert doc["meta"]["imports"] == ["pgoutput_message"]
    assert doc["seq"][0]["contents"] == "PGOUTCAP"
    assert [a["id"] for a in doc["types"]["record"]["seq"]] == [
        "protocol_version",
        "flags",
        "lsn",
        "len_message",
        "message",
    ]
    message = doc["types"]["record"]["seq"][-1]
    assert message["type"] == (
        "pgoutput_message(protocol_version, flags.in_stream, flags.parallel_streaming)"
    )
    # bit i is the spec's i-th context, most significant bit first in the .ksy
    assert [(a["id"], a["type"]) for a in doc["types"]["flags"]["seq"]] == [
        ("reserved", "b6"),
        ("parallel_streaming", "b1"),
        ("in_stream", "b1"),
    ]
    assert "params" not in doc  # opens in the Web IDE with nothing to set


# -- messages -------------------------------------------------------------------------------
def _check(parsers, gates, msg):
    wire = bytes(pgc.encode_gates(msg, *gates))
    expected = pgc.decode_gates(wire, *gates)
    assert expected == msg
    K.check_message(parsers, pgc, wire, gates, expected)


def _gates_id(gates):
    return "v{}".format(gates[0]) + "".join(
        f"-{c.name}" for c, on in zip(SPEC.contexts, gates[1:]) if on
    )


@pytest.mark.parametrize("gates", GATES, ids=_gates_id)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_in_every_context(parsers, gates, data):
    """Each example draws one of every message the context allows (all 19 from protocol 2)."""
    names = [m.name for m in S.messages_allowed(SPEC, gates)]
    assert names
    for name in names:
        _check(parsers, gates, data.draw(S.message(SPEC, pgc, name, gates), label=name))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.cases(SPEC, pgc))
def test_message_cases(parsers, case):
    _check(parsers, *case)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.cases(SPEC, pgc), DAMAGE)
def test_accepts_and_rejects_what_the_codec_does(parsers, case, how):
    gates, msg = case
    data = damage(bytes(pgc.encode_gates(msg, *gates)), *how)
    try:
        expected = pgc.decode_gates(data, *gates)
    except pgc.DecodeError:
        expected = None
    ks = K.ksy_accepts(parsers, data, gates)
    if expected is None:
        assert ks is None, f"the .ksy accepts what the codec rejects: {data.hex()}"
    else:
        assert ks is not None, f"the .ksy rejects what the codec accepts: {data.hex()}"
        K.check_parsed(ks, expected, data)


def test_message_newer_than_the_protocol_is_rejected(parsers):
    start = bytes(
        pgc.encode(pgc.StreamStart(xid=1, first_segment=1), protocol_version=2, streaming="on")
    )
    assert K.ksy_accepts(parsers, start, (2, False, False)) is not None
    assert K.ksy_accepts(parsers, start, (1, False, False)) is None
    assert K.ksy_accepts(parsers, b"Z", (4, False, False)) is None


# -- capture container ----------------------------------------------------------------------
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(S.cases(SPEC, pgc), st.integers(0, (1 << 64) - 1)), max_size=8))
def test_capture_container(parsers, items):
    records = []
    for (gates, msg), lsn in items:
        data = bytes(pgc.encode_gates(msg, *gates))
        records.append(pgc_capture.Record(*gates, lsn, data))
    blob = pgc_capture.dumps(records)
    assert pgc_capture.loads(blob) == records
    K.check_capture(parsers, SPEC, blob, records)


def test_sample_capture_covers_every_message(parsers):
    data = _rendered().sample
    records = pgc_capture.loads(data)
    assert pgc_capture.dumps(records) == data
    seen = K.check_capture(parsers, SPEC, data, records)
    assert set(seen) == {m.class_name for m in SPEC.messages}
    assert any(r.in_stream for r in records)
    assert all(r.parallel_streaming for r in records)
    # the optional Update part both absent and present, every TupleData kind
    updates = [r.decode() for r in records if r.data[:1] == b"U"]
    assert {u.old_kind for u in updates} >= {None, "K"}
    kinds = {
        c.kind
        for r in records
        for msg in [r.decode()]
        for t in (getattr(msg, "new_tuple", None), getattr(msg, "old_tuple", None))
        if t
        for c in t.columns
    }
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
            total.update(K.check_capture(parsers, SPEC, data, records))
        except AssertionError as exc:
            raise AssertionError(f"{entry['path']}: {exc}") from None
    assert sum(total.values()) > 0, f"{MANIFEST} lists {len(files)} files but no records"
