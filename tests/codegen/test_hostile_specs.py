"""Hostile specs: nothing executes, nothing is lost, every error exits 2 with a location.

A spec is the source of code here, and specs come from pull requests, forks and vendors. These
tests feed the generator specs with hostile text in every text field and with broken structure,
and check that it only ever exits 0 (every output then parses in its language, the hostile
text shows as text) or 2 (file:line:column and a hint), never runs the text, never exits 1.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from codegen.__main__ import main
from tests.support import kaitai as K

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "pgoutput.yaml"
SAMPLE = ROOT / "spec" / "pgoutput.sample.yaml"
RAW = yaml.safe_load(SPEC.read_text())
# the real specs, mutated by the hypothesis tests: (spec file, its sample)
REAL = {
    "pgoutput": (SPEC, SAMPLE),
    "replication": (ROOT / "spec" / "replication.yaml", ROOT / "spec" / "replication.sample.yaml"),
}
DOCS = {name: yaml.safe_load(path.read_text()) for name, (path, _) in REAL.items()}


def payloads(sentinel: Path) -> list[str]:
    """Text that would run code, end a string or a comment, or add markup, if it were pasted
    into a target unescaped. Running any of it creates `sentinel`."""
    touch = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    return [
        f'"""\n{touch}\n"""',
        f"'''\n{touch}\n'''",
        f"\\\n{touch}",
        "x\\",
        f"*/ int {sentinel.stem}; /*",
        f"\n{touch}  # \n",
        "{{ 7 * 7 }} {% raw %} {#",
        "<script>alert(1)</script> <img src=x onerror=alert(1)>",
        "[click](javascript:alert(1)) | a | b |\n# heading\n- item\n1. one\n---",
        "`code` *em* _em_ ~~s~~ \\*",
        "a: b\n  - c: d\n&anchor *alias !!python/object:os.system ---\n...",
        "line\u2028separator\u2029paragraph \t tab",
        "emoji \U0001f600 combining e\u0301 rtl \u05d0\u05d1",
        "x" * 3000,
    ]


def text_slots(raw: dict) -> list[tuple]:
    """Paths of every free-text value in a spec document."""
    slots = [("title",)]
    for kind in ("parameters", "contexts"):
        slots += [(kind, i, "description") for i in range(len(raw[kind]))]
    for kind in ("messages", "parts"):
        for i, item in enumerate(raw[kind]):
            slots.append((kind, i, "description"))
            for bi, block in enumerate(item["blocks"]):
                if "description" in block:
                    slots.append((kind, i, "blocks", bi, "description"))
                for fi, _ in enumerate(block["fields"]):
                    slots.append((kind, i, "blocks", bi, "fields", fi, "description"))
    return slots


SLOTS = text_slots(RAW)
SLOTS_OF = {name: text_slots(doc) for name, doc in DOCS.items()}


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _copy(name: str = "pgoutput"):
    return yaml.safe_load(REAL[name][0].read_text())


def generate(tmp_path: Path, doc: dict, capsys, name: str = "pgoutput") -> tuple[int, Path, str]:
    spec_path, sample = REAL[name]
    spec = tmp_path / spec_path.name
    spec.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1 << 20))
    shutil.copy(sample, tmp_path / sample.name)
    out = tmp_path / "out"
    rc = main(["generate", "--spec", str(spec), "--out", str(out)])
    return rc, out, capsys.readouterr().err


def check_outputs(out: Path, texts: list[str]) -> None:
    """Every output parses in its language and shows the hostile text as text."""
    from markdown_it import MarkdownIt

    for path in out.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
    md = MarkdownIt("commonmark")
    shown = ""
    for path in out.rglob("*.md"):
        page = md.render(path.read_text())
        for tag in ("<script", "<img", 'href="javascript'):
            assert tag not in page, (path, page[max(0, page.find(tag) - 300) : page.find(tag) + 80])
        shown += " " + html.unescape(re.sub(r"<[^>]+>", "", page))
    shown = " ".join(shown.split())
    for text in texts:
        assert " ".join(text.split()) in shown, text[:60]


# Each example renders every target (a few seconds): no shrinking, the draws are printed.
QUICK = dict(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


@settings(max_examples=30, **QUICK)
@given(data=st.data())
def test_hostile_text_in_any_field(tmp_path_factory, capsys, data):
    tmp_path = tmp_path_factory.mktemp("hostile")
    sentinel = tmp_path / "SENTINEL"
    name = data.draw(st.sampled_from(sorted(REAL)))
    doc = _copy(name)
    chosen = data.draw(
        st.lists(st.sampled_from(SLOTS_OF[name]), min_size=1, max_size=6, unique=True)
    )
    texts = []
    for slot in chosen:
        text = data.draw(st.one_of(st.sampled_from(payloads(sentinel)), st.text(min_size=1)))
        _set(doc, slot, text)
        texts.append(text)
    rc, out, err = generate(tmp_path, doc, capsys, name)
    assert not sentinel.exists(), "spec text ran as code"
    assert rc in (0, 2), err
    if rc == 2:
        assert re.match(r"\S+:\d+:\d+: ", err.removeprefix("spec error: ")), err
        assert "hint:" in err and "Traceback" not in err
        return
    check_outputs(out, [t for t in texts if t.strip()])


def test_a_title_ending_in_a_hash_keeps_it(tmp_path, capsys):
    """Found by the test above: a heading's trailing " #" is Markdown's closing sequence and
    vanished from the docs unless escaped."""
    doc = _copy("pgoutput")
    doc["title"] = "\nimport os  # \n"
    rc, out, err = generate(tmp_path, doc, capsys)
    assert rc == 0, err
    check_outputs(out, [doc["title"]])


PROBES = {  # run the generated package: a round trip, and its help text (the docstrings)
    "pgoutput": "import pgoutput_codec as p; m = p.Begin(final_lsn=1, commit_time=2, xid=3); "
    "assert p.decode(p.encode(m, protocol_version=1), protocol_version=1) == m; "
    "help(p.Begin); help(p)",
    "replication": "import replication_codec as p; m = p.PrimaryStatusRequest(client_time=1); "
    "assert p.decode(p.encode(m, server_version=19), server_version=19) == m; "
    "help(p.XLogData); help(p)",
}
PACKAGES = {"pgoutput": "pgoutput_codec", "replication": "replication_codec"}


@pytest.mark.parametrize("name", sorted(REAL))
def test_every_field_hostile_at_once_compiles_everywhere(tmp_path, capsys, name):
    """All text fields at once, then the expensive checks: the package imports and runs, the
    C accelerator compiles, ksc compiles both .ksy files without warnings."""
    sentinel = tmp_path / "SENTINEL"
    doc = _copy(name)
    texts = payloads(sentinel)
    for i, slot in enumerate(SLOTS_OF[name]):
        _set(doc, slot, texts[i % len(texts)])
    rc, out, err = generate(tmp_path, doc, capsys, name)
    assert rc == 0, err
    assert not sentinel.exists()
    check_outputs(out, texts[: len(SLOTS_OF[name])])
    env = {"PYTHONPATH": f"{out}:{ROOT}", "PGOUTPUT_CODEC_PURE": "1", "REPLICATION_CODEC_PURE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBES[name]], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert not sentinel.exists()
    if shutil.which("cc"):
        cc = subprocess.run(
            [
                "cc",
                "-fsyntax-only",
                "-Wall",
                "-Werror",
                f"-I{sysconfig.get_paths()['include']}",
                f"-I{ROOT / 'pgcdc' / 'runtime'}",
                str(out / PACKAGES[name] / "_speedups.c"),
            ],
            capture_output=True,
            text=True,
        )
        assert cc.returncode == 0, cc.stderr
    ksy = sorted((out / "kaitai").glob("*.ksy"))
    assert len(ksy) == 2
    K.ksc(ksy, tmp_path / "ksc")  # raises on any error or warning


# -- structure: whatever is broken, exit 2 with a location ------------------------------------
def _paths(doc, path=()):
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, path + (i,))


PATHS_OF = {name: [p for p in _paths(doc) if p] for name, doc in DOCS.items()}
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.text(max_size=8),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=40, **QUICK)
@given(data=st.data())
def test_broken_structure_exits_2(tmp_path_factory, capsys, data):
    tmp_path = tmp_path_factory.mktemp("broken")
    name = data.draw(st.sampled_from(sorted(REAL)))
    doc = _copy(name)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(PATHS_OF[name]))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["delete", "replace", "duplicate"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "duplicate" and isinstance(parent, list):
                parent.append(parent[path[-1]])
            else:
                parent[path[-1]] = data.draw(JUNK)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    rc, _, err = generate(tmp_path, doc, capsys, name)  # a generator bug raises here
    assert rc in (0, 2), err
    if rc == 2:
        assert "hint:" in err and "Traceback" not in err


# -- the cases the issue names ----------------------------------------------------------------
def _run(tmp_path, text, capsys, name="bad.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    rc = main(["check", "--spec", str(path), "--out", str(tmp_path / "out")])
    return rc, capsys.readouterr().err


def test_alias_bomb_is_refused_fast_and_small(tmp_path, capsys):
    """A billion-laughs document (10^9 leaves when expanded) is refused at its first anchor."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    tracemalloc.start()
    start = time.perf_counter()
    rc, err = _run(tmp_path, "\n".join(levels) + "\n", capsys)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rc == 2 and "aliases and anchors are not allowed" in err and ":1:5:" in err, err
    assert elapsed < 1.0 and peak < 100 * 2**20, (elapsed, peak)
    print(
        f"alias bomb of 10^9 leaves: refused in {elapsed * 1000:.1f} ms, peak {peak / 2**20:.2f} MiB"
    )


