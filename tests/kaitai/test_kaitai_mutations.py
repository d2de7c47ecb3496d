"""The Kaitai comparisons cannot pass vacuously: a .ksy generated from a spec with one gate or
one field width changed must disagree with the (unchanged) Python codec.

Each case writes a mutated copy of spec/pgoutput.yaml, renders its .ksy pair with the Kaitai
target, compiles it and runs the same comparison as test_kaitai (kaitai_support.check_message)
over a fixed corpus: the messages of the sample session (spec/pgoutput.sample.yaml) built for
every protocol version x context, plus the sample capture itself. The unmutated spec goes
through the very same steps and must agree everywhere (the control).
"""

from __future__ import annotations

import pytest
import yaml

import pgoutput_codec as pgc
from codegen.loader import load_spec
from codegen.sample import load_sample, messages_for_gates
from codegen.targets import kaitai as kaitai_target
from pgoutput_codec import capture as pgc_capture
from tests.support import kaitai as K
from tests.support import spec_strategies as S

SPEC_PATH = K.SPEC_DIR / "pgoutput.yaml"


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
    "Stream Abort.abort_lsn gated on in_stream": _set(
        "Stream Abort", "abort_lsn", when="in_stream"
    ),
    "Message.xid since protocol 3": _set("Message", "xid", since=3),
    "TupleData.len_value and value only for text": _both(
        _set("TupleData", "len_value", only_if={"field": "kind", "in": ["t"]}),
        _set("TupleData", "value", only_if={"field": "kind", "in": ["t"]}),
    ),
    # widths
    "Begin.xid as Int16": _set("Begin", "xid", type="Int16"),
    "TupleData.len_value as Int16": _set("TupleData", "len_value", type="Int16"),
    "Relation.type_modifier unsigned": _set("Relation", "type_modifier", signed=False),
}


def _corpus():
    """(gates, bytes, codec value): the sample's messages in every context + the sample."""
    spec = load_spec(SPEC_PATH)
    sample = load_sample(spec, SPEC_PATH)
    out = []
    for gates in S.all_gates(spec, pgc):
        for msg in messages_for_gates(spec, sample, pgc, gates):
            out.append((gates, bytes(pgc.encode_gates(msg, *gates)), msg))
    for r in pgc_capture.loads(K.rendered(SPEC_PATH).sample):
        out.append((K.record_gates(spec, r), bytes(r.data), r.decode()))
    return out


CORPUS = _corpus()


def _mismatches(tmp_path, mutate) -> list[str]:
    raw = yaml.safe_load(SPEC_PATH.read_text())
    if mutate is not None:
        mutate(raw)
    spec_path = tmp_path / "pgoutput.yaml"
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    sample = SPEC_PATH.with_name("pgoutput.sample.yaml")  # the spec names its sample session
    (tmp_path / sample.name).write_text(sample.read_text())
    spec = load_spec(spec_path)
    rendered = K.Rendered(spec, K.render_targets(spec, (kaitai_target,), binaries=False))
    parsers = K.compile_parsers(spec, *rendered.write_ksy(tmp_path / "ksy"), tmp_path / "ksc")
    found = []
    for gates, data, msg in CORPUS:
        try:
            K.check_message(parsers, pgc, data, gates, msg)
        except K.Mismatch as exc:
            found.append(str(exc))
    return found


def test_corpus_is_broad():
    spec = load_spec(SPEC_PATH)
    kinds = {type(m).__name__ for *_, m in CORPUS}
    assert len(kinds) == len(spec.messages)
    assert {gates[0] for gates, *_ in CORPUS} == set(spec.protocol_versions)


def test_unmutated_spec_agrees(tmp_path):
    assert _mismatches(tmp_path, None) == []


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_spec_disagrees(tmp_path, name):
    found = _mismatches(tmp_path, MUTATIONS[name])
    assert found, f"a .ksy from the spec with {name} still matches the codec on every message"
