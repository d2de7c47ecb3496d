"""Reading a spec's YAML safely: bounded size, strict UTF-8, no control characters, no
aliases or anchors (an alias bomb expands into billions of nodes), no duplicate keys (the second
would silently win), only the safe YAML types. Every refusal is a SpecError with line and
column."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .errors import SpecError

MAX_SPEC_BYTES = 1 << 20  # the real specs are about 30 kB
# C0 controls other than tab and newline, DEL, C1 controls, and the bidirectional overrides
# that make text display differently from what it is
_FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _line_col(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def read_text(path: Path, name: str) -> tuple[bytes, str]:
    """The file's bytes and text, or a SpecError saying why not."""
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                name,
                1,
                (),
                f"the file is {size:,} bytes; a spec may have at most {MAX_SPEC_BYTES:,}",
                hint="a spec this large is not a spec",
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(
            name,
            1,
            (),
            f"cannot read the file: {exc.strerror or exc}",
            hint="check the path given to --spec",
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(
            name,
            line,
            (),
            f"not UTF-8: byte 0x{raw[exc.start]:02x} at byte offset {exc.start}",
            column=col,
            hint="save the file as UTF-8",
        ) from None
    bad = _FORBIDDEN.search(text)
    if bad:
        line, col = _line_col(text, bad.start())
        raise SpecError(
            name,
            line,
            (),
            f"control or bidirectional character U+{ord(bad.group()):04X}",
            column=col,
            hint="spec text is plain text: remove the character",
        )
    return raw, text


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, anchors and duplicate keys, and records where every
    node of the document is (YAML path -> (line, column))."""

    file = "<spec>"

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise SpecError(
                self.file,
                mark.line + 1,
                (),
                "YAML aliases and anchors are not allowed in a spec",
                column=mark.column + 1,
                hint="write the repeated part out; an alias can expand a small file "
                "into a huge document",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                raise SpecError(
                    self.file,
                    key_node.start_mark.line + 1,
                    (),
                    "a mapping key must be a plain value",
                    column=key_node.start_mark.column + 1,
                ) from None
            if first is not None:
                raise SpecError(
                    self.file,
                    key_node.start_mark.line + 1,
                    (),
                    f"duplicate key {key!r}: first at line {first.line + 1}, "
                    f"again at line {key_node.start_mark.line + 1}",
                    column=key_node.start_mark.column + 1,
                    hint="keep one of the two; YAML would silently use the second",
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def load(text: str, name: str) -> tuple[object, dict[tuple, tuple[int, int]]]:
    """The document and a map from YAML path to (line, column)."""
    loader = _Loader(text)
    loader.file = name
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecError(
            name,
            mark.line + 1 if mark else 1,
            (),
            f"invalid YAML: {exc.problem}",
            column=mark.column + 1 if mark else 1,
            hint="fix the YAML syntax at this place",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(name, 1, (), f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    positions: dict[tuple, tuple[int, int]] = {}

    def walk(node, path):
        positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                walk(v, path + (k.value,))
                positions[path + (k.value,)] = (k.start_mark.line + 1, k.start_mark.column + 1)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    if root is not None:
        walk(root, ())
    _check_values(data, (), positions, name)
    return data, positions


def _check_values(value, path: tuple, positions: dict, name: str) -> None:
    """Escapes in quoted YAML ("\0", "\x1b") make characters the raw-text check never saw:
    check every parsed string and key too."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(k, path + (k,), positions, name)
            _check_values(v, path + (k,), positions, name)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, path + (i,), positions, name)
    elif isinstance(value, str):
        bad = _FORBIDDEN.search(value)
        if bad:
            line, col = positions.get(path, (1, 1))
            raise SpecError(
                name,
                line,
                path,
                f"control or bidirectional character U+{ord(bad.group()):04X} (from an escape)",
                column=col,
                hint="spec text is plain text: remove the escape",
            )
