"""Kaitai Struct target: `kaitai/pgoutput_message.ksy`, `kaitai/pgoutput_capture.ksy` and a
sample capture file (`samples/pgoutput_sample.pgcap`) to open beside them in the Web IDE.

The view-model below decides every id, type, condition and doc string once; the templates only
lay the keys out in the order of the Kaitai style guide (doc last in attributes).

How the spec maps onto Kaitai:
  * the gates become top-level params `protocol_version` (u1), `in_stream`, `parallel_streaming`
    (bool); a gated field gets `if: _root.protocol_version >= N and _root.<context>`, the same
    condition the Python decoder tests;
  * one u1 `tag` with the `message_type` enum; `valid` rejects unknown tags and messages newer
    than protocol_version, then `switch-on: tag` picks one type per message;
  * Byte1 literals are u1 with `valid: <byte>`; Byte1 choices are u1 with an enum, `in-enum`;
  * Strings are read as the exact bytes up to the NUL (`terminator: 0`), because names need not
    be valid UTF-8 (the Python codec keeps such bytes with surrogateescape); a `<name>_text`
    value instance shows them decoded as UTF-8;
  * an optional tagged part is read when the byte at its place is one of its choices (a
    read-ahead `peek_<field>` instance), as the Python decoder does;
  * count and length fields follow the style guide's `num_<list>` / `len_<field>` names; where
    the spec's name differs (Truncate's num_relations counts relation_oids) the .ksy uses the
    style-guide name and its doc names the spec field.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
import textwrap
from dataclasses import dataclass, field

import yaml

from . import capture_format
from ..model import BYTE1, BYTEN, INT_SIZES, STRING, Block, Field, Spec, implicit_fields, snake_case

MESSAGE_KSY = "kaitai/pgoutput_message.ksy"
CAPTURE_KSY = "kaitai/pgoutput_capture.ksy"
SAMPLE = "samples/pgoutput_sample.pgcap"
MESSAGE_ID = "pgoutput_message"
CAPTURE_ID = "pgoutput_capture"
KS_VERSION = "0.11"
# The params, in the order the top-level type declares them (and constructors take them).
PARAMS = ("protocol_version", "in_stream", "parallel_streaming")
DOC_WIDTH = 80  # the style guide wraps docs at 80 columns


# -- YAML helpers ---------------------------------------------------------------------------
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




# -- view-model -----------------------------------------------------------------------------
@dataclass
class Attr:
    """One `seq` attribute or instance, with the keys the templates may print."""

    id: str
    doc: str = ""
    type: str | None = None
    size: str | None = None
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


_KS_INT = {("Int8", False): "u1", ("Int8", True): "s1", ("Int16", False): "u2",
           ("Int16", True): "s2", ("Int32", False): "u4", ("Int32", True): "s4",
           ("Int64", False): "u8", ("Int64", True): "s8"}


class KaitaiView:
    """Everything the .ksy templates need, computed once from the spec."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.enums: dict[str, list[EnumMember]] = {}
        self._enum_of: dict[tuple, str] = {}  # (field name, choices) -> enum name
        self.types: list[KType] = []
        self.element_types: list[KType] = []  # repeat elements, listed after messages and parts
        self.message_type_enum = "message_type"
        self.enums[self.message_type_enum] = [
            EnumMember(ord(m.tag), m.snake_name, f"{m.name}, tag '{m.tag}'.") for m in spec.messages
        ]
        for m in spec.messages:
            self.types.append(self._type(m.snake_name, m.description, m.doc_anchor, m.blocks,
                                         skip_tag=True))
        for p in spec.parts:
            self.types.append(self._type(p.snake_name, p.description, p.doc_anchor, p.blocks))
        self.types += self.element_types
        self.tag_attr, self.body_attr = self._top_seq()
        self.params = self._params()
        self._check_ids()

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

    def _gate(self, f: Field, local: set[str]) -> list[str]:
        parts = []
        if f.since > 1:
            parts.append(f"_root.protocol_version >= {f.since}")
        if f.when:
            if f.when not in PARAMS:
                raise ValueError(f"context {f.when!r} has no Kaitai param")
            parts.append(f"_root.{f.when}")
        if f.only_if:
            src = f.only_if.field
            if src not in local:
                raise ValueError(f"{f.name}: only_if field {src!r} is not in the same type")
            enum = self._enum_names[src]
            names = dict(self._choices[src])
            alts = [f"{src} == {enum}::{names[c]}" for c in f.only_if.choices]
            parts.append(alts[0] if len(alts) == 1 else " or ".join(alts))
        if len(parts) > 1:
            parts = [f"({p})" if " or " in p else p for p in parts]
        return parts

    # -- types -----------------------------------------------------------------------------
    def _type(self, name, description, anchor, blocks, skip_tag=False, doc_ref=True) -> KType:
        kt = KType(name, description, self._doc_ref(anchor) if doc_ref and anchor else None)
        renames = self._renames(blocks)
        saved = getattr(self, "_enum_names", {}), getattr(self, "_choices", {})
        self._enum_names: dict[str, str] = {}
        self._choices: dict[str, tuple] = {}
        local: set[str] = set()
        for bi, b in enumerate(blocks):
            if b.kind == "repeat":
                kt.seq.append(self._repeat(name, b, renames))
                local.add(b.name)
                continue
            fields = b.fields[1:] if skip_tag and bi == 0 else b.fields
            extra = None
            if b.kind == "tagged":
                extra = self._tagged(name, kt, b)
            for f in fields:
                kt.seq.extend(self._field(name, kt, f, local, renames, extra))
                local.add(f.name)
        self._enum_names, self._choices = saved
        return kt

    def _doc_ref(self, anchor: str) -> str:
        return f"{self.spec.doc_url}#{anchor}"

    def _field(self, owner: str, kt: KType, f: Field, local, renames, extra) -> list[Attr]:
        cond = ([extra] if extra else []) + self._gate(f, local)
        ident = renames.get(f.name, (f.name,))[0]
        doc = f.description
        if f.name in renames:
            doc += f" (`{f.name}` in the spec; named for the style guide's `num_`/`len_` rule.)"
        a = Attr(ident, doc, cond=cond or None)
        out = [a]
        if f.is_int:
            a.type = _KS_INT[(f.type, bool(f.signed))]
        elif f.type == BYTE1:
            a.type = "u1"
            if f.is_literal:
                a.valid = hex_byte(ord(f.value))
                a.doc = f"Always '{f.value}'. {f.description}"
            else:
                a.enum = self._enum(owner, f)
                a.valid_in_enum = True
                self._enum_names[f.name] = a.enum
                self._choices[f.name] = tuple((c, n) for c, n in f.choices)
        elif f.type == STRING:
            a.terminator = 0
            a.doc = (f"{f.description} Kept as the exact bytes up to the NUL, as they need not "
                     f"be valid UTF-8; {f.name}_text shows them decoded.")
            kt.instances.append(Attr(
                f"{f.name}_text", f"{f.name} decoded as UTF-8, for reading.",
                value=f'{f.name}.to_s("UTF-8")'))
        elif f.type == BYTEN:
            a.size = renames.get(f.length, (f.length,))[0]
        else:
            a.type = snake_case(f.type)
        return out

    def _repeat(self, owner: str, b: Block, renames) -> Attr:
        count = renames.get(b.count, (b.count,))[0]
        if len(b.fields) == 1:
            f = b.fields[0]
            if f.gated or f.only_if:
                raise ValueError(f"{owner}.{b.name}: a gated single-field repeat has no mapping")
            a = self._field(owner, KType("", ""), f, set(), {}, None)[0]
            a.id = b.name
            a.doc = b.description or f.description
            if b.description and f.description:
                a.doc = f"{b.description} Each element: {f.description}"
        else:
            elem = self._type(snake_case(b.struct), b.description, None, (Block("header", b.fields),),
                              doc_ref=False)
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
        kt.instances.append(Attr(
            peek, f"The byte where {head.name} would be, read ahead: {head.name} when it is one of "
                  f"its choices, otherwise the part is absent and this is the next field.",
            type="u1", enum=enum, pos="_io.pos"))
        alts = " or ".join(f"{peek} == {enum}::{n}" for _, n in head.choices)
        has = f"has_{head.name}"
        kt.instances.append(Attr(
            has, f"Whether the optional part starting with {head.name} is present.",
            value=f"not _io.eof and ({alts})"))
        return has

    def _top_seq(self) -> tuple[Attr, Attr]:
        by_since: dict[int, list[str]] = {}
        for m in self.spec.messages:
            by_since.setdefault(m.since, []).append(f"_ == {self.message_type_enum}::{m.snake_name}")
        tag = Attr("tag", "The message type: one byte, an ASCII letter.", type="u1",
                   enum=self.message_type_enum)
        if set(by_since) == {1}:
            tag.valid_in_enum = True
        else:
            alts = []
            for since in sorted(by_since):
                if since <= 1:
                    alts += by_since[since]
                else:
                    alts += [f"(protocol_version >= {since} and {n})" for n in by_since[since]]
            tag.valid_expr = alts
            tag.doc += (" Only the types the protocol version knows are valid; a newer type is "
                        "an error, as in the Python codec.")
        body = Attr("body", "The message, one type per tag.", switch_on="tag",
                    cases=[(f"{self.message_type_enum}::{m.snake_name}", m.snake_name)
                           for m in self.spec.messages])
        return tag, body

    def _params(self) -> list[Attr]:
        ctx = {c.name: c for c in self.spec.contexts}
        missing = set(ctx) - set(PARAMS)
        if missing:
            raise ValueError(f"contexts without a Kaitai param: {sorted(missing)}")
        versions = ", ".join(map(str, self.spec.protocol_versions))
        out = [Attr("protocol_version", f"The proto_version the slot was started with "
                    f"({versions}). Fields and messages newer than it are not read.", type="u1")]
        for name in PARAMS[1:]:
            c = ctx.get(name)
            doc = c.description if c else f"{name} (not used by this spec)."
            if c and c.since > 1:
                doc += f" Only matters from protocol version {c.since}."
            out.append(Attr(name, doc, type="bool"))
        return out

    def _check_ids(self) -> None:
        ident = re.compile(r"^[a-z][a-z0-9_]*$")
        for t in self.types:
            seen = set()
            for a in [*t.seq, *t.instances]:
                if not ident.match(a.id) or a.id in seen:
                    raise ValueError(f"{t.name}: id {a.id!r} is not a unique Kaitai identifier")
                seen.add(a.id)


