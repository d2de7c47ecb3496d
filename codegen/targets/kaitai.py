"""Kaitai Struct target: a .ksy of one message (`kaitai/<targets.kaitai.message>.ksy`), a .ksy of
the capture file (`kaitai/<targets.kaitai.capture>.ksy`) and a sample capture to open beside
them in the Web IDE. The sample is `samples/<stem>.<targets.capture.extension>`, where <stem> is
the name of the spec's sample session file (`targets.sample`) without `.yaml` and with dots as
underscores: spec/x.sample.yaml gives samples/x_sample.<capture extension>.

The view-model below decides every id, type, condition and doc string once; the templates only
lay the keys out in the order of the Kaitai style guide (doc last in attributes).

How the spec maps onto Kaitai:
  * the message type takes the spec's parameters as params: the version parameter (u1), then
    one bool per context, in the spec's order; `gate_conditions` turns a field's Gate into its
    `if` (and a message's version gate into the tag's `valid`), the same condition the Python
    decoder tests;
  * one u1 `tag` with the `message_type` enum; `valid` rejects unknown tags and messages newer
    than the version, then `switch-on: tag` picks one type per message;
  * Byte1 literals are u1 with `valid: <byte>`; Byte1 choices are u1 with an enum, `in-enum`;
  * Strings are read as the exact bytes up to the NUL (`terminator: 0`), because names need not
    be valid UTF-8 (the Python codec keeps such bytes with surrogateescape); a `<name>_text`
    value instance shows them decoded as UTF-8; Rest is `size-eos`;
  * an optional tagged part is read when the byte at its place is one of its choices (a
    read-ahead `peek_<field>` instance), as the Python decoder does;
  * count and length fields follow the style guide's `num_<list>` / `len_<field>` names; where
    the spec's name differs (e.g. a count named num_relations of a list relation_oids) the .ksy
    uses the style-guide name and its doc names the spec field;
  * the capture .ksy follows the runtime's capture layout (pgcdc.runtime.capture_file): magic, format
    version, then records of version, flags (bit i: the spec's i-th context), LSN, length and
    the message, parsed with the record's own params, so it opens with nothing to set; the
    record's `-webide-representation` shows its message's tag on each record of the IDE's tree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pgcdc.runtime.capture_file import FORMAT_VERSION, RECORD_HEADER

from ..errors import SpecError
from ..model import (
    BYTE1,
    BYTEN,
    REST,
    STRING,
    Block,
    Field,
    Gate,
    Message,
    Spec,
    Targets,
    snake_case,
)

KS_VERSION = "0.11"
DOC_WIDTH = 80  # the style guide wraps docs at 80 columns
_SEMANTIC_NOTES = {
    "timestamp": "Timestamps are microseconds since 2000-01-01 00:00 UTC.",
    "lsn": "LSNs are printed by PostgreSQL as two hex halves (upper/lower 32 bits).",
}


# -- output names ----------------------------------------------------------------------------
def message_ksy(spec: Spec) -> str:
    return f"kaitai/{spec.targets.kaitai_message}.ksy"


def capture_ksy(spec: Spec) -> str:
    return f"kaitai/{spec.targets.kaitai_capture}.ksy"


def sample_output(spec: Spec) -> str | None:
    """samples/<sample file name without .yaml, dots as underscores>.<capture extension>."""
    if not spec.targets.sample:
        return None
    stem = Path(spec.targets.sample).name
    for suffix in (".yaml", ".yml"):
        stem = stem.removesuffix(suffix)
    return f"samples/{stem.replace('.', '_')}.{spec.targets.capture_extension}"


# -- YAML helpers ----------------------------------------------------------------------------
def scalar(value) -> str:
    """`value` as a one-line YAML scalar, quoted only when YAML needs it (e.g. null, 'N')."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, allow_unicode=True)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text.removesuffix("...").strip()


def text_block(key: str, text: str, indent: int, literal: bool = True) -> str:
    """`key: text` on one line when it fits in DOC_WIDTH columns, else a block scalar wrapped
    to DOC_WIDTH (literal `|` for docs, as the style guide asks; folded `>-` for expressions)."""
    text = " ".join(text.split())
    pad = " " * indent
    line = f"{pad}{key}: {text}"
    if len(line) <= DOC_WIDTH and scalar(text) == text:
        return line  # plain, unquoted: the style guide's form for one-line docs
    width = max(40, DOC_WIDTH - indent - 2)
    body = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    style = "|" if literal else ">-"
    return f"{pad}{key}: {style}\n" + "\n".join(f"{pad}  {part}" for part in body)


