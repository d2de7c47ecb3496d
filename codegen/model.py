"""The spec as pure, immutable data. Nothing here knows about any output language."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Wire types the spec may use besides the names of shared parts.
BYTE1 = "Byte1"
STRING = "String"
BYTEN = "Byten"
INT_SIZES = {"Int8": 1, "Int16": 2, "Int32": 4, "Int64": 8}
SCALAR_TYPES = (BYTE1, STRING, BYTEN, *INT_SIZES)
SEMANTICS = ("lsn", "timestamp", "xid", "oid")

BlockKind = Literal["header", "repeat", "tagged"]


def snake_case(name: str) -> str:
    """CamelCase or "Doc Name" -> snake_case (TupleData -> tuple_data)."""
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper() and name[i - 1] != " ":
            out += "_"
        out += ch.lower()
    return out.replace(" ", "_")


@dataclass(frozen=True)
class OnlyIf:
    """Present only when an earlier Byte1 field holds one of `choices`."""

    field: str
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # one of SCALAR_TYPES or a part name
    description: str
    signed: bool | None = None  # IntN only
    value: str | None = None  # Byte1 literal
    choices: tuple[tuple[str, str], ...] = ()  # Byte1: (byte, name) pairs
    length: str | None = None  # Byten: name of the length field
    since: int = 1
    when: str | None = None  # a context name
    only_if: OnlyIf | None = None
    semantic: str | None = None
    line: int = 0

    @property
    def is_literal(self) -> bool:
        return self.value is not None

    @property
    def is_int(self) -> bool:
        return self.type in INT_SIZES

    @property
    def size(self) -> int | None:
        """Fixed wire size in bytes, or None for variable-size fields."""
        if self.type == BYTE1:
            return 1
        return INT_SIZES.get(self.type)

    @property
    def is_part(self) -> bool:
        return self.type not in SCALAR_TYPES

    @property
    def gated(self) -> bool:
        return self.since > 1 or self.when is not None


@dataclass(frozen=True)
class Block:
    kind: BlockKind
    fields: tuple[Field, ...]
    description: str = ""
    name: str | None = None  # repeat: the list attribute
    struct: str | None = None  # repeat with several fields: the element type
    count: str | None = None  # repeat: name of the count field
    optional: bool = False  # tagged: may be absent
    line: int = 0


@dataclass(frozen=True)
class Message:
    name: str  # as in the docs, e.g. "Stream Start"
    description: str
    doc_anchor: str
    blocks: tuple[Block, ...]
    since: int = 1
    sets_context: tuple[tuple[str, bool], ...] = ()
    line: int = 0

    @property
    def class_name(self) -> str:
        return self.name.replace(" ", "")

    @property
    def snake_name(self) -> str:
        return snake_case(self.name)

    @property
    def tag(self) -> str:
        return self.blocks[0].fields[0].value  # the loader guarantees a leading Byte1 literal

    @property
    def all_fields(self) -> tuple[Field, ...]:
        return tuple(f for b in self.blocks for f in b.fields)


@dataclass(frozen=True)
class Part:
    name: str
    description: str
    doc_anchor: str
    blocks: tuple[Block, ...]
    line: int = 0

    @property
    def class_name(self) -> str:
        return self.name

    @property
    def snake_name(self) -> str:
        return snake_case(self.name)


@dataclass(frozen=True)
class Context:
    name: str
    description: str
    since: int = 1  # the first protocol version in which the context can hold


@dataclass(frozen=True)
class Spec:
    title: str
    doc_url: str
    protocol_versions: tuple[int, ...]
    contexts: tuple[Context, ...]
    messages: tuple[Message, ...]
    parts: tuple[Part, ...]
    source_name: str = "spec/pgoutput.yaml"
    source_hash: str = ""
    parts_by_name: dict[str, Part] = field(default_factory=dict, compare=False, repr=False)

    @property
    def max_protocol_version(self) -> int:
        return max(self.protocol_versions)

    def part(self, name: str) -> Part:
        return self.parts_by_name[name]


def implicit_fields(blocks: tuple[Block, ...]) -> set[str]:
    """Counts and lengths: on the wire, but derived from the data they measure."""
    names = {b.count for b in blocks if b.count}
    names |= {f.length for b in blocks for f in b.fields if f.length}
    return names
