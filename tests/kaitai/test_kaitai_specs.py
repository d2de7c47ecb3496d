"""Any spec renders a .ksy pair that ksc 0.11 compiles without warnings and that parses what
the spec's own codec encodes: every spec under spec/ and tests/specs/ (the toy spec), plus any
listed in the KAITAI_SPECS environment variable (paths separated by os.pathsep).

The codec is the one rendered from the same spec in memory (kaitai.load_fresh_codec), so a
spec needs no installed package; its sample session, when it names one, must parse too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import kaitai as K
from tests.support import spec_strategies as S


def _spec_paths() -> list[Path]:
    paths = sorted(K.SPEC_DIR.glob("*.yaml")) + sorted((K.ROOT / "tests" / "specs").glob("*.yaml"))
    paths = [p for p in paths if not p.name.endswith(".sample.yaml")]
    extra = os.environ.get("KAITAI_SPECS", "")
    paths += [Path(p).resolve() for p in extra.split(os.pathsep) if p]
    return paths


SPEC_PATHS = _spec_paths()


@pytest.fixture(scope="module", params=SPEC_PATHS, ids=lambda p: p.stem)
def compiled(request, tmp_path_factory):
    """(rendered outputs, fresh codec, compiled parsers) of one spec."""
    r = K.rendered(request.param)
    codec = K.fresh_codec(r)
    ksy = r.write_ksy(tmp_path_factory.mktemp("ksy"))
    return r, codec, K.compile_parsers(r.spec, *ksy, tmp_path_factory.mktemp("ksc"))


def test_every_spec_is_covered():
    names = {p.name for p in SPEC_PATHS}
    assert {"pgoutput.yaml", "replication.yaml"} <= names


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hypothesis_messages_parse_as_the_codec_decodes(compiled, data):
    r, codec, parsers = compiled
    gates, msg = data.draw(S.cases(r.spec, codec))
    wire = bytes(codec.encode_gates(msg, *gates))
    expected = codec.decode_gates(wire, *gates)
    assert expected == msg
    K.check_message(parsers, codec, wire, gates, expected)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_in_every_gate_combination(compiled, data):
    """Each example draws one of each message each gate combination allows."""
    r, codec, parsers = compiled
    for gates in S.all_gates(r.spec, codec):
        for m in S.messages_allowed(r.spec, gates):
            msg = data.draw(S.message(r.spec, codec, m.name, gates), label=m.name)
            wire = bytes(codec.encode_gates(msg, *gates))
            K.check_message(parsers, codec, wire, gates)


def test_sample_parses(compiled):
    r, codec, parsers = compiled
    if r.sample is None:
        pytest.skip(f"{r.spec.source_name} names no sample session")
    records = codec.capture.loads(r.sample)
    seen = K.check_capture(parsers, r.spec, r.sample, records)
    assert seen
