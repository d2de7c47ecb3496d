"""The sample session of a spec: a YAML file beside it (`targets.sample`) that lists messages by
their spec name, with field values, and the parameters the session runs with. The Kaitai target
encodes it with the freshly generated codec into a capture file for the Web IDE.

    parameters: {protocol_version: 4, streaming: parallel}   # the version and every mode
    first_lsn: 0x16B3600      # the first record's LSN ...
    lsn_step: 40              # ... each next one adds this plus the previous message's length
    defaults:                 # values by field name, for messages that do not set the field
      xid: 748
    messages:                 # in session order; a bare name takes every value by default
      - Begin
      - Update: {old_kind: null, new_tuple: {columns: [{kind: t, value: "1"}]}}

Values are written as the codec's dataclasses hold them: ints, one-character strings for Byte1
choices, text for String; Byten and Rest take text (UTF-8) or `{hex: "..."}`. A part is a
mapping of its fields; a repeat is a list (of mappings when its elements have several fields).
`null` for the head of an optional tagged part leaves the part out. A field nobody sets gets a
default for its type. Which contexts hold for each message follows from the parameters and the
spec's `sets_context`, as a stream decoder tracks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import SpecError
from . import gates as gates_
from .model import BYTE1, BYTEN, REST, STRING, Block, Field, Spec, implicit_fields, int_bounds

MAX_SAMPLE_BYTES = 1 << 20  # a sample is a page of YAML; refuse anything near this size
_KEYS = {"parameters", "first_lsn", "lsn_step", "defaults", "messages"}


@dataclass(frozen=True)
class Entry:
    """One message of the session: its spec name, the values given for it, its line."""

    name: str
    values: dict
    line: int


@dataclass(frozen=True)
class Sample:
    file: str  # for error messages
    parameters: dict  # parameter name -> value
    first_lsn: int
    lsn_step: int
    defaults: dict
    entries: tuple[Entry, ...]


# -- reading ---------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """safe_load without aliases (no expansion bombs) and without duplicate keys."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.MarkedYAMLError(None, None, "aliases are not allowed in a sample", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.MarkedYAMLError(
                    f"{key!r} first defined here",
                    seen[key],
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def sample_path(spec: Spec, spec_path: str | Path) -> Path | None:
    """Where the spec's sample lives: `targets.sample`, relative to the spec file."""
    if not spec.targets.sample:
        return None
    return Path(spec_path).parent / spec.targets.sample


def load_sample(spec: Spec, spec_path: str | Path) -> Sample | None:
    """Read and check the spec's sample session; None when the spec names none.
    Raises SpecError pointing at the sample file."""
    path = sample_path(spec, spec_path)
    if path is None:
        return None
    name = path.as_posix()
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise SpecError(name, 0, (), f"cannot read the sample session: {exc.strerror}") from None
    if len(raw_bytes) > MAX_SAMPLE_BYTES:
        raise SpecError(name, 0, (), f"the sample is larger than {MAX_SAMPLE_BYTES} bytes")
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(name, 0, (), f"not UTF-8 at byte {exc.start}") from None
    try:
        node = yaml.compose(text, Loader=_StrictLoader)
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SpecError(name, mark.line + 1 if mark else 0, (), f"invalid YAML: {exc}") from None
    return _check(spec, name, raw, node)


def _check(spec: Spec, name: str, raw, node) -> Sample:
    def fail(path, message, line=0):
        raise SpecError(name, line, path, message)

    if not isinstance(raw, dict) or set(raw) - _KEYS or "messages" not in raw:
        fail((), f"a sample is a mapping with the keys {sorted(_KEYS)} (messages required)")
    params = raw.get("parameters") or {}
    expected = {p.name for p in spec.parameters}
    if not isinstance(params, dict) or set(params) != expected:
        fail(("parameters",), f"give exactly the spec's parameters: {sorted(expected)}")
    by_name = {m.name: m for m in spec.messages}
    entries = []
    for i, (item, item_node) in enumerate(zip(raw["messages"], _items(node, "messages"))):
        line = item_node.start_mark.line + 1
        msg, values = (item, {}) if isinstance(item, str) else _single(item, fail, i, line)
        if msg not in by_name:
            fail(("messages", i), f"{msg!r} is not a message of the spec", line)
        if not isinstance(values, dict):
            fail(("messages", i, msg), "a message's values are a mapping of field names", line)
        entries.append(Entry(msg, values, line))
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        fail(("defaults",), "defaults map field names to values")
    return Sample(
        name,
        params,
        int(raw.get("first_lsn", 0)),
        int(raw.get("lsn_step", 0)),
        defaults,
        tuple(entries),
    )


def _items(node, key: str):
    for k, v in node.value:
        if k.value == key and isinstance(v, yaml.SequenceNode):
            return v.value
    return []


def _single(item, fail, i: int, line: int):
    if not isinstance(item, dict) or len(item) != 1:
        fail(("messages", i), "an entry is a message name, or {name: {field: value, ...}}", line)
    ((msg, values),) = item.items()
    return msg, values if values is not None else {}


