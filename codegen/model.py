"""The spec as pure, immutable data. Nothing here knows about any output language."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Wire types the spec may use besides the names of shared parts.
BYTE1 = "Byte1"
STRING = "String"
BYTEN = "Byten"
REST = "Rest"  # the bytes from here to the end of the message (nothing may follow)
INT_SIZES = {"Int8": 1, "Int16": 2, "Int32": 4, "Int64": 8}
SCALAR_TYPES = (BYTE1, STRING, BYTEN, REST, *INT_SIZES)
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
class Gate:
    """When a field is on the wire: a minimum version, contexts that must hold, and an earlier
    choice. Every target translates this one object; none re-derives it from the field."""

    since: int | None = None  # None: every version
    when: tuple[str, ...] = ()  # context names, all of which must hold
    only_if: OnlyIf | None = None

    @property
    def always(self) -> bool:
        return self.since is None and not self.when and self.only_if is None

    @property
    def static(self) -> bool:
        """Decided by the call's parameters alone (no earlier field involved)."""
        return self.only_if is None


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # one of SCALAR_TYPES or a part name
    description: str
    signed: bool | None = None  # IntN only
    value: str | None = None  # Byte1 literal
    choices: tuple[tuple[str, str], ...] = ()  # Byte1: (byte, name) pairs
    length: str | None = None  # Byten: name of the length field
    since: int = 0  # the first version that carries it; 0: every version
    when: str | None = None  # a context name
    only_if: OnlyIf | None = None
    semantic: str | None = None
    line: int = 0

    @property
    def gate(self) -> Gate:
        return Gate(self.since or None, (self.when,) if self.when else (), self.only_if)

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
        return self.since > 0 or self.when is not None


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
    since: int = 0  # 0: every version
    sets_context: tuple[tuple[str, bool], ...] = ()
    # per-message contexts that must have this value when the message arrives (a stream
    # decoder's protocol rule); opening/closing a block adds its own (see requires)
    legal_when: tuple[tuple[str, bool], ...] = ()
    line: int = 0

    @property
    def requires(self) -> tuple[tuple[str, bool], ...]:
        """Context values the message needs before it: its legal_when, and for a message that
        sets a context, the opposite value (no nested opening, no closing outside)."""
        need = dict(self.legal_when)
        for name, value in self.sets_context:
            need[name] = not value
        return tuple(sorted(need.items()))

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
    """A boolean that gates fields. Per-message contexts (in_stream) change from message to
    message and are tracked by the stream decoder; the others follow from a mode parameter."""

    name: str
    description: str
    since: int = 0  # the first version in which the context can hold; 0: every version
    per_message: bool = False


@dataclass(frozen=True)
class Parameter:
    """A setting of the connection that the caller passes to decode/encode.

    kind "version": the integer the `since` gates compare with (exactly one per spec).
    kind "mode": a named choice; each value lists the (non-per-message) contexts it turns on.
    """

    name: str
    kind: Literal["version", "mode"]
    description: str
    values: tuple  # versions, or mode names
    default: object = None
    enables: tuple[tuple[str, tuple[str, ...]], ...] = ()  # mode value -> contexts


@dataclass(frozen=True)
class Targets:
    """Names of what the spec renders into: nothing about a protocol lives in codegen/."""

    package: str  # the Python package (and C extension, Spark module) name
    env_prefix: str  # <env_prefix>_PURE=1 keeps the C accelerator from loading
    kaitai_message: str  # .ksy id of one message
    kaitai_capture: str  # .ksy id of a capture file
    capture_magic: str  # the capture file's first bytes
    capture_extension: str
    sample: str | None = None  # sample session file, relative to the spec


@dataclass(frozen=True)
class Spec:
    title: str
    doc_url: str
    targets: Targets
    parameters: tuple[Parameter, ...]  # the version first, then the modes in the spec's order
    contexts: tuple[Context, ...]  # in the spec's order: that of the gates and capture flag bits
    messages: tuple[Message, ...]
    parts: tuple[Part, ...]
    source_name: str = ""
    source_hash: str = ""
    sample: object = None  # the parsed sample session (see codegen.sample), or None
    parts_by_name: dict[str, Part] = field(default_factory=dict, compare=False, repr=False)

    @property
    def version(self) -> Parameter:
        return next(p for p in self.parameters if p.kind == "version")

    @property
    def modes(self) -> tuple[Parameter, ...]:
        return tuple(p for p in self.parameters if p.kind == "mode")

    @property
    def protocol_versions(self) -> tuple[int, ...]:
        return self.version.values

    @property
    def max_protocol_version(self) -> int:
        return max(self.protocol_versions)

    @property
    def per_message_contexts(self) -> tuple[Context, ...]:
        return tuple(c for c in self.contexts if c.per_message)

    def part(self, name: str) -> Part:
        return self.parts_by_name[name]


def int_bounds(f: Field) -> tuple[int, int]:
    """The values an IntN field can hold: (min, max)."""
    bits = INT_SIZES[f.type] * 8
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if f.signed else (0, (1 << bits) - 1)


def implicit_fields(blocks: tuple[Block, ...]) -> set[str]:
    """Counts and lengths: on the wire, but derived from the data they measure."""
    names = {b.count for b in blocks if b.count}
    names |= {f.length for b in blocks for f in b.fields if f.length}
    return names
