"""Docs target: a Markdown page per message and part, and a protocol-version matrix."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import gates
from ..model import Block, Field, Message, Part, Spec, implicit_fields


@dataclass
class FieldRow:
    block: str
    name: str
    wire: str
    gates: str
    description: str
    node: str  # mermaid node id
    label: str  # mermaid label


def wire_text(f: Field) -> str:
    if f.value is not None:
        return f"Byte1('{f.value}')"
    if f.choices:
        return "Byte1(" + " \\| ".join(f"'{c}'" for c, _ in f.choices) + ")"
    if f.is_int:
        return f"{f.type} ({'signed' if f.signed else 'unsigned'})"
    if f.length:
        return f"Byte*n* (n = {f.length})"
    return f.type


def gate_text(f: Field, block: Block, version: str) -> str:
    """The docs' translation of a field's gate."""
    words = gates.docs(f.gate, version)
    if block.kind == "tagged" and block.optional:
        words.append("optional part")
    return ", ".join(words) or "always"


def _label_safe(text: str) -> str:
    return re.sub(r"[\"\[\]{}()|<>]", "", text).replace("\n", " ")


def rows(blocks: tuple[Block, ...], version: str) -> list[FieldRow]:
    out = []
    implicit = implicit_fields(blocks)
    for bi, b in enumerate(blocks):
        title = b.kind if b.kind != "repeat" else f"repeat {b.name} × {b.count}"
        for fi, f in enumerate(b.fields):
            plain = wire_text(f).replace(" \\| ", " or ")
            label = f"{f.name}: {plain}" + (" (derived)" if f.name in implicit else "")
            out.append(
                FieldRow(
                    title,
                    f.name,
                    wire_text(f),
                    gate_text(f, b, version),
                    f.description,
                    f"b{bi}f{fi}",
                    _label_safe(label),
                )
            )
    return out


def block_groups(blocks: tuple[Block, ...], version: str):
    """(block id, title, rows) for the mermaid subgraphs."""
    all_rows = rows(blocks, version)
    groups, i = [], 0
    for bi, b in enumerate(blocks):
        n = len(b.fields)
        title = {
            "header": "Header",
            "tagged": "Tagged part" + (" (optional)" if b.optional else ""),
            "repeat": f"Repeat {b.name} × {b.count}",
        }[b.kind]
        groups.append((f"block{bi}", _label_safe(title), all_rows[i : i + n]))
        i += n
    return groups


def versions_of(spec: Spec, m: Message) -> list[tuple[int, bool]]:
    return [(pv, pv >= m.since) for pv in spec.protocol_versions]


def field_matrix(spec: Spec):
    """(message, field, gate note, [present per version]) for every gated field."""
    out = []
    for m in spec.messages:
        for b in m.blocks:
            for f in b.fields:
                if f.since > 0 or f.when:
                    out.append(
                        (
                            m.name,
                            f.name,
                            f"`{f.when}`" if f.when else "",
                            [max(f.since, m.since) <= pv for pv in spec.protocol_versions],
                        )
                    )
    return out


def page_name(item: Message | Part) -> str:
    return item.name.lower().replace(" ", "-") + ".md"


def outputs(spec: Spec):
    folder = f"docs/{spec.targets.package}"
    version = spec.version.name
    common = {"wire_text": wire_text, "page_name": page_name, "version": version}
    yield (
        f"{folder}/README.md",
        "docs/index.md.j2",
        {**common, "matrix": field_matrix(spec), "versions_of": versions_of},
    )
    for item in (*spec.messages, *spec.parts):
        yield (
            f"{folder}/{page_name(item)}",
            "docs/message.md.j2",
            {
                **common,
                "item": item,
                "rows": rows(item.blocks, version),
                "groups": block_groups(item.blocks, version),
                "is_part": isinstance(item, Part),
            },
        )