def paragraphs_block(key: str, paragraphs: list[str], indent: int = 0) -> str:
    """A literal block of paragraphs, each wrapped to DOC_WIDTH, a blank line between them."""
    pad = " " * (indent + 2)
    width = DOC_WIDTH - indent - 2
    out = []
    for text in paragraphs:
        lines = textwrap.wrap(
            " ".join(text.split()), width, break_long_words=False, break_on_hyphens=False
        )
        out.append("\n".join(pad + line for line in lines))
    return f"{' ' * indent}{key}: |\n" + "\n\n".join(out)


def expr_block(key: str, pieces: list[str], joiner: str, indent: int) -> str:
    """An expression `piece joiner piece ...`: one line when it fits, else a folded block with
    whole pieces packed per line (folding joins the lines with spaces)."""
    pad = " " * indent
    text = f" {joiner} ".join(pieces)
    if len(pad) + len(key) + 2 + len(text) <= DOC_WIDTH:
        return f"{pad}{key}: {text}"
    lines: list[str] = []
    for i, piece in enumerate(pieces):
        word = piece + (f" {joiner}" if i < len(pieces) - 1 else "")
        if lines and len(pad) + 2 + len(lines[-1]) + 1 + len(word) <= DOC_WIDTH:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return f"{pad}{key}: >-\n" + "\n".join(f"{pad}  {line}" for line in lines)


def hex_byte(b: int) -> str:
    return f"0x{b:02x}"


def english_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# -- gates -----------------------------------------------------------------------------------
def gate_conditions(gate: Gate, spec: Spec, choice_enums=None, scope: str = "_root.") -> list[str]:
    """The one translation of a Gate into Kaitai: conditions that must all hold.

    The version and the contexts are params of the message type (read as `<scope><name>`);
    an only_if compares an earlier Byte1 field of the same type with its enum members, so
    `choice_enums` maps that field's name to (enum name, {byte: member name})."""
    parts = []
    if gate.since:
        parts.append(f"{scope}{spec.version.name} >= {gate.since}")
    contexts = {c.name for c in spec.contexts}
    for name in gate.when:
        if name not in contexts:
            raise ValueError(f"context {name!r} is not a context of the spec")
        parts.append(f"{scope}{name}")
    if gate.only_if:
        src = gate.only_if.field
        if not choice_enums or src not in choice_enums:
            raise ValueError(f"only_if field {src!r} is not an earlier choice of the same type")
        enum, members = choice_enums[src]
        parts.append(" or ".join(f"{src} == {enum}::{members[c]}" for c in gate.only_if.choices))
    if len(parts) > 1:
        parts = [f"({p})" if " or " in p else p for p in parts]
    return parts


# -- view-model ------------------------------------------------------------------------------
@dataclass
class Attr:
    """One `seq` attribute or instance, with the keys the templates may print."""

    id: str
    doc: str = ""
    type: str | None = None
    size: str | None = None
    size_eos: bool = False
    terminator: int | None = None
    contents: str | None = None
    enum: str | None = None
    valid: str | None = None  # a scalar (literal) ...
    valid_in_enum: bool = False  # ... or in-enum ...
    valid_expr: list[str] | None = None  # ... or an expression: alternatives joined by `or`
    repeat_expr: str | None = None
    cond: list[str] | None = None  # `if`: conditions that must all hold
    pos: str | None = None  # instances
    value: str | None = None  # value instances
    switch_on: str | None = None
    cases: list[tuple[str, str]] = field(default_factory=list)
    doc_ref: str | None = None


@dataclass
class EnumMember:
    value: int
    id: str
    doc: str


@dataclass
class KType:
    name: str
    doc: str
    doc_ref: str | None = None
    seq: list[Attr] = field(default_factory=list)
    instances: list[Attr] = field(default_factory=list)


_KS_INT = {
    ("Int8", False): "u1",
    ("Int8", True): "s1",
    ("Int16", False): "u2",
    ("Int16", True): "s2",
    ("Int32", False): "u4",
    ("Int32", True): "s4",
    ("Int64", False): "u8",
    ("Int64", True): "s8",
}


