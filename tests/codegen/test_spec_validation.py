"""One bad spec per validation rule: the error must name the file, the line and the YAML path."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from codegen.errors import SpecError
from codegen.loader import load_schema, load_spec

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

SPEC = Path(__file__).resolve().parents[2] / "spec" / "pgoutput.yaml"
TEXT = SPEC.read_text()


def _mutate(old: str, new: str, count: int = 1) -> str:
    assert TEXT.count(old) >= count, old
    return TEXT.replace(old, new, count)


# (id, old text, new text, marker on the offending line, expected YAML path, words)
RULES = [
    (
        "unknown-key",
        "          - field: final_lsn\n",
        "          - field: final_lsn\n            colour: red\n",
        "colour: red",
        ("messages", 0, "blocks", 0, "fields", 1, "colour"),
        "unknown key 'colour'",
    ),
    (
        "unknown-block-key",
        "        name: columns\n        struct: RelationColumn\n",
        "        name: columns\n        stuct: RelationColumn\n",
        "stuct:",
        ("messages", 4, "blocks", 1, "stuct"),
        "unknown key 'stuct'",
    ),
    (
        "count-missing",
        "        count: num_relation_oids",
        "        count: num_relation",
        "count: num_relation",
        ("messages", 9, "blocks", 1, "count"),
        "earlier field",
    ),
    (
        "length-later",
        "            length: len_content",
        "            length: content_after",
        "length: content_after",
        ("messages", 1, "blocks", 0, "fields", 6, "length"),
        "earlier field",
    ),
    (
        "duplicate-tag",
        "            value: C\n",
        "            value: B\n",
        "value: B",
        ("messages", 2, "blocks", 0, "fields", 0, "value"),
        "duplicate tag 'B'",
    ),
    (
        "message-name-injection",
        "  - name: Begin\n",
        '  - name: "Begin; import os"\n',
        "Begin; import os",
        ("messages", 0, "name"),
        "not a plain identifier",
    ),
    (
        "field-name-injection",
        "          - field: final_lsn\n",
        '          - field: "final_lsn\\nimport os"\n',
        "import os",
        ("messages", 0, "blocks", 0, "fields", 1, "field"),
        "not a plain identifier",
    ),
    (
        "field-name-keyword",
        "          - field: origin_name\n",
        "          - field: class\n",
        "field: class",
        ("messages", 3, "blocks", 0, "fields", 2, "field"),
        "reserved",
    ),
    (
        "unknown-type",
        "          - field: origin_name\n            type: String\n",
        "          - field: origin_name\n            type: Strnig\n",
        "type: Strnig",
        ("messages", 3, "blocks", 0, "fields", 2, "type"),
        "unknown type",
    ),
    (
        "int-without-signedness",
        "          - field: xid\n            type: Int32\n            signed: false\n            semantic: xid\n            description: Transaction id.\n",
        "          - field: xid\n            type: Int32\n            semantic: xid\n            description: Transaction id.\n",
        None,
        ("messages", 0, "blocks", 0, "fields", 3, "type"),
        "signed",
    ),
    (
        "since-unknown-version",
        "            since: 4\n",
        "            since: 7\n",
        "since: 7",
        ("messages", 13, "blocks", 0, "fields", 3, "since"),
        "protocol_version 7 is not one of its values [1, 2, 3, 4]",
    ),
    (
        "unknown-context",
        "            when: parallel_streaming\n",
        "            when: parallel\n",
        "when: parallel",
        ("messages", 13, "blocks", 0, "fields", 3, "when"),
        "unknown context",
    ),
    (
        "duplicate-field",
        "          - field: end_lsn\n",
        "          - field: commit_lsn\n",
        None,
        ("messages", 2, "blocks", 0, "fields", 3, "field"),
        "duplicate field name",
    ),
    (
        "length-gated-differently",
        "            length: len_value\n            only_if: {field: kind, in: [t, b]}",
        "            length: len_value\n            only_if: {field: kind, in: [t]}",
        "length: len_value",
        ("parts", 0, "blocks", 1, "fields", 2, "length"),
        "same since/when/only_if",
    ),
    (
        "only-if-bad-choice",
        "            only_if: {field: kind, in: [t, b]}\n            description: Byte length",
        "            only_if: {field: kind, in: [t, x]}\n            description: Byte length",
        "in: [t, x]",
        ("parts", 0, "blocks", 1, "fields", 1, "only_if", "in", 1),
        "not a choice",
    ),
]


RULES += [
    (
        "rest-not-last",
        "          - field: origin_lsn\n            type: Int64\n            signed: false\n",
        "          - field: origin_lsn\n            type: Rest\n",
        "type: Rest",
        ("messages", 3, "blocks", 0, "fields", 1, "type"),
        "must be the last field",
    ),
    (
        "mode-names-unknown-context",
        '      "on": [in_stream]\n',
        '      "on": [in_streem]\n',
        "[in_streem]",
        ("parameters", 1, "values", "on", 0),
        "unknown context 'in_streem'",
    ),
]


RULES += [
    (
        "list-of-parts",
        "          - field: relation_oid\n            type: Int32\n            signed: false\n"
        "            semantic: oid\n            description: OID of one truncated table.\n",
        "          - field: relation_oid\n            type: TupleData\n"
        "            description: OID of one truncated table.\n",
        "type: TupleData",
        ("messages", 9, "blocks", 1, "fields", 0, "type"),
        "a plain list of parts",
    ),
]


@pytest.mark.parametrize("name,old,new,marker,path,words", RULES, ids=[r[0] for r in RULES])
def test_rule(tmp_path, name, old, new, marker, path, words):
    text = _mutate(old, new)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_spec(bad, display_name="bad.yaml")
    err = exc.value
    assert err.file == "bad.yaml"
    assert err.path == path, str(err)
    assert words in str(err)
    if marker is not None:
        start = TEXT.index(old).__index__()
        first = text[:start].count("\n") + 1  # the mutated line range starts here
        expected_line = next(
            i for i, line in enumerate(text.splitlines(), 1) if i >= first and marker in line
        )
        assert err.line == expected_line, str(err)
    assert str(err).startswith(f"bad.yaml:{err.line}:{err.column}: ")
    assert 1 <= err.column <= len(text.splitlines()[err.line - 1]) + 1
    assert "\n  hint: " in str(err)


def test_unsafe_yaml_tags_are_rejected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        TEXT.replace(
            "title: PostgreSQL", "title: !!python/object/apply:os.system ['true']\nx: PostgreSQL", 1
        )
    )
    with pytest.raises(SpecError, match="invalid YAML"):
        load_spec(bad)


def test_real_spec_matches_its_json_schema():
    jsonschema.Draft202012Validator.check_schema(load_schema())
    jsonschema.validate(yaml.safe_load(TEXT), load_schema())


def test_json_schema_is_the_one_editors_see():
    """The spec file points editors at the schema shipped with the generator."""
    assert TEXT.splitlines()[0] == "# yaml-language-server: $schema=../codegen/spec.schema.json"
    assert (
        json.loads((SPEC.parent.parent / "codegen" / "spec.schema.json").read_text())
        == load_schema()
    )
