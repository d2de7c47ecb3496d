"""A spec that is not PostgreSQL's (tests/specs/toy.yaml) renders and works in every target:
the generator knows no protocol. Other parameter names (revision, link), a version range that
starts at 3, a per-message context opened and closed by messages, a mode-derived context, a
repeat, an optional tagged part and a rest-of-message field.

The Kaitai target is checked by tests/kaitai/test_kaitai_specs.py (every spec under tests/specs/).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from codegen.render import render_all
from tests.support import kaitai as K
from tests.support import spec_strategies as S

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "specs" / "toy.yaml"


@pytest.fixture(scope="module")
def toy():
    r = K.rendered(TOY)
    return r.spec, K.fresh_codec(r)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=S.cases(K.load_spec(TOY), K.fresh_codec(K.rendered(TOY))))
def test_round_trip_both_ways(data):
    codec = K.fresh_codec(K.rendered(TOY))
    gates, msg = data
    wire = codec.encode_gates(msg, *gates)
    assert codec.decode_gates(wire, *gates) == msg
    assert codec.encode_gates(codec.decode_gates(wire, *gates), *gates) == wire


def test_public_api_uses_the_specs_names(toy):
    spec, codec = toy
    reading = codec.Reading(sensor="t1", celsius=-2500, samples=(1, -2, 3))
    wire = codec.encode(reading, revision=3)
    # independent of the codec: the layout read off the spec by hand
    assert wire == b"R" + b"t1\x00" + (-2500).to_bytes(4, "big", signed=True) + b"\x03" + (
        b"\x00\x01\xff\xfe\x00\x03"
    )
    assert codec.decode(wire, revision=3) == reading
    with pytest.raises(ValueError, match="revision"):
        codec.decode(wire, revision=2)
    with pytest.raises(ValueError, match="link='signed' needs revision >= 5"):
        codec.decode(wire, revision=4, link="signed")
    with pytest.raises(codec.DecodeError) as err:
        codec.decode(b"O\x00\x07", revision=3)  # Burst Open is revision 4+
    assert "BurstOpen needs revision 4" in str(err.value)


def test_stream_decoder_tracks_the_per_message_context(toy):
    spec, codec = toy
    frames = [
        codec.encode(codec.BurstOpen(burst_id=7), revision=4),
        codec.encode(
            codec.Reading(burst_id=7, sensor="a", celsius=1, samples=()), revision=4, in_burst=True
        ),
        codec.encode(codec.BurstClose(), revision=4),
        codec.encode(codec.Reading(sensor="a", celsius=1, samples=()), revision=4),
    ]
    dec = codec.StreamDecoder(revision=4)
    got = [dec.decode(f) for f in frames]
    assert got[1].burst_id == 7 and got[3].burst_id is None
    assert not dec.in_burst


def test_rest_field_and_mode_context(toy):
    spec, codec = toy
    blob = codec.Blob(check=9, body=b"\x00\x01anything")
    wire = codec.encode(blob, revision=5, link="signed")
    assert wire == b"X" + (9).to_bytes(8, "big") + b"\x00\x01anything"
    assert codec.decode(wire, revision=5, link="signed") == blob
    # on a plain link there is no check: the same bytes are all body
    assert codec.decode(wire, revision=5).body == wire[1:]
    with pytest.raises(codec.EncodeError, match="must be None"):
        codec.encode(blob, revision=5)


def test_capture_records_carry_the_specs_parameters(toy, tmp_path):
    spec, codec = toy
    frames = [
        (1, codec.encode(codec.BurstOpen(burst_id=1), revision=4)),
        (2, codec.encode(codec.BurstClose(), revision=4)),
    ]
    records = list(codec.capture.from_payloads(frames, revision=4))
    assert [r.in_burst for r in records] == [False, False]
    path = tmp_path / "x.toycap.gz"
    codec.capture.write(path, records)
    assert codec.capture.read(path) == records
    assert codec.capture.dumps(records).startswith(b"TOYCAP\x01\x04")


def test_docs_render_with_mermaid():
    files = render_all(K.load_spec(TOY), ("docs",))
    page = files["docs/toy_codec/reading.md"]
    assert "```mermaid" in page and "revision ≥ 4" in page and "`in_burst`" in page


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_accelerator_builds_and_agrees(tmp_path):
    """The toy codec on disk with its compiled accelerator: the C and Python paths agree."""
    K.build_codec(TOY, tmp_path, ("python",))
    script = textwrap.dedent("""
        import toy_codec as t
        assert t.speedups_enabled()
        msgs = [(t.Reading(sensor="s", celsius=5, samples=(1, 2), sig_kind="H",
                           signature=b"ab"), dict(revision=3)),
                (t.Blob(check=1, body=b"xyz"), dict(revision=5, link="signed")),
                (t.BurstOpen(burst_id=65535), dict(revision=4))]
        for msg, kw in msgs:
            wire = t.encode(msg, **kw)
            fast = t.decode(wire, **kw)
            t.use_speedups(False)
            assert t.encode(msg, **kw) == wire and t.decode(wire, **kw) == fast == msg
            t.use_speedups(True)
        print("ok")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
