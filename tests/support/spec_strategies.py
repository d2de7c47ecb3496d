"""Hypothesis strategies derived from any spec model and its codec (installed or freshly
rendered), for the Kaitai tests of every spec.

Gate values are the codec's (version, context, ...). Every wire type maps to a value strategy;
`_field` asserts the map is exhaustive, so a new wire type stops the tests instead of being
skipped. Values span each field's whole range (both ends of every integer, non-UTF-8 strings).
"""

from __future__ import annotations

import itertools
from hypothesis import strategies as st
from codegen.model import BYTE1, BYTEN, REST, SCALAR_TYPES, STRING, Block, Field, Spec
from codegen.model import implicit_fields
from codegen.sample import gate_holds, int_bounds


def all_gates(spec: Spec, codec) -> list[tuple]:
    """Every gate tuple the codec accepts: each version x mode value x per-message flag."""
    choices = [spec.version.values, *([v for v, _ in m.enables] for m in spec.modes)]
    choices += [(False, True)] * len(spec.per_message_contexts)
    out = []
    for args in itertools.product(*choices):
        try:
            gates = codec.PARAMS.resolve(*args)
        except ValueError:
            continue
        if gates not in out:
            out.append(gates)
    return out


def messages_allowed(spec: Spec, gates: tuple):
    """The spec's messages that the version in `gates` knows."""
    return [m for m in spec.messages if not m.since or m.since <= gates[0]]


def _int(f: Field):
    lo, hi = int_bounds(f)
    return st.one_of(st.sampled_from([lo, hi, 0, min(hi, 127), min(hi, 128)]), st.integers(lo, hi))


def _string():
    text = st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12
    )
    raw = st.binary(max_size=12).map(
        lambda b: b.replace(b"\x00", b"").decode("utf-8", "surrogateescape")
    )
    return st.one_of(text, raw)


def _field(spec: Spec, codec, f: Field, gates: tuple):
    assert f.type in SCALAR_TYPES or f.type in spec.parts_by_name, f"no strategy for {f.type}"
    if f.is_int:
        return _int(f)
    if f.type == BYTE1:
        return st.sampled_from([c for c, _ in f.choices])
    if f.type == STRING:
        return _string()
    if f.type in (BYTEN, REST):
        return st.binary(max_size=24)
    part = spec.part(f.type)
    return blocks(spec, codec, part.blocks, part.class_name, gates)


def blocks(spec: Spec, codec, blocks_: tuple[Block, ...], class_name: str, gates: tuple):
    """A strategy for the dataclass of a message, part or repeat element under `gates`."""
    implicit = implicit_fields(blocks_)
    cls = getattr(codec, class_name)

    @st.composite
    def build(draw):
        values: dict = {}
        for b in blocks_:
            if b.kind == "repeat":
                if len(b.fields) == 1:
                    elem = _field(spec, codec, b.fields[0], gates)
                else:
                    elem = blocks(spec, codec, (Block("header", b.fields),), b.struct, gates)
                values[b.name] = tuple(draw(st.lists(elem, max_size=6)))
                continue
            present = not (b.kind == "tagged" and b.optional) or draw(st.booleans())
            for f in b.fields:
                if f.is_literal or f.name in implicit:
                    continue
                holds = present and gate_holds(f, spec, gates, values)
                values[f.name] = draw(_field(spec, codec, f, gates)) if holds else None
        return cls(**values)

    return build()


def message(spec: Spec, codec, name: str, gates: tuple):
    m = next(m for m in spec.messages if m.name == name)
    return blocks(spec, codec, m.blocks, m.class_name, gates)


def cases(spec: Spec, codec):
    """(gates, message) for any message in any gate combination."""
    return st.sampled_from(all_gates(spec, codec)).flatmap(
        lambda gates: st.one_of(
            [
                blocks(spec, codec, m.blocks, m.class_name, gates)
                for m in messages_allowed(spec, gates)
            ]
        ).map(lambda msg: (gates, msg))
    )