class KaitaiView:
    """Everything the message .ksy template needs, computed once from the spec."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.id = spec.targets.kaitai_message
        self.enums: dict[str, list[EnumMember]] = {}
        self._enum_of: dict[tuple, str] = {}  # (field name, choices) -> enum name
        self._choice_enums: dict[str, tuple[str, dict]] = {}  # of the type being built
        self.types: list[KType] = []
        self.element_types: list[KType] = []  # repeat elements, listed after messages and parts
        self.message_type_enum = "message_type"
        self.enums[self.message_type_enum] = [
            EnumMember(ord(m.tag), m.snake_name, f"{m.name}, tag '{m.tag}'.") for m in spec.messages
        ]
        for m in spec.messages:
            self._check_rest(m)
            self.types.append(
                self._type(m.snake_name, m.description, m.doc_anchor, m.blocks, skip_tag=True)
            )
        for p in spec.parts:
            self.types.append(self._type(p.snake_name, p.description, p.doc_anchor, p.blocks))
        self.types += self.element_types
        self.tag_attr, self.body_attr = self._top_seq()
        self.params = self._params()
        self._check_ids()
        self.doc = self._doc()

    # -- checks ----------------------------------------------------------------------------
    def _check_rest(self, m: Message) -> None:
        """Rest reads to the end of the message: only a message's last field may be one."""
        fields = [f for b in m.blocks for f in b.fields]
        for i, f in enumerate(fields):
            if f.type == REST and (i != len(fields) - 1 or m.blocks[-1].kind == "repeat"):
                raise SpecError(
                    self.spec.source_name,
                    f.line,
                    (m.name, f.name),
                    "a Rest field must be the last field of its message",
                )
        for p in self.spec.parts:
            for b in p.blocks:
                for f in b.fields:
                    if f.type == REST:
                        raise SpecError(
                            self.spec.source_name,
                            f.line,
                            (p.name, f.name),
                            "a Rest field belongs in a message, not in a part",
                        )

    def _check_ids(self) -> None:
        ident = re.compile(r"[a-z][a-z0-9_]*")
        for t in self.types:
            seen = set()
            for a in [*t.seq, *t.instances]:
                if not ident.fullmatch(a.id) or a.id in seen:
                    raise ValueError(f"{t.name}: id {a.id!r} is not a unique Kaitai identifier")
                seen.add(a.id)

    # -- naming ----------------------------------------------------------------------------
    def _enum(self, owner: str, f: Field) -> str:
        key = (f.name, f.choices)
        if key in self._enum_of:
            return self._enum_of[key]
        name = f.name if f.name not in self.enums else f"{owner}_{f.name}"
        self._enum_of[key] = name
        self.enums[name] = [EnumMember(ord(c), n, f"Sent as '{c}'.") for c, n in f.choices]
        return name

    @staticmethod
    def _renames(blocks: tuple[Block, ...]) -> dict[str, tuple[str, str]]:
        """Count/length fields whose spec name differs from the style guide's: old -> (new, of)."""
        out = {}
        for b in blocks:
            if b.count and b.count != f"num_{b.name}":
                out[b.count] = (f"num_{b.name}", b.name)
            for f in b.fields:
                if f.length and f.length != f"len_{f.name}":
                    out[f.length] = (f"len_{f.name}", f.name)
        return out

    # -- types -----------------------------------------------------------------------------
    def _type(self, name, description, anchor, blocks, skip_tag=False, doc_ref=True) -> KType:
        kt = KType(name, description, self._doc_ref(anchor) if doc_ref and anchor else None)
        renames = self._renames(blocks)
        saved = self._choice_enums
        self._choice_enums = {}
        for bi, b in enumerate(blocks):
            if b.kind == "repeat":
                kt.seq.append(self._repeat(name, b, renames))
                continue
            fields = b.fields[1:] if skip_tag and bi == 0 else b.fields
            extra = self._tagged(name, kt, b) if b.kind == "tagged" else None
            for f in fields:
                kt.seq.append(self._field(name, kt, f, renames, extra))
        self._choice_enums = saved
        return kt

    def _doc_ref(self, anchor: str) -> str:
        return f"{self.spec.doc_url}#{anchor}"

    def _field(self, owner: str, kt: KType, f: Field, renames, extra) -> Attr:
        cond = ([extra] if extra else []) + gate_conditions(f.gate, self.spec, self._choice_enums)
        ident = renames.get(f.name, (f.name,))[0]
        doc = f.description
        if f.name in renames:
            doc += f" (`{f.name}` in the spec; named for the style guide's `num_`/`len_` rule.)"
        a = Attr(ident, doc, cond=cond or None)
        if f.is_int:
            a.type = _KS_INT[(f.type, bool(f.signed))]
        elif f.type == BYTE1:
            self._byte1(owner, f, a)
        elif f.type == STRING:
            a.terminator = 0
            a.doc = (
                f"{f.description} Kept as the exact bytes up to the NUL, as they need not "
                f"be valid UTF-8; {f.name}_text shows them decoded."
            )
            kt.instances.append(
                Attr(
                    f"{f.name}_text",
                    f"{f.name} decoded as UTF-8, for reading.",
                    value=f'{f.name}.to_s("UTF-8")',
                )
            )
        elif f.type == BYTEN:
            a.size = renames.get(f.length, (f.length,))[0]
        elif f.type == REST:
            a.size_eos = True
        else:
            a.type = snake_case(f.type)
        return a

    def _byte1(self, owner: str, f: Field, a: Attr) -> None:
        a.type = "u1"
        if f.is_literal:
            a.valid = hex_byte(ord(f.value))
            a.doc = f"Always '{f.value}'. {f.description}"
            return
        a.enum = self._enum(owner, f)
        a.valid_in_enum = True
        self._choice_enums[f.name] = (a.enum, dict(f.choices))

    def _repeat(self, owner: str, b: Block, renames) -> Attr:
        count = renames.get(b.count, (b.count,))[0]
        if len(b.fields) == 1:
            f = b.fields[0]
            if not f.gate.always:
                raise ValueError(f"{owner}.{b.name}: a gated single-field repeat has no mapping")
            a = self._field(owner, KType("", ""), f, {}, None)
            a.id = b.name
            a.doc = b.description or f.description
            if b.description and f.description:
                a.doc = f"{b.description} Each element: {f.description}"
        else:
            elem = self._type(
                snake_case(b.struct),
                b.description,
                None,
                (Block("header", b.fields),),
                doc_ref=False,
            )
            self.element_types.append(elem)
            a = Attr(b.name, b.description, type=elem.name)
        a.repeat_expr = count
        return a

    def _tagged(self, owner: str, kt: KType, b: Block) -> str | None:
        """The condition for an optional tagged part (None when it is always there)."""
        if not b.optional:
            return None
        head = b.fields[0]
        enum = self._enum(owner, head)
        peek = f"peek_{head.name}"
        kt.instances.append(
            Attr(
                peek,
                f"The byte where {head.name} would be, read ahead: {head.name} when it is one "
                f"of its choices, otherwise the part is absent and this is the next field.",
                type="u1",
                enum=enum,
                pos="_io.pos",
            )
        )
        alts = " or ".join(f"{peek} == {enum}::{n}" for _, n in head.choices)
        has = f"has_{head.name}"
        kt.instances.append(
            Attr(
                has,
                f"Whether the optional part starting with {head.name} is present.",
                value=f"not _io.eof and ({alts})",
            )
        )
        return has

    def _top_seq(self) -> tuple[Attr, Attr]:
        tag = Attr(
            "tag",
            "The message type: one byte, an ASCII letter.",
            type="u1",
            enum=self.message_type_enum,
        )
        alts = []
        for m in sorted(self.spec.messages, key=lambda m: m.since or 0):
            member = f"_ == {self.message_type_enum}::{m.snake_name}"
            conds = gate_conditions(Gate(m.since or None), self.spec, scope="")
            alts.append(f"({' and '.join([*conds, member])})" if conds else member)
        if all(not m.since for m in self.spec.messages):
            tag.valid_in_enum = True
        else:
            tag.valid_expr = alts
            tag.doc += (
                f" Only the types the {self.spec.version.name} knows are valid; a newer "
                "type is an error, as in the Python codec."
            )
        body = Attr(
            "body",
            "The message, one type per tag.",
            switch_on="tag",
            cases=[
                (f"{self.message_type_enum}::{m.snake_name}", m.snake_name)
                for m in self.spec.messages
            ],
        )
        return tag, body

    def _params(self) -> list[Attr]:
        version = self.spec.version
        if max(version.values) > 0xFF or min(version.values) < 0:
            raise ValueError(f"{version.name} values do not fit the capture's u1")
        versions = ", ".join(map(str, version.values))
        out = [
            Attr(
                version.name,
                f"{version.description} One of {versions}; fields and "
                "messages newer than it are not read.",
                type="u1",
            )
        ]
        for c in self.spec.contexts:
            doc = c.description
            if c.since:
                doc += f" Only matters from {version.name} {c.since}."
            out.append(Attr(c.name, doc, type="bool"))
        return out

    def _doc(self) -> list[str]:
        """The paragraphs of the message type's doc."""
        spec, names = self.spec, [p.id for p in self.params]
        package = spec.targets.package
        how = (
            f"the type takes it as its one param, {names[0]}"
            if len(names) == 1
            else f"the type takes {len(names)} params, in this order: {english_list(names)}"
        )
        out = [
            f"One message of the {spec.title}, as documented at doc-ref.",
            f"What a message holds depends on the connection, not only on its bytes, so {how}. "
            f"A field or message added in a later {spec.version.name}"
            + (", or that needs a context," if spec.contexts else "")
            + f" is read only when its condition holds, exactly as in the generated Python "
            f"codec ({package}).",
            f"The Web IDE cannot pass params: open a capture file with "
            f"{spec.targets.kaitai_capture}.ksy instead, whose records carry them"
            + (f" (see {sample_output(spec)})." if sample_output(spec) else "."),
        ]
        fields = [f for t in (*spec.messages, *spec.parts) for b in t.blocks for f in b.fields]
        if any(f.type == STRING for f in fields):
            out.append(
                "Strings are NUL-terminated on the wire; they are kept as their exact "
                "bytes, since they need not be valid UTF-8. Each has a `<name>_text` "
                "instance with the UTF-8 text."
            )
        notes = [
            text for key, text in _SEMANTIC_NOTES.items() if any(f.semantic == key for f in fields)
        ]
        if notes:
            out.append(" ".join(notes))
        out.append(f"Generated from {spec.source_name}; do not edit, run `make generate`.")
        return out