CASES = [
    (
        "duplicate-key",
        SPEC.read_text().replace("title:", "title: once\ntitle:", 1),
        ["duplicate key 'title'", "first at line"],
    ),
    (
        "not-utf8",
        SPEC.read_bytes().replace(b"Opens a transaction", b"Opens a \xff transaction", 1),
        ["not UTF-8", "byte offset"],
    ),
    (
        "name-with-newline",
        SPEC.read_text().replace("field: final_lsn", 'field: "final_lsn\\n"', 1),
        ["not a plain identifier"],
    ),
    (
        "nul-in-description",
        SPEC.read_text().replace("Opens a transaction", "Opens a \x00", 1),
        ["U+0000"],
    ),
    (
        "bidi-override",
        SPEC.read_text().replace("Opens a transaction", "Opens \u202e a", 1),
        ["U+202E"],
    ),
    (
        "escaped-nul",
        SPEC.read_text()
        .replace("description: Opens a transaction", 'description: "Opens a \\0 transaction', 1)
        .replace("belongs to it.\n", 'belongs to it."\n', 1),
        ["U+0000", "from an escape"],
    ),
    ("yaml-syntax", SPEC.read_text().replace("title: ", "title: [", 1), ["invalid YAML"]),
    (
        "reserved-field",
        SPEC.read_text().replace("field: final_lsn", "field: short", 1),
        ["reserved"],
    ),
    ("class-clash", SPEC.read_text().replace("- name: Begin\n", "- name: Struct\n", 1), ["clash"]),
    (
        "hostile-doc-url",
        re.sub(
            r"doc_url: .*", "doc_url: 'https://x.org/ \"onload=alert(1)'", SPEC.read_text(), count=1
        ),
        ["not a plain https URL"],
    ),
    ("too-big", SPEC.read_text() + "#" * (1 << 20), ["at most"]),
    ("not-a-mapping", "- just\n- a list\n", ["must be a mapping"]),
]