# -- building messages -----------------------------------------------------------------------
class SampleBuilder:
    """Turns the sample's entries into the codec's dataclasses for given gate values."""

    def __init__(self, spec: Spec, sample: Sample, codec):
        self.spec = spec
        self.sample = sample
        self.codec = codec

    def message(self, entry: Entry, gates: tuple):
        """The entry as its message dataclass; fields whose gate fails under `gates` are None."""
        m = next(m for m in self.spec.messages if m.name == entry.name)
        path = (entry.name,)
        try:
            return self._build(m.blocks, m.class_name, entry.values, gates, path)
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(
                self.sample.file, entry.line, path, f"bad sample value: {exc}"
            ) from None

    def _build(self, blocks: tuple[Block, ...], class_name: str, given: dict, gates, path):
        implicit = implicit_fields(blocks)
        known = {f.name for b in blocks for f in b.fields} | {b.name for b in blocks if b.name}
        unknown = set(given) - known
        if unknown:
            raise KeyError(f"{'.'.join(path)} has no field {sorted(unknown)}")
        values: dict = {}
        for b in blocks:
            if b.kind == "repeat":
                values[b.name] = self._repeat(b, given, gates, path)
                continue
            present = not (
                b.kind == "tagged"
                and b.optional
                and b.fields[0].name in given
                and given[b.fields[0].name] is None
            )
            for f in b.fields:
                if f.is_literal or f.name in implicit:
                    continue
                holds = present and gate_holds(f, self.spec, gates, values)
                values[f.name] = self._value(f, given, gates, path) if holds else None
        return getattr(self.codec, class_name)(**values)

    def _repeat(self, b: Block, given: dict, gates, path):
        rows = given.get(b.name)
        if len(b.fields) == 1:
            f = b.fields[0]
            if rows is not None:
                return tuple(self._value(f, {f.name: r}, gates, path) for r in rows)
            base = self._value(f, {}, gates, path)
            return (base, base + 1) if f.is_int and base + 1 <= int_bounds(f)[1] else (base,)
        return tuple(
            self._build((Block("header", b.fields),), b.struct, row, gates, (*path, b.name))
            for row in (rows if rows is not None else [{}])
        )

    def _value(self, f: Field, given: dict, gates, path):
        if f.is_part:
            part = self.spec.part(f.type)
            return self._build(
                part.blocks, part.class_name, given.get(f.name) or {}, gates, (*path, f.name)
            )
        for source in (given, self.sample.defaults):
            if f.name in source and source[f.name] is not None:
                return _convert(f, source[f.name])
        return _fallback(f)


def _convert(f: Field, value):
    """A YAML value as the codec holds it (bytes from text or {hex: ...})."""
    if f.type in (BYTEN, REST):
        if isinstance(value, dict) and set(value) == {"hex"}:
            return bytes.fromhex(str(value["hex"]))
        if isinstance(value, str):
            return value.encode("utf-8")
        raise TypeError(f"{f.name}: bytes are written as text or {{hex: ...}}, not {value!r}")
    return value


def _fallback(f: Field):
    """The value of a field that neither the entry nor the defaults set."""
    if f.is_int:
        return min(int_bounds(f)[1], 1)
    if f.type == BYTE1:
        return f.choices[0][0]
    if f.type == STRING:
        return f.name
    if f.type in (BYTEN, REST):
        return f.name.encode()
    raise ValueError(f"no sample value for {f.name} of type {f.type}")


def gate_holds(f: Field, spec: Spec, gates: tuple, values: dict) -> bool:
    """Whether `f` is on the wire under gate values (version, context, ...) and the earlier
    values of its scope."""
    return gates_.holds(f.gate, spec, gates, values)


# -- the session -----------------------------------------------------------------------------
def session_gates(spec: Spec, sample: Sample, codec):
    """(entry, gates) for every entry: the parameters resolved by the codec, with per-message
    contexts tracked through the messages' sets_context (an opening or closing message is
    itself outside its block, as the stream decoder has it)."""
    version = sample.parameters[spec.version.name]
    modes = [sample.parameters[m.name] for m in spec.modes]
    flags = {c.name: False for c in spec.per_message_contexts}
    by_name = {m.name: m for m in spec.messages}
    for entry in sample.entries:
        sets = dict(by_name[entry.name].sets_context)
        here = {name: flag and name not in sets for name, flag in flags.items()}
        try:
            gates = codec.PARAMS.resolve(version, *modes, *here.values())
        except ValueError as exc:
            raise SpecError(sample.file, entry.line, ("parameters",), str(exc)) from None
        yield entry, gates
        flags.update((k, v) for k, v in sets.items() if k in flags)


def session_records(spec: Spec, sample: Sample, codec) -> list:
    """The session as the codec's capture records, encoded by the codec itself."""
    builder = SampleBuilder(spec, sample, codec)
    records = []
    lsn = sample.first_lsn
    for entry, gates in session_gates(spec, sample, codec):
        msg = builder.message(entry, gates)
        try:
            data = bytes(codec.encode_gates(msg, *gates))
        except ValueError as exc:  # EncodeError: the sample does not fit the spec
            raise SpecError(sample.file, entry.line, (entry.name,), str(exc)) from None
        records.append(codec.capture.Record(*gates, lsn, data))
        lsn += sample.lsn_step + len(data)
    return records


def messages_for_gates(spec: Spec, sample: Sample, codec, gates: tuple) -> list:
    """Every entry that the version allows, built for other gate values than the session's
    (tests use this corpus in every context)."""
    builder = SampleBuilder(spec, sample, codec)
    by_name = {m.name: m for m in spec.messages}
    return [
        builder.message(e, gates)
        for e in sample.entries
        if not by_name[e.name].since or by_name[e.name].since <= gates[0]
    ]