# -- capture container -----------------------------------------------------------------------
@dataclass
class CaptureView:
    id: str
    title: str
    magic: str
    format_version: int
    header: list[tuple[str, str, str]]  # (id, ksy type, doc) of the record header
    flag_bits: list[tuple[str, int, str]]  # (id, width, doc) from the top bit down
    message_type: str  # the message type called with the record's params
    representation: str  # the Web IDE's one-line summary of a record (its message's tag)
    doc: list[str]


_STRUCT_TO_KS = {"B": "u1", "H": "u2", "I": "u4", "Q": "u8"}


def _flag_bits(spec: Spec) -> list[tuple[str, int, str]]:
    """The flags byte, most significant bit first: bit i holds the spec's i-th context."""
    if len(spec.contexts) > 8:
        raise ValueError("the capture's flags byte holds at most 8 contexts")
    by_bit = {i: c for i, c in enumerate(spec.contexts)}
    bits: list[tuple[str, int, str]] = []
    reserved = 0

    def flush():
        n = sum(1 for b in bits if b[0].startswith("reserved"))
        bits.append(
            ("reserved" if not n else f"reserved_{n + 1}", reserved, "Unused, written as 0.")
        )

    for bit in range(7, -1, -1):
        c = by_bit.get(bit)
        if c is None:
            reserved += 1
            continue
        if reserved:
            flush()
            reserved = 0
        bits.append((c.name, 1, f"Set when {c.name} holds for the message. {c.description}"))
    if reserved:
        flush()
    return bits