# -- capture container ----------------------------------------------------------------------
@dataclass
class CaptureView:
    magic: str
    format_version: int
    header: list[tuple[str, str, str]]  # (id, ksy type, doc) of the record header
    flag_bits: list[tuple[str, int, str]]  # (id, width, doc) from the top bit down


_STRUCT_TO_KS = {"B": "u1", "H": "u2", "I": "u4", "Q": "u8"}


def _reserved_name(bits) -> str:
    n = sum(1 for b in bits if b[0].startswith("reserved"))
    return "reserved" if not n else f"reserved_{n + 1}"


def capture_view() -> CaptureView:
    fmt = capture_format.RECORD_HEADER
    if not fmt.startswith(">") or len(fmt) != 5:
        raise ValueError(f"unexpected capture record header {fmt!r}")
    names = ("protocol_version", "flags", "lsn", "len_message")
    docs = ("The protocol version the message was sent with.",
            "The context the message was sent in.",
            "The LSN the server reported with the message.",
            "Byte length of the message that follows.")
    header = [(n, _STRUCT_TO_KS[c], d) for n, c, d in zip(names, fmt[1:], docs)]
    flags = {capture_format.FLAG_IN_STREAM: ("in_stream", "Set when the message lies between a "
                                             "Stream Start and the following Stream Stop."),
             capture_format.FLAG_PARALLEL_STREAMING: ("parallel_streaming", "Set when the slot "
                                                      "was started with streaming = parallel.")}
    bits: list[tuple[str, int, str]] = []
    reserved = 0
    for bit in range(7, -1, -1):
        name = flags.get(1 << bit)
        if name is None:
            reserved += 1
            continue
        if reserved:
            bits.append((_reserved_name(bits), reserved, "Unused, written as 0."))
            reserved = 0
        bits.append((name[0], 1, name[1]))
    if reserved:
        bits.append((_reserved_name(bits), reserved, "Unused, written as 0."))
    magic = capture_format.MAGIC.decode("ascii")
    if not magic.isalnum():
        raise ValueError("the capture magic must be printable ASCII for `contents`")
    return CaptureView(magic, capture_format.FORMAT_VERSION, header, bits)


