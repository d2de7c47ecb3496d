"""Hypothesis strategies derived from the spec model, not written per message.

Every wire type the spec may use maps to a value strategy below; `_field_strategy` asserts the
map is exhaustive, so a new wire type without a strategy stops the tests instead of being
skipped. Values span the whole legal range of each field (0 and 2**64-1 LSNs, negative
timestamps, non-UTF-8 strings), because that is what a lossless codec must carry.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from hypothesis import strategies as st
import pgoutput_codec as pgc
from codegen.loader import load_spec
from codegen.model import BYTE1, BYTEN, INT_SIZES, SCALAR_TYPES, STRING, Block, Field, Spec


SPEC_PATH = Path(__file__).resolve().parents[2] / "spec" / "pgoutput.yaml"


@lru_cache(maxsize=None)
def spec() -> Spec:
    return load_spec(SPEC_PATH)


def contexts(spec_: Spec | None = None) -> list[tuple[int, str, bool]]:
    """Every (protocol_version, streaming, in_stream) a server can produce."""
    spec_ = spec_ or spec()
    since = {c.name: c.since for c in spec_.contexts}
    out = []
    for pv in spec_.protocol_versions:
        modes = ["off"]
        if pv >= since["in_stream"]:
            modes.append("on")
        if pv >= since["parallel_streaming"]:
            modes.append("parallel")
        for mode in modes:
            out.append((pv, mode, False))
            if mode != "off":
                out.append((pv, mode, True))
    return out


def _context_holds(name: str, streaming: str, in_stream: bool) -> bool:
    # How the public API's arguments map onto the spec's contexts.
    return {"in_stream": in_stream, "parallel_streaming": streaming == "parallel"}[name]


def _int(f: Field):
    bits = INT_SIZES[f.type] * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if f.signed else (0, (1 << bits) - 1)
    # Bias towards the edges, where lossy type mappings break.
    return st.one_of(st.sampled_from([lo, hi, 0, min(hi, 127), min(hi, 128)]), st.integers(lo, hi))


def strings(valid_utf8: bool = False):
    text = st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12
    )
    if valid_utf8:
        return text
    raw = st.binary(max_size=12).map(
        lambda b: b.replace(b"\x00", b"").decode("utf-8", "surrogateescape")
    )
    return st.one_of(text, raw)


def _field_strategy(f: Field, spec_: Spec, valid_utf8: bool, ctx=None):
    assert f.type in SCALAR_TYPES or f.type in spec_.parts_by_name, f"no strategy for {f.type}"
    if f.is_int:
        return _int(f)
    if f.type == BYTE1:
        assert f.choices, "literals are not values"
        return st.sampled_from([c for c, _ in f.choices])
    if f.type == STRING:
        return strings(valid_utf8)
    if f.type == BYTEN:
        return st.binary(max_size=24)
    part = spec_.part(f.type)
    return _blocks_strategy(part.blocks, part.class_name, spec_, ctx, valid_utf8)


def _blocks_strategy(blocks: tuple[Block, ...], class_name: str, spec_: Spec, ctx, valid_utf8):
    """A strategy for the dataclass of a message, part or repeat element."""
    from codegen.model import implicit_fields

    implicit = implicit_fields(blocks)
    cls = getattr(pgc, class_name)
    # the strategies of the fields, parts and repeats inside, built once here rather than on
    # every draw (hypothesis reads a composite's source each time one is made)
    plan = []  # per block: its list strategy (a repeat), or its (field, strategy) pairs
    for block in blocks:
        if block.kind == "repeat":
            if len(block.fields) == 1:
                elem = _field_strategy(block.fields[0], spec_, valid_utf8, ctx)
            else:
                elem = _blocks_strategy(
                    (Block("header", block.fields),), block.struct, spec_, ctx, valid_utf8
                )
            plan.append((block, st.lists(elem, max_size=6)))
            continue
        drawn = [
            (f, _field_strategy(f, spec_, valid_utf8, ctx))
            for f in block.fields
            if not (f.is_literal or f.name in implicit)
        ]
        plan.append((block, drawn))

    @st.composite
    def build(draw):
        values = {}
        for block, inner in plan:
            if block.kind == "repeat":
                values[block.name] = tuple(draw(inner))
                continue
            present = True
            if block.kind == "tagged" and block.optional:
                present = draw(st.booleans())
            for f, strategy in inner:
                gate = present and _gate_holds(f, values, ctx)
                values[f.name] = draw(strategy) if gate else None
        return cls(**values)

    return build()


def _gate_holds(f: Field, values: dict, ctx) -> bool:
    if ctx is not None:
        pv, streaming, in_stream = ctx
        if f.since > pv:
            return False
        if f.when and not _context_holds(f.when, streaming, in_stream):
            return False
    if f.only_if and values.get(f.only_if.field) not in f.only_if.choices:
        return False
    return True


@lru_cache(maxsize=None)  # message_cases asks for it on every draw
def messages_for(ctx: tuple[int, str, bool], valid_utf8: bool = False):
    """Any message a server may send in this context."""
    pv = ctx[0]
    return st.one_of(
        [
            _blocks_strategy(m.blocks, m.class_name, spec(), ctx, valid_utf8)
            for m in spec().messages
            if m.since <= pv
        ]
    )


def message_cases(valid_utf8: bool = False):
    """(protocol_version, streaming, in_stream, message) for every message x version x context."""
    return st.sampled_from(contexts()).flatmap(
        lambda ctx: messages_for(ctx, valid_utf8).map(lambda m: (*ctx, m))
    )


def every_message_in_every_context():
    """(ctx, message spec) pairs, for tests that want each combination named explicitly."""
    return [(ctx, m) for ctx in contexts() for m in spec().messages if m.since <= ctx[0]]


@lru_cache(maxsize=None)  # tests draw from it once per example
def message_in_context(ctx, message_name: str, valid_utf8: bool = False):
    m = next(m for m in spec().messages if m.name == message_name)
    return _blocks_strategy(m.blocks, m.class_name, spec(), ctx, valid_utf8)
