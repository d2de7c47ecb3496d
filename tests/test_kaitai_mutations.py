"""The Kaitai comparisons cannot pass vacuously: a .ksy generated from a spec with one gate or
one field width changed must disagree with the (unchanged) Python codec.

Each case writes a mutated copy of the spec, runs `python -m codegen generate --spec <copy>
--out <tmp>`, compiles the resulting .ksy files and runs the same comparison as test_kaitai
(kaitai_support.check_message / check_parsed) over a fixed corpus: the example messages of the
Kaitai target in every protocol version x context, plus the committed sample capture. The
unmutated spec goes through the very same steps and must agree everywhere (the control).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

import pgoutput_codec as pgc
from codegen.targets import kaitai as kaitai_target
from pgoutput_codec import capture as pgc_capture
from tests import kaitai_support as K
from tests import strategies as S


def _field(raw, owner: str, name: str) -> dict:
    for group in ("messages", "parts"):
        for m in raw.get(group, []):
            if m["name"] != owner:
                continue
            for b in m["blocks"]:
                for f in b["fields"]:
                    if f["field"] == name:
                        return f
    raise KeyError(f"{owner}.{name} is not in the spec")


def _set(owner, name, **changes):
    def mutate(raw):
        f = _field(raw, owner, name)
        for k, v in changes.items():
            if v is None:
                f.pop(k, None)
            else:
                f[k] = v
    return mutate


def _both(*mutations):
    def mutate(raw):
        for m in mutations:
            m(raw)
    return mutate


MUTATIONS = {
    # gates
    "Relation.xid without its in_stream gate": _set("Relation", "xid", when=None),
    "Stream Abort.abort_lsn gated on in_stream": _set("Stream Abort", "abort_lsn",
                                                      when="in_stream"),
    "Message.xid since protocol 3": _set("Message", "xid", since=3),
    "TupleData.len_value and value only for text": _both(
        _set("TupleData", "len_value", only_if={"field": "kind", "in": ["t"]}),
        _set("TupleData", "value", only_if={"field": "kind", "in": ["t"]})),
    # widths
    "Begin.xid as Int16": _set("Begin", "xid", type="Int16"),
    "TupleData.len_value as Int16": _set("TupleData", "len_value", type="Int16"),
    "Relation.type_modifier unsigned": _set("Relation", "type_modifier", signed=False),
}


def _corpus():
    """(pv, in_stream, parallel, bytes, codec value): examples in every context + the sample."""
    out = []
    spec = S.spec()
    for pv, streaming, in_stream in S.contexts():
        parallel = streaming == "parallel"
        for msg in kaitai_target.example_messages(spec, pgc, pv, parallel, in_stream):
            data = bytes(pgc.encode(msg, protocol_version=pv, streaming=streaming,
                                    in_stream=in_stream))
            out.append((pv, in_stream, parallel, data, msg))
    for r in pgc_capture.read(K.SAMPLE):
        out.append((r.protocol_version, r.in_stream, r.parallel_streaming, bytes(r.data),
                    r.decode()))
    return out


CORPUS = _corpus()


def _generate(spec_path, out_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "codegen", "generate", "--spec", str(spec_path), "--out",
         str(out_dir)], cwd=K.ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"generate failed:\n{proc.stdout}\n{proc.stderr}"


def _mismatches(tmp_path, mutate) -> list[str]:
    raw = yaml.safe_load(S.SPEC_PATH.read_text())
    if mutate is not None:
        mutate(raw)
    spec_path = tmp_path / "pgoutput.yaml"
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "generated"
    _generate(spec_path, out)
    parsers = K.load_parsers(K.compile_python(out / "kaitai", tmp_path / "ksc"))
    found = []
    for pv, in_stream, parallel, data, msg in CORPUS:
        try:
            K.check_message(parsers, data, pv, in_stream, parallel, msg)
        except K.Mismatch as exc:
            found.append(str(exc))
    return found


def test_corpus_is_broad():
    kinds = {type(m).__name__ for *_, m in CORPUS}
    assert len(kinds) == len(S.spec().messages)
    assert {pv for pv, *_ in CORPUS} == set(S.spec().protocol_versions)


def test_unmutated_spec_agrees(tmp_path):
    assert _mismatches(tmp_path, None) == []


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_spec_disagrees(tmp_path, name):
    found = _mismatches(tmp_path, MUTATIONS[name])
    assert found, f"a .ksy from the spec with {name} still matches the codec on every message"