# -- sample capture -------------------------------------------------------------------------
class _SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a package from the rendered (not yet written) sources, under a private name."""

    def __init__(self, name: str, sources: dict[str, str]):
        self.name = name
        self.sources = sources  # module name under the package ("" = __init__) -> source

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        prefix = self.name + "."
        if fullname.startswith(prefix) and fullname[len(prefix):] in self.sources:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        sub = "" if module.__name__ == self.name else module.__name__[len(self.name) + 1:]
        source = self.sources["__init__" if not sub else sub]
        exec(compile(source, f"<{module.__name__}>", "exec"), module.__dict__)


def load_fresh_codec(files: dict, package: str = "pgoutput_codec"):
    """The Python codec just rendered into `files`, imported without touching the disk."""
    prefix = package + "/"
    sources = {rel[len(prefix):-3]: text for rel, text in files.items()
               if rel.startswith(prefix) and rel.endswith(".py")}
    name = f"_pgoutput_codec_fresh_{abs(hash(tuple(sorted(sources.items())))):x}"
    finder = _SourceFinder(name, sources)
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module(name)
        importlib.import_module(f"{name}.capture")
    finally:
        sys.meta_path.remove(finder)
    return module


# Plausible values by field name, so the sample reads like a real session in the IDE. A value
# that does not fit the field (a spec with other widths) falls back to a type default.
_SAMPLE_VALUES = {
    "final_lsn": 0x16B3748, "commit_lsn": 0x16B3748, "end_lsn": 0x16B3778, "lsn": 0x16B3600,
    "origin_lsn": 0x3000060, "prepare_lsn": 0x16B4000, "abort_lsn": 0x16B5000,
    "prepare_end_lsn": 0x16B4030, "rollback_end_lsn": 0x16B4100,
    "commit_time": 785_000_000_000_000, "prepare_time": 784_999_999_000_000,
    "rollback_time": 785_000_001_000_000, "abort_time": 785_000_002_000_000,
    "xid": 748, "subxid": 749, "relation_oid": 16385, "type_oid": 16390,
    "namespace": "public", "relation_name": "accounts", "type_name": "mood",
    "origin_name": "pg_16401", "prefix": "audit", "content": b"balance checked",
    "gid": "pg_gid_16410_752", "replica_identity": ord("d"), "flags": 0, "options": 0,
    "first_segment": 1,
}
_COLUMNS = (  # (flags, name, type_oid, type_modifier) of the sample table's columns
    (1, "id", 23, -1), (0, "owner", 25, -1), (0, "mood", 16390, -1), (0, "balance", 1700, 655366),
    (0, "note", 25, -1),
)


class _SampleBuilder:
    """Deterministic example values for every message of the spec, built with the fresh codec."""

    def __init__(self, spec: Spec, codec):
        self.spec = spec
        self.codec = codec
        self.tuple_values = iter(())

    def value(self, owner: str, f: Field, overrides: dict):
        if f.is_part:
            part = self.spec.part(f.type)
            return self.build(part.blocks, part.class_name, overrides.get(f.name) or {})
        if f.is_int:
            lo, hi = self._bounds(f)
            for v in (overrides.get(f.name), _SAMPLE_VALUES.get(f.name)):
                if isinstance(v, int) and lo <= v <= hi:
                    return v
            return min(hi, 1)
        if f.name in overrides:
            return overrides[f.name]
        if f.type == BYTE1:
            return f.choices[0][0]
        if f.type == STRING:
            v = _SAMPLE_VALUES.get(f.name, f.name)
            return v if isinstance(v, str) else f.name
        if f.type == BYTEN:
            v = _SAMPLE_VALUES.get(f.name, f.name.encode())
            return v if isinstance(v, bytes) else f.name.encode()
        raise ValueError(f"no sample value for {owner}.{f.name}")

    @staticmethod
    def _bounds(f: Field) -> tuple[int, int]:
        bits = INT_SIZES[f.type] * 8
        return ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if f.signed
                else (0, (1 << bits) - 1))

    def build(self, blocks, class_name: str, overrides: dict, ctx=None, present=True):
        implicit = implicit_fields(blocks)
        values: dict = {}
        for b in blocks:
            if b.kind == "repeat":
                values[b.name] = self._repeat(b, overrides)
                continue
            here = present and (b.kind != "tagged" or not b.optional
                                or overrides.get(f"_{b.fields[0].name}", True))
            for f in b.fields:
                if f.is_literal or f.name in implicit:
                    continue
                ok = here and self._holds(f, values, ctx)
                values[f.name] = self.value(class_name, f, overrides) if ok else None
        return getattr(self.codec, class_name)(**values)

    def _repeat(self, b: Block, overrides: dict):
        rows = overrides.get(b.name)
        if len(b.fields) == 1:
            if rows is not None:
                return tuple(rows)
            f = b.fields[0]
            base = self.value(b.name, f, {})
            return (base, base + 1) if f.is_int and base + 1 <= self._bounds(f)[1] else (base,)
        if rows is None:
            rows = [{}]
        elems = []
        for row in rows:
            elems.append(self.build((Block("header", b.fields),), b.struct, row))
        return tuple(elems)

    @staticmethod
    def _holds(f: Field, values: dict, ctx) -> bool:
        if ctx is not None:
            pv, parallel, in_stream = ctx
            if f.since > pv:
                return False
            if f.when == "in_stream" and not in_stream:
                return False
            if f.when == "parallel_streaming" and not parallel:
                return False
        if f.only_if and values.get(f.only_if.field) not in f.only_if.choices:
            return False
        return True


def _tuple(*cells):
    """Override rows for a TupleData: (kind, value) pairs."""
    return {"columns": [{"kind": k, "value": v} for k, v in cells]}


# A realistic session: (message name, in a stream block, field overrides). Messages of the spec
# that this script does not name are appended with default values, so every type is covered.
_SCRIPT = [
    ("Begin", {}),
    ("Origin", {}),
    ("Type", {}),
    ("Relation", {"columns": [dict(zip(("flags", "name", "type_oid", "type_modifier"), c))
                              for c in _COLUMNS]}),
    ("Insert", {"new_tuple": _tuple(("t", b"1"), ("t", b"alice"), ("t", b"happy"),
                                    ("t", b"100.00"), ("n", None))}),
    ("Update", {"_old_kind": False, "new_tuple": _tuple(("t", b"1"), ("t", b"alice"), ("t", b"ok"),
                                                        ("t", b"90.00"), ("u", None))}),
    ("Update", {"old_kind": "K", "old_tuple": _tuple(("t", b"1"), ("n", None), ("n", None),
                                                     ("n", None), ("n", None)),
                "new_tuple": _tuple(("t", b"2"), ("t", b"alice"), ("t", b"ok"), ("t", b"90.00"),
                                    ("n", None))}),
    ("Delete", {"old_kind": "K", "old_tuple": _tuple(("t", b"2"), ("n", None), ("n", None),
                                                     ("n", None), ("n", None))}),
    ("Message", {"flags": 1}),
    ("Commit", {}),
    ("Message", {"flags": 0, "prefix": "heartbeat", "content": b""}),
    ("Begin", {"xid": 750}),
    ("Truncate", {"xid": 750, "options": 1, "relation_oids": [16385, 16392]}),
    ("Commit", {}),
    ("Stream Start", {"xid": 751, "first_segment": 1}),
    ("Relation", {"xid": 751, "columns": [dict(zip(("flags", "name", "type_oid", "type_modifier"),
                                                  c)) for c in _COLUMNS]}),
    ("Insert", {"xid": 751, "new_tuple": _tuple(("b", b"\x00\x00\x00\x03"), ("t", b"bob"),
                                                ("n", None), ("t", b"7.50"), ("t", b"streamed"))}),
    ("Message", {"xid": 751, "flags": 1, "prefix": "audit", "content": b"in stream"}),
    ("Stream Stop", {}),
    ("Stream Abort", {"xid": 751, "subxid": 753}),
    ("Stream Start", {"xid": 751, "first_segment": 0}),
    ("Delete", {"xid": 751, "old_kind": "O", "old_tuple": _tuple(
        ("t", b"3"), ("t", b"bob"), ("n", None), ("t", b"7.50"), ("t", b"streamed"))}),
    ("Stream Stop", {}),
    ("Stream Commit", {"xid": 751}),
    ("Begin Prepare", {"xid": 752}),
    ("Insert", {"new_tuple": _tuple(("t", b"4"), ("t", b"carol"), ("t", b"sad"),
                                    ("t", b"0.00"), ("n", None))}),
    ("Prepare", {"xid": 752}),
    ("Commit Prepared", {"xid": 752}),
    ("Begin Prepare", {"xid": 754, "gid": "pg_gid_16410_754"}),
    ("Prepare", {"xid": 754, "gid": "pg_gid_16410_754"}),
    ("Rollback Prepared", {"xid": 754, "gid": "pg_gid_16410_754"}),
    ("Stream Start", {"xid": 755, "first_segment": 1}),
    ("Stream Stop", {}),
    ("Stream Prepare", {"xid": 755, "gid": "pg_gid_16410_755"}),
    ("Commit Prepared", {"xid": 755, "gid": "pg_gid_16410_755"}),
]


def sample_records(spec: Spec, codec):
    """The sample's records: one session on a protocol 4 slot with streaming = parallel."""
    pv = spec.max_protocol_version
    builder = _SampleBuilder(spec, codec)
    by_name = {m.name: m for m in spec.messages}
    script = [(n, o) for n, o in _SCRIPT if n in by_name and by_name[n].since <= pv]
    named = {n for n, _ in script}
    script += [(m.name, {}) for m in spec.messages if m.name not in named and m.since <= pv]
    sets = {m.name: dict(m.sets_context).get("in_stream") for m in spec.messages}
    in_stream = False
    payloads = []
    lsn = 0x16B3600
    for name, overrides in script:
        m = by_name[name]
        # A message that opens or closes a stream block is itself outside it.
        inside = in_stream and sets[name] is None
        msg = builder.build(m.blocks, m.class_name, overrides, ctx=(pv, True, inside))
        data = codec.encode(msg, protocol_version=pv, streaming="parallel", in_stream=inside)
        payloads.append(codec.capture.Record(pv, inside, True, lsn, bytes(data)))
        lsn += 0x28 + len(data)
        if sets[name] is not None:
            in_stream = sets[name]
    return payloads