def capture_view(spec: Spec) -> CaptureView:
    fmt = RECORD_HEADER.format
    if not fmt.startswith(">") or len(fmt) != 5:
        raise ValueError(f"unexpected capture record header {fmt!r}")
    version = spec.version.name
    names = (version, "flags", "lsn", "len_message")
    docs = (
        f"The {version} the message was sent with.",
        "The contexts the message was sent in.",
        "The LSN the server reported with the message.",
        "Byte length of the message that follows.",
    )
    types = [_STRUCT_TO_KS[c] for c in fmt[1:]]
    types[1] = "flags"
    magic = spec.targets.capture_magic
    if not magic.isascii() or not magic.isalnum():
        raise ValueError("the capture magic must be ASCII letters and digits for `contents`")
    args = [version, *(f"flags.{c.name}" for c in spec.contexts)]
    package, sample = spec.targets.package, sample_output(spec)
    params = english_list([version, *(c.name for c in spec.contexts), "the LSN"])
    doc = [
        f"A recording of messages of the {spec.title}, each with what is needed to parse it: "
        f"{params}. The Python package {package} writes and reads these files "
        f"({package}.capture.write / read; files ending in .gz are gzip-compressed there and "
        f"must be unpacked before opening them here).",
        f"In the Kaitai Web IDE, add this file and {spec.targets.kaitai_message}.ksy, select "
        f"this one, then open a capture"
        + (f" such as {sample}" if sample else "")
        + ". Every record's message is parsed with the record's own params.",
        f"Layout, big-endian: the magic, a format version byte, then records to the end of the "
        f"file, each a {len(names)}-field header and the message bytes.",
        f"Generated from {spec.source_name}; do not edit, run `make generate`.",
    ]
    return CaptureView(
        id=spec.targets.kaitai_capture,
        title=f"{package} capture file",
        magic=magic,
        format_version=FORMAT_VERSION,
        header=list(zip(names, types, docs)),
        flag_bits=_flag_bits(spec),
        message_type=f"{spec.targets.kaitai_message}({', '.join(args)})",
        representation="{message.tag}",
        doc=doc,
    )


