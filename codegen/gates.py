"""Translators of a field's Gate (model.Gate) into each target language.

A gate holds when the version is at least `since`, every context in `when` holds and, with
`only_if`, an earlier Byte1 field holds one of the listed choices. Each target has exactly one
translator here (Kaitai's lives with its expression syntax in targets/kaitai.py); no target
re-derives a gate from the field.
"""

from __future__ import annotations

from .model import Gate, Spec


def python(
    gate: Gate, raw_vars: dict[str, str], version: str = "_pv", context=lambda name: f"_ctx_{name}"
) -> str | None:
    """A Python condition, or None when the gate always holds. `version` is the expression of
    the version, `context(name)` that of a context; `raw_vars` maps a Byte1 field to the local
    holding its byte."""
    # Contexts first: they are usually off, and `and` then stops before the version test.
    terms = [context(name) for name in gate.when]
    if gate.since:
        terms.append(f"{version} >= {gate.since}")
    if gate.only_if:
        raw = raw_vars[gate.only_if.field]
        terms.append("(" + " or ".join(f"{raw} == {ord(c)}" for c in gate.only_if.choices) + ")")
    return " and ".join(terms) or None


def c(gate: Gate, raw_vars: dict[str, str]) -> str | None:
    """The same condition in C, over the accelerator's locals (pv, ctx_<name>, v<raw>)."""
    terms = []
    if gate.since:
        terms.append(f"pv >= {gate.since}")
    terms.extend(f"ctx_{name}" for name in gate.when)
    if gate.only_if:
        raw = raw_vars[gate.only_if.field]
        terms.append("(" + " || ".join(f"v{raw} == {ord(ch)}" for ch in gate.only_if.choices) + ")")
    return " && ".join(terms) or None


def words(gate: Gate, version: str) -> str:
    """The gate in words, for error messages ("protocol_version 2 or later and in_stream")."""
    terms = []
    if gate.since:
        terms.append(f"{version} {gate.since} or later")
    terms.extend(gate.when)
    if gate.only_if:
        terms.append(f"{gate.only_if.field} in {', '.join(gate.only_if.choices)}")
    return " and ".join(terms)


def docs(gate: Gate, version: str) -> list[str]:
    """The gate as the docs' table cells say it."""
    terms = []
    if gate.since:
        terms.append(f"{version} ≥ {gate.since}")
    terms.extend(f"`{name}`" for name in gate.when)
    if gate.only_if:
        terms.append(f"{gate.only_if.field} ∈ {{{', '.join(gate.only_if.choices)}}}")
    return terms


def holds(gate: Gate, spec: Spec, gates: tuple, values: dict) -> bool:
    """Evaluate a gate for the generator's own use (building samples): under gate values
    (version, context, ...) and the earlier field values of its scope."""
    if gate.since and gates[0] < gate.since:
        return False
    on = {c.name for c, flag in zip(spec.contexts, gates[1:]) if flag}
    if any(name not in on for name in gate.when):
        return False
    return gate.only_if is None or values.get(gate.only_if.field) in gate.only_if.choices