def example_messages(spec: Spec, codec, pv: int, parallel: bool, in_stream: bool) -> list:
    """Every scripted example message (all types, both tagged forms, every TupleData kind) as
    the codec's dataclasses, with the fields this context carries; for tests."""
    builder = _SampleBuilder(spec, codec)
    by_name = {m.name: m for m in spec.messages}
    out = []
    for name, overrides in _SCRIPT + [(m.name, {}) for m in spec.messages]:
        m = by_name.get(name)
        if m is not None and m.since <= pv:
            out.append(builder.build(m.blocks, m.class_name, overrides,
                                     ctx=(pv, parallel, in_stream)))
    return out


def build_sample(spec: Spec):
    def build(files: dict) -> bytes:
        codec = load_fresh_codec(files)
        return codec.capture.dumps(sample_records(spec, codec))

    return build


def outputs(spec: Spec):
    view = KaitaiView(spec)
    ctx = {"view": view, "capture": capture_view(), "scalar": scalar, "text": text_block,
           "expr": expr_block,
           "message_id": MESSAGE_ID, "capture_id": CAPTURE_ID, "ks_version": KS_VERSION,
           "sample": SAMPLE.rsplit("/", 1)[-1]}
    yield MESSAGE_KSY, "kaitai/pgoutput_message.ksy.j2", ctx
    yield CAPTURE_KSY, "kaitai/pgoutput_capture.ksy.j2", ctx
    yield SAMPLE, None, build_sample(spec)