@pytest.mark.parametrize("name,text,words", CASES, ids=[c[0] for c in CASES])
def test_named_bad_specs_exit_2_with_a_location(tmp_path, capsys, name, text, words):
    rc, err = _run(tmp_path, text, capsys)
    assert rc == 2, err
    assert re.match(r"spec error: \S*bad\.yaml:\d+:\d+: ", err), err
    assert "hint:" in err
    for w in words:
        assert w in err, err


def test_missing_spec_file_exits_2(tmp_path, capsys):
    rc = main(["generate", "--spec", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.yaml:1:1:" in err and "cannot read" in err


def test_a_sample_that_no_longer_fits_the_spec_exits_2(tmp_path, capsys):
    """The sample session names choices of the spec: change one and the sample is refused."""
    doc = _copy()
    update = next(m for m in doc["messages"] if m["name"] == "Update")
    assert update["blocks"][1]["fields"][0]["choices"] == {"K": "key", "O": "old"}
    update["blocks"][1]["fields"][0]["choices"] = {"Q": "key", "O": "old"}  # the sample uses K
    rc, _, err = generate(tmp_path, doc, capsys)
    assert rc == 2 and "pgoutput.sample.yaml:" in err, err


def test_out_never_loses_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "out"
    mine = out / "pgoutput_codec" / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    clash = out / "docs" / "pgoutput_codec" / "README.md"
    clash.parent.mkdir(parents=True)
    clash.write_text("my own readme")
    assert main(["generate", "--spec", str(SPEC), "--out", str(out)]) == 2
    assert "was not written by the generator" in capsys.readouterr().err
    assert clash.read_text() == "my own readme" and mine.read_text() == "mine"
    assert not (out / "pgoutput_codec" / "_decoder.py").exists()  # nothing half-written
    clash.unlink()
    assert main(["generate", "--spec", str(SPEC), "--out", str(out)]) == 0
    assert mine.read_text() == "mine"
    # a stale generated file goes; the user's file stays
    (out / ".codegen" / "pgoutput_codec.files").write_text(
        (out / ".codegen" / "pgoutput_codec.files").read_text() + "pgoutput_codec/old.py\n"
    )
    (out / "pgoutput_codec" / "old.py").write_text("# generated once")
    assert main(["generate", "--spec", str(SPEC), "--out", str(out)]) == 0
    assert not (out / "pgoutput_codec" / "old.py").exists() and mine.read_text() == "mine"


def test_a_failed_render_leaves_the_previous_output(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert main(["generate", "--spec", str(SPEC), "--out", str(out)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def broken(files):
        raise RuntimeError("formatter failed")

    monkeypatch.setattr("codegen.render.ruff_format", broken)
    with pytest.raises(RuntimeError):
        main(["generate", "--spec", str(SPEC), "--out", str(out)])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
