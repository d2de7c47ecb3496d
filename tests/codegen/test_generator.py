"""The generator: committed output is fresh, output is reproducible, and a new protocol version
is a spec edit only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main
from codegen.loader import load_spec
from codegen.render import render_all

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "pgoutput.yaml"


def test_generated_is_up_to_date(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["check"]) == 0, capsys.readouterr().out


@pytest.mark.slow  # renders every spec again in a subprocess
def test_check_reports_drift_and_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "gen"
    assert main(["generate", "--out", str(out)]) == 0
    target = out / "pgoutput_codec" / "_decoder.py"
    target.write_text(target.read_text() + "# hand edit\n")
    capsys.readouterr()
    assert main(["check", "--out", str(out)]) == 1
    report = capsys.readouterr().out
    assert "-# hand edit" in report
    assert "make generate" in report


def test_check_exits_2_on_spec_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.read_text().replace("value: B\n", "value: C\n", 1))
    assert main(["check", "--spec", str(bad), "--out", str(tmp_path)]) == 2
    assert "duplicate tag" in capsys.readouterr().err


def test_rendering_is_reproducible():
    spec = load_spec(SPEC, display_name="spec/pgoutput.yaml")
    first, second = render_all(spec), render_all(spec)
    assert first == second
    header = first["pgoutput_codec/_decoder.py"].splitlines()[0]
    assert "spec/pgoutput.yaml" in header and "DO NOT EDIT" in header
    # the hash is recorded once, in the package, so a spec edit does not touch every header
    assert f'SPEC_SHA256 = "{spec.source_hash}"' in first["pgoutput_codec/__init__.py"]


@pytest.mark.slow  # renders every spec again in a subprocess
@pytest.mark.parametrize("seed", ["1", "2", "3"])
def test_output_does_not_depend_on_hash_seed(seed):
    """Set and dict orders vary with PYTHONHASHSEED; the rendered files must not."""
    env = dict(os.environ, PYTHONHASHSEED=seed)
    proc = subprocess.run(
        [sys.executable, "-m", "codegen", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


V5_PROBE = r"""
import json, sys
import pgoutput_codec as pgc
out = {}
for pv in (1, 2, 3, 4, 5):
    kw = dict(protocol_version=pv, streaming="on" if pv >= 2 else "off")
    m = pgc.Begin(final_lsn=1, commit_time=2, xid=3, **({"v5_flags": 7} if pv >= 5 else {}))
    out[pv] = pgc.encode(m, **kw).hex()
    assert pgc.decode(bytes.fromhex(out[pv]), **kw) == m
print(json.dumps(out))
"""


@pytest.mark.slow  # renders every spec again in a subprocess
def test_protocol_v5_is_a_spec_edit_only(tmp_path):
    """Gate a new Begin field on `since: 5`: v5 carries it, v1-v4 bytes do not change."""
    import pgoutput_codec as pgc

    text = SPEC.read_text()
    text = text.replace("    values: [1, 2, 3, 4]\n", "    values: [1, 2, 3, 4, 5]\n", 1)
    anchor = "            description: Transaction id.\n\n  - name: Message\n"
    assert anchor in text
    text = text.replace(
        anchor,
        (
            "            description: Transaction id.\n"
            "          - field: v5_flags\n            type: Int16\n            signed: false\n"
            "            since: 5\n            description: A field that only protocol 5 sends.\n"
            "\n  - name: Message\n"
        ),
        1,
    )
    spec5 = tmp_path / "pgoutput.yaml"
    spec5.write_text(text)
    sample = SPEC.with_name("pgoutput.sample.yaml")
    (tmp_path / sample.name).write_text(sample.read_text())
    out = tmp_path / "gen"
    proc = subprocess.run(
        [sys.executable, "-m", "codegen", "generate", "--spec", str(spec5), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(out), str(ROOT)]))
    probe = subprocess.run(
        [sys.executable, "-c", V5_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    import json

    got = {int(k): bytes.fromhex(v) for k, v in json.loads(probe.stdout).items()}
    begin = pgc.Begin(final_lsn=1, commit_time=2, xid=3)
    for pv in (1, 2, 3, 4):
        assert got[pv] == pgc.encode(begin, protocol_version=pv), pv
    assert got[5] == got[4] + b"\x00\x07"


@pytest.mark.parametrize(
    "name", ["docs/pgoutput_codec/README.md", "docs/replication_codec/README.md"]
)
def test_docs_are_generated(name):
    assert (ROOT / "generated" / name).exists()