# -- sample capture --------------------------------------------------------------------------
class _SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a package from the rendered (not yet written) sources, under a private name."""

    def __init__(self, name: str, sources: dict[str, str]):
        self.name = name
        self.sources = sources  # module name under the package ("" = __init__) -> source

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        prefix = self.name + "."
        if fullname.startswith(prefix) and fullname[len(prefix) :] in self.sources:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        sub = "" if module.__name__ == self.name else module.__name__[len(self.name) + 1 :]
        source = self.sources["__init__" if not sub else sub]
        exec(compile(source, f"<{module.__name__}>", "exec"), module.__dict__)


def load_fresh_codec(files: dict, targets: Targets):
    """The Python codec just rendered into `files` under `<package>/`, imported without
    touching the disk, under a private name so an installed copy is not disturbed. It runs in
    pure Python: the installed accelerator, if any, is bound to the installed package, and
    loading it from here would rebind it to the fresh classes."""
    prefix = targets.package + "/"
    sources = {
        rel[len(prefix) : -3]: text
        for rel, text in files.items()
        if rel.startswith(prefix) and rel.endswith(".py")
    }
    if "__init__" not in sources:
        raise ValueError(f"the Python target rendered no {targets.package}/__init__.py")
    name = f"_{targets.package}_fresh_{abs(hash(tuple(sorted(sources.items())))):x}"
    finder = _SourceFinder(name, sources)
    pure = f"{targets.env_prefix}_PURE"
    saved = os.environ.get(pure)
    os.environ[pure] = "1"
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module(name)
        importlib.import_module(f"{name}.capture")
    finally:
        sys.meta_path.remove(finder)
        if saved is None:
            del os.environ[pure]
        else:
            os.environ[pure] = saved
    return module


def build_sample(spec: Spec):
    """The builder of the sample capture: the spec's sample session (read only now, so the
    .ksy files render without it), encoded by the freshly rendered codec."""

    def build(files: dict) -> bytes:
        from ..sample import load_sample, session_records

        session = spec.sample or load_sample(spec, spec.source_name)
        codec = load_fresh_codec(files, spec.targets)
        return codec.capture.dumps(session_records(spec, session, codec))

    return build


def outputs(spec: Spec):
    view = KaitaiView(spec)
    ctx = {
        "view": view,
        "capture": capture_view(spec),
        "scalar": scalar,
        "text": text_block,
        "paragraphs": paragraphs_block,
        "expr": expr_block,
        "ks_version": KS_VERSION,
    }
    yield message_ksy(spec), "kaitai/message.ksy.j2", ctx
    yield capture_ksy(spec), "kaitai/capture.ksy.j2", ctx
    sample = sample_output(spec)
    if sample:
        yield sample, None, build_sample(spec)
