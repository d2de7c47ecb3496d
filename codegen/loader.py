"""YAML -> checked Spec model. Every rejection names file, line and YAML path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import builtins
import keyword
import re
from importlib import resources
from pathlib import Path

import jsonschema

from . import yamlsafe
from .errors import SpecError
from .model import (
    BYTE1,
    BYTEN,
    INT_SIZES,
    REST,
    SCALAR_TYPES,
    Block,
    Context,
    Field,
    Message,
    OnlyIf,
    Parameter,
    Part,
    Spec,
    Targets,
)

# Names the generated code keeps for itself: its locals and methods, the helpers its
# functions call (a field of that name would shadow one), and Python's builtins.
RESERVED = {
    "self",
    "cls",
    "msg",
    "value_of",
    "from_bytes",
    "to_bytes",
    "version",
    "truncated",
    "short",
    "unterminated",
    "bad_literal",
    "bad_choice",
    "trailing",
    "unpack_from",
    "pack",
    "missing",
    "not_sent",
    "bad_run",
    "as_bytes",
    "as_seq",
    "check_type",
    "string",
    "offset_of",
    "gates",
    "data",
    "payload",
} | {n for n in dir(builtins) if not n.startswith("_")}
RESERVED -= {"data"}  # XLogData.data: only ever an attribute and a _-prefixed local
# Class names the generated modules define or import at module level.
RESERVED_CLASSES = {
    "Struct",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "Retry",
    "Dispatcher",
    "ParamSpec",
    "Mode",
    "ContextInfo",
    "Record",
    "StreamDecoder",
    "ClassVar",
    "CaptureFormat",
    "Iterable",
    "Iterator",
    "SparkCodec",
    "StructType",
    "StructField",
} | {n for n in dir(builtins) if n[:1].isupper()}
IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")
CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")
MESSAGE_NAME = re.compile(r"[A-Z][A-Za-z0-9]*( [A-Z][A-Za-z0-9]*)*")
ENV_PREFIX = re.compile(r"[A-Z][A-Z0-9_]*")
ANCHOR = re.compile(r"[A-Z0-9-]+")
DOC_URL = re.compile(r"https://[A-Za-z0-9.-]+(/[A-Za-z0-9._~/%+-]*)?(#[A-Za-z0-9._-]*)?")


def _gate_since(since: int, versions) -> int:
    """0 stands for "every version": the first version gates nothing."""
    return 0 if since == versions[0] else since


def load_schema() -> dict:
    return json.loads(resources.files(__package__).joinpath("spec.schema.json").read_text())


class _Checker:
    def __init__(self, file: str, positions: dict[tuple, tuple[int, int]]):
        self.file = file
        self.positions = positions
        self.lines = {path: line for path, (line, _) in positions.items()}

    def fail(self, path: tuple, message: str, hint: str | None = None):
        path = tuple(path)
        probe = path
        while probe and probe not in self.positions:
            probe = probe[:-1]
        line, column = self.positions.get(probe, (1, 1))
        raise SpecError(self.file, line, path, message, column=column, hint=hint)

    # -- structure ---------------------------------------------------------
    def check_schema(self, raw) -> None:
        validator = jsonschema.Draft202012Validator(load_schema())
        errors = sorted(validator.iter_errors(raw), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return
        err = errors[0]
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set(err.schema.get("properties", {}))
            unknown = sorted(k for k in err.instance if k not in allowed)
            if unknown:
                self.fail(path + (unknown[0],), f"unknown key {unknown[0]!r}")
        if err.validator == "pattern":
            self.fail(
                path,
                f"{err.instance!r} is not a plain identifier (must match {err.validator_value})",
            )
        self.fail(path, err.message)

    # -- meaning -----------------------------------------------------------
    def check_text(self, raw: dict) -> None:
        """What a JSON Schema pattern cannot say (it only searches, so a trailing newline
        passes it): names and identifiers match in full, the doc URL is a plain https URL."""
        if not DOC_URL.fullmatch(raw["doc_url"]):
            self.fail(
                ("doc_url",),
                f"{raw['doc_url']!r} is not a plain https URL",
                hint="https://host/path#anchor, without spaces, quotes or markup",
            )
        t = raw["targets"]
        for key, pattern in (("package", IDENTIFIER), ("env_prefix", ENV_PREFIX)):
            if not pattern.fullmatch(t[key]) or keyword.iskeyword(t[key]):
                self.fail(("targets", key), f"{t[key]!r} is not allowed here ({pattern.pattern})")
        for key in ("message", "capture"):
            if not IDENTIFIER.fullmatch(t["kaitai"][key]):
                self.fail(("targets", "kaitai", key), f"{t['kaitai'][key]!r} is not a .ksy id")
        for kind in ("messages", "parts"):
            for i, item in enumerate(raw[kind]):
                self.check_class_name(item["name"], (kind, i, "name"))
                if not ANCHOR.fullmatch(item["doc_anchor"]):
                    self.fail((kind, i, "doc_anchor"), f"{item['doc_anchor']!r} is not an anchor")
                for bi, block in enumerate(item["blocks"]):
                    if "struct" in block:
                        self.check_class_name(block["struct"], (kind, i, "blocks", bi, "struct"))
                    for fi, f in enumerate(block["fields"]):
                        for c, cname in (f.get("choices") or {}).items():
                            if not IDENTIFIER.fullmatch(cname):
                                self.fail(
                                    (kind, i, "blocks", bi, "fields", fi, "choices", c),
                                    f"choice name {cname!r} is not a plain identifier",
                                )

    def check_class_name(self, name: str, path: tuple) -> None:
        pattern = MESSAGE_NAME if path and path[0] == "messages" else CLASS_NAME
        if not pattern.fullmatch(name):
            self.fail(path, f"{name!r} is not a valid name ({pattern.pattern})")
        if name.replace(" ", "") in RESERVED_CLASSES:
            self.fail(
                path,
                f"{name!r} would clash with a name the generated code uses",
                hint="choose another name",
            )

    def check_name(self, name: str, path: tuple) -> None:
        if not IDENTIFIER.fullmatch(name):
            self.fail(
                path,
                f"{name!r} is not a plain identifier ({IDENTIFIER.pattern})",
                hint="use lower-case letters, digits and underscores",
            )
        if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in RESERVED:
            self.fail(path, f"{name!r} is reserved and cannot be used as a name")

    def build_parameters(self, raw: dict) -> tuple[Parameter, ...]:
        params, names = [], set()
        for i, rp in enumerate(raw["parameters"]):
            path = ("parameters", i)
            self.check_name(rp["name"], path + ("name",))
            if rp["name"] in names:
                self.fail(path + ("name",), f"duplicate parameter name {rp['name']!r}")
            names.add(rp["name"])
            values = rp["values"]
            if rp["kind"] == "version":
                if not isinstance(values, list):
                    self.fail(path + ("values",), "a version parameter lists its versions")
                if values != sorted(values):
                    self.fail(path + ("values",), "versions must be listed in ascending order")
                default = rp.get("default")
                if default is not None and default not in values:
                    self.fail(path + ("default",), f"default {default!r} is not one of the values")
                params.append(
                    Parameter(
                        rp["name"], "version", rp["description"].strip(), tuple(values), default
                    )
                )
            else:
                if not isinstance(values, dict):
                    self.fail(
                        path + ("values",),
                        "a mode parameter maps each value to the contexts it turns on",
                    )
                if "default" not in rp or rp["default"] not in values:
                    self.fail(
                        path + ("default",), "a mode parameter needs a default among its values"
                    )
                params.append(
                    Parameter(
                        rp["name"],
                        "mode",
                        rp["description"].strip(),
                        tuple(values),
                        rp["default"],
                        tuple((k, tuple(v)) for k, v in values.items()),
                    )
                )
        if sum(p.kind == "version" for p in params) != 1:
            self.fail(("parameters",), "exactly one parameter must be of kind 'version'")
        # The order the spec lists them in means nothing (kind tells them apart), but every
        # target passes them on positionally as (version, *modes): ParamSpec.resolve and the
        # generated signatures, where a version without a default must come first. Put the
        # version first and keep the modes in the spec's order.
        return tuple(sorted(params, key=lambda p: p.kind != "version"))

    def build_contexts(self, raw: dict, params, versions) -> tuple[Context, ...]:
        contexts = []
        param_names = {p.name for p in params}
        for i, c in enumerate(raw["contexts"]):
            path = ("contexts", i)
            self.check_name(c["name"], path + ("name",))
            if c["name"] in param_names or c["name"] in {x.name for x in contexts}:
                self.fail(path + ("name",), f"duplicate parameter or context name {c['name']!r}")
            if c["since"] not in versions and c["since"] > min(versions):
                self.fail(
                    path + ("since",),
                    f"version {c['since']} is not a value of the version parameter",
                )
            contexts.append(
                Context(
                    c["name"],
                    c["description"].strip(),
                    _gate_since(max(c["since"], versions[0]), versions),
                    c.get("per_message", False),
                )
            )
        names = {c.name for c in contexts}
        per_message = {c.name for c in contexts if c.per_message}
        for i, p in enumerate(raw["parameters"]):
            if p["kind"] != "mode":
                continue
            for value, enabled in p["values"].items():
                for j, ctx in enumerate(enabled):
                    if ctx not in names:
                        self.fail(("parameters", i, "values", value, j), f"unknown context {ctx!r}")
        for c in contexts:
            enabled_by = [p for p in params if any(c.name in e for _, e in p.enables)]
            if not c.per_message and not enabled_by:
                self.fail(
                    ("contexts", [x.name for x in contexts].index(c.name)),
                    f"context {c.name!r} is neither per_message nor turned on by a mode",
                )
        del per_message
        return tuple(contexts)

    def build_targets(self, raw: dict) -> Targets:
        t = raw["targets"]
        return Targets(
            package=t["package"],
            env_prefix=t["env_prefix"],
            kaitai_message=t["kaitai"]["message"],
            kaitai_capture=t["kaitai"]["capture"],
            capture_magic=t["capture"]["magic"],
            capture_extension=t["capture"]["extension"],
            sample=t.get("sample"),
        )

    def build(self, raw: dict, source_name: str, digest: str) -> Spec:
        params = self.build_parameters(raw)
        versions = next(p.values for p in params if p.kind == "version")
        self.version_name = next(p.name for p in params if p.kind == "version")
        contexts = self.build_contexts(raw, params, versions)
        context_names = {c.name for c in contexts}
        part_names = {p["name"] for p in raw["parts"]}

        seen_parts: set[str] = set()
        parts = []
        for i, p in enumerate(raw["parts"]):
            path = ("parts", i)
            if p["name"] in seen_parts:
                self.fail(path + ("name",), f"duplicate part name {p['name']!r}")
            seen_parts.add(p["name"])
            blocks = self.build_blocks(
                p["blocks"],
                path,
                versions,
                context_names,
                part_names,
                owner=p["name"],
                allow_parts=set(),
            )
            for bi, b in enumerate(blocks):
                for fi, f in enumerate(b.fields):
                    if f.type == REST:
                        self.fail(
                            path + ("blocks", bi, "fields", fi, "type"),
                            "a shared part cannot hold a Rest field (it would end the message)",
                        )
            parts.append(
                Part(
                    p["name"],
                    p["description"].strip(),
                    p["doc_anchor"],
                    blocks,
                    line=self.lines.get(path, 0),
                )
            )

        messages = []
        tags: dict[str, str] = {}
        names: set[str] = set()
        for i, m in enumerate(raw["messages"]):
            path = ("messages", i)
            if m["name"] in names:
                self.fail(path + ("name",), f"duplicate message name {m['name']!r}")
            names.add(m["name"])
            since = m.get("since", versions[0])
            if since not in versions:
                self.fail(
                    path + ("since",),
                    f"{self.version_name} {since} is not one of its values {list(versions)}",
                )
            since = _gate_since(since, versions)
            per_message = {c.name for c in contexts if c.per_message}
            for key in ("sets_context", "legal_when"):
                for ctx in m.get(key, {}):
                    if ctx not in per_message:
                        self.fail(path + (key, ctx), f"{ctx!r} is not a per_message context")
            blocks = self.build_blocks(
                m["blocks"],
                path,
                versions,
                context_names,
                part_names,
                owner=m["name"],
                allow_parts=part_names,
            )
            self.check_rest(blocks, path)
            first = blocks[0].fields[0]
            if blocks[0].kind != "header" or first.type != BYTE1 or first.value is None:
                self.fail(
                    path + ("blocks", 0, "fields", 0),
                    "a message must start with its Byte1 tag literal",
                )
            if first.value in tags:
                self.fail(
                    path + ("blocks", 0, "fields", 0, "value"),
                    f"duplicate tag {first.value!r}: already used by {tags[first.value]}",
                )
            tags[first.value] = m["name"]
            messages.append(
                Message(
                    name=m["name"],
                    description=m["description"].strip(),
                    doc_anchor=m["doc_anchor"],
                    blocks=blocks,
                    since=since,
                    sets_context=tuple(sorted(m.get("sets_context", {}).items())),
                    legal_when=tuple(sorted(m.get("legal_when", {}).items())),
                    line=self.lines.get(path, 0),
                )
            )

        return Spec(
            title=raw["title"],
            doc_url=raw["doc_url"],
            targets=self.build_targets(raw),
            parameters=params,
            contexts=contexts,
            messages=tuple(messages),
            parts=tuple(parts),
            source_name=source_name,
            source_hash=digest,
            parts_by_name={p.name: p for p in parts},
        )

    def check_rest(self, blocks, path) -> None:
        """A Rest field runs to the end of the message: it must be the message's last field,
        outside repeats and tagged parts."""
        for bi, b in enumerate(blocks):
            for fi, f in enumerate(b.fields):
                if f.type != REST:
                    continue
                last = bi == len(blocks) - 1 and fi == len(b.fields) - 1
                if not last or b.kind != "header":
                    self.fail(
                        path + ("blocks", bi, "fields", fi, "type"),
                        "a Rest field runs to the end of the message: it must be the last "
                        "field of the message, in a header block",
                    )

    def build_blocks(self, raw_blocks, path, versions, contexts, part_names, owner, allow_parts):
        blocks: list[Block] = []
        scope: dict[str, Field] = {}  # fields of the message (or part) read so far
        attrs: set[str] = set()
        for bi, rb in enumerate(raw_blocks):
            bpath = path + ("blocks", bi)
            kind = rb["type"]
            # A repeat element has its own scope for lengths and conditions; counts come from outside.
            local: dict[str, Field] = dict(scope) if kind != "repeat" else {}
            fields = []
            for fi, rf in enumerate(rb["fields"]):
                fpath = bpath + ("fields", fi)
                f = self.build_field(rf, fpath, versions, contexts, part_names, allow_parts, local)
                if f.name in local:
                    self.fail(fpath + ("field",), f"duplicate field name {f.name!r} in {owner}")
                local[f.name] = f
                fields.append(f)
            if kind == "repeat":
                for key in ("name", "count"):
                    if key not in rb:
                        self.fail(bpath, f"a repeat block needs {key!r}")
                self.check_name(rb["name"], bpath + ("name",))
                counter = scope.get(rb["count"])
                if counter is None:
                    self.fail(
                        bpath + ("count",),
                        f"count {rb['count']!r} must name an earlier field of {owner}",
                    )
                if not counter.is_int or counter.signed or counter.gated:
                    self.fail(
                        bpath + ("count",),
                        f"count {rb['count']!r} must be an ungated unsigned integer field",
                    )
                if len(fields) > 1 and "struct" not in rb:
                    self.fail(
                        bpath, "a repeat block of several fields needs 'struct' (element type name)"
                    )
                if len(fields) == 1 and "struct" in rb:
                    self.fail(
                        bpath + ("struct",),
                        "a repeat block of one field is a plain list; drop 'struct'",
                    )
                if len(fields) == 1 and fields[0].type in part_names:
                    # the targets lay a plain list out as one value per element, not a part
                    self.fail(
                        bpath + ("fields", 0, "type"),
                        f"a repeat block of one field of part {fields[0].type!r} (a plain list "
                        "of parts) is not supported; give the element a second field and a "
                        "'struct'",
                    )
                if rb["name"] in scope or rb["name"] in attrs:
                    self.fail(bpath + ("name",), f"duplicate field name {rb['name']!r} in {owner}")
                attrs.add(rb["name"])
            else:
                for key in ("name", "count", "struct"):
                    if key in rb:
                        self.fail(bpath + (key,), f"{key!r} is only for repeat blocks")
                scope = local
            if kind == "tagged":
                head = fields[0]
                if head.type != BYTE1 or not head.choices:
                    self.fail(
                        bpath + ("fields", 0),
                        "a tagged block starts with a Byte1 field with choices",
                    )
                if "optional" not in rb:
                    self.fail(bpath, "a tagged block must say whether it is optional")
            elif "optional" in rb:
                self.fail(bpath + ("optional",), "'optional' is only for tagged blocks")
            blocks.append(
                Block(
                    kind=kind,
                    fields=tuple(fields),
                    description=rb.get("description", "").strip(),
                    name=rb.get("name"),
                    struct=rb.get("struct"),
                    count=rb.get("count"),
                    optional=rb.get("optional", False),
                    line=self.lines.get(bpath, 0),
                )
            )
        return tuple(blocks)

    def build_field(self, rf, fpath, versions, contexts, part_names, allow_parts, earlier):
        name, ftype = rf["field"], rf["type"]
        self.check_name(name, fpath + ("field",))
        if ftype not in SCALAR_TYPES:
            if ftype not in part_names:
                self.fail(fpath + ("type",), f"unknown type {ftype!r}")
            if ftype not in allow_parts:
                self.fail(
                    fpath + ("type",), f"part {ftype!r} cannot be used here (parts do not nest)"
                )
        is_int = ftype in INT_SIZES
        if is_int != ("signed" in rf):
            self.fail(
                fpath + ("type" if is_int else "signed",),
                "IntN fields must say 'signed'" if is_int else "'signed' is only for IntN fields",
            )
        if ftype == BYTE1:
            if ("value" in rf) == ("choices" in rf):
                self.fail(fpath, "a Byte1 field has exactly one of 'value' or 'choices'")
        else:
            for key in ("value", "choices"):
                if key in rf:
                    self.fail(fpath + (key,), f"{key!r} is only for Byte1 fields")
        if "value" in rf and any(k in rf for k in ("since", "when", "only_if")):
            self.fail(fpath, "a literal cannot be gated")
        if (ftype == BYTEN) != ("length" in rf):
            self.fail(
                fpath + ("length" if "length" in rf else "type",),
                "Byten needs 'length'" if ftype == BYTEN else "'length' is only for Byten fields",
            )
        if "length" in rf:
            ref = earlier.get(rf["length"])
            if ref is None:
                self.fail(
                    fpath + ("length",),
                    f"length {rf['length']!r} must name an earlier field of the same block scope",
                )
            if not ref.is_int or ref.signed:
                self.fail(
                    fpath + ("length",),
                    f"length {rf['length']!r} must be an unsigned integer field",
                )
            # A length is on the wire exactly when the bytes it measures are.
            gates = (
                _gate_since(rf.get("since", versions[0]), versions),
                rf.get("when"),
                (rf["only_if"]["field"], tuple(rf["only_if"]["in"])) if "only_if" in rf else None,
            )
            ref_gates = (
                ref.since,
                ref.when,
                (ref.only_if.field, ref.only_if.choices) if ref.only_if else None,
            )
            if gates != ref_gates:
                self.fail(
                    fpath + ("length",),
                    f"length {rf['length']!r} must have the same since/when/only_if as {name!r}",
                )
        since = rf.get("since", versions[0])
        if since not in versions:
            self.fail(
                fpath + ("since",),
                f"{self.version_name} {since} is not one of its values {list(versions)}",
            )
        since = _gate_since(since, versions)
        if "when" in rf and rf["when"] not in contexts:
            self.fail(fpath + ("when",), f"unknown context {rf['when']!r}")
        only_if = None
        if "only_if" in rf:
            ref = earlier.get(rf["only_if"]["field"])
            if ref is None or not ref.choices:
                self.fail(
                    fpath + ("only_if", "field"),
                    "only_if must name an earlier Byte1 field with choices",
                )
            allowed = {c for c, _ in ref.choices}
            for j, c in enumerate(rf["only_if"]["in"]):
                if c not in allowed:
                    self.fail(
                        fpath + ("only_if", "in", j), f"{c!r} is not a choice of {ref.name!r}"
                    )
            only_if = OnlyIf(ref.name, tuple(rf["only_if"]["in"]))
        for c, cname in (rf.get("choices") or {}).items():
            if ord(c) > 255:
                self.fail(fpath + ("choices", c), "a Byte1 choice must be a single byte")
        if "value" in rf and ord(rf["value"]) > 255:
            self.fail(fpath + ("value",), "a Byte1 literal must be a single byte")
        return Field(
            name=name,
            type=ftype,
            description=rf["description"].strip(),
            signed=rf.get("signed"),
            value=rf.get("value"),
            choices=tuple((rf.get("choices") or {}).items()),
            length=rf.get("length"),
            since=since,
            when=rf.get("when"),
            only_if=only_if,
            semantic=rf.get("semantic"),
            line=self.lines.get(fpath, 0),
        )


def load_spec(path: str | Path, display_name: str | None = None) -> Spec:
    """Read, check and model a spec file. Raises SpecError (file:line:column, hint)."""
    path = Path(path)
    name = display_name or path.as_posix()
    raw_bytes, text = yamlsafe.read_text(path, name)
    raw, positions = yamlsafe.load(text, name)
    if not isinstance(raw, dict):
        raise SpecError(
            name,
            1,
            (),
            "the spec must be a mapping of the keys title, doc_url, "
            "targets, parameters, contexts, messages and parts",
        )
    checker = _Checker(name, positions)
    checker.check_schema(raw)
    checker.check_text(raw)
    spec = checker.build(raw, name, hashlib.sha256(raw_bytes).hexdigest())
    # The sample session (for the Kaitai Web IDE) is a file beside the spec.
    from .sample import load_sample

    return dataclasses.replace(spec, sample=load_sample(spec, path))
