"""The distribution as a user gets it: build the sdist, build the wheel from the sdist, check
what each holds, install each into a fresh virtualenv, and run the README's Quickstart there,
block by block, as pasted. The table state the Quickstart's Spark step writes must equal the
demo server's table.

The virtualenv gets the Quickstart's extras once (from the wheel, so pip resolves the
dependencies as a user's would); each artifact is then installed into it in turn, with no
other copy of pgcdc on its path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CODECS = ("pgoutput_codec", "replication_codec")


def quickstart_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README's Quickstart section."""
    text = README.read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def install_block_extras(blocks) -> str:
    """The extras the README's install line asks for, e.g. 'postgres,spark,demo'."""
    lang, code = blocks[0]
    found = re.search(r"pip install (?:-q )?'\.\[([a-z,]+)\]'", code)
    assert lang == "sh" and found, f"the Quickstart must start with its pip install: {code!r}"
    return found.group(1)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # sdist first, then the wheel built from the unpacked sdist: the sdist must be complete.
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("pgcdc-*.whl"))
    sdists = list(out.glob("pgcdc-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_wheel_contents(artifacts):
    wheel = artifacts["wheel"]
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {
        "pgcdc",
        *CODECS,
        wheel.name.split("-")[0] + "-" + _version(wheel) + ".dist-info",
    }
    for package in ("pgcdc", *CODECS):
        assert f"{package}/py.typed" in names
    for codec in CODECS:
        assert any(re.fullmatch(rf"{codec}/_speedups\..*\.so", n) for n in names), codec
        kaitai = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{codec}/kaitai/")}
        manifest = (ROOT / "generated/.codegen" / f"{codec}.files").read_text().split()
        expected = {
            m.rsplit("/", 1)[1] for m in manifest if m.endswith((".ksy", ".pgcap", ".pgrcap"))
        }
        assert kaitai == expected and len(expected) == 3
    assert not [n for n in names if n.endswith((".c", ".h"))], "C sources in the wheel"
    # the JVM engine compiles its Java sources on the user's machine: all of them must ship
    java = {n for n in names if n.endswith(".java")}
    in_tree = {str(p.relative_to(ROOT)) for p in (ROOT / "pgcdc").rglob("*.java")} | {
        str(p.relative_to(ROOT / "generated")) for p in (ROOT / "generated").glob("*/jvm/*.java")
    }
    assert java == in_tree and len(in_tree) >= 5, (java, in_tree)
    meta = zipfile.ZipFile(wheel).read(f"pgcdc-{_version(wheel)}.dist-info/METADATA").decode()
    assert "Name: pgcdc" in meta and "License-File: LICENSE" in meta
    for extra in ("postgres", "spark", "demo"):
        assert f"Provides-Extra: {extra}" in meta
    assert re.search(r"Requires-Dist: pyspark<4\.4,>=4\.3; extra == \"spark\"", meta), meta
    entry = zipfile.ZipFile(wheel).read(f"pgcdc-{_version(wheel)}.dist-info/entry_points.txt")
    assert b"pgcdc = pgcdc.cli:main" in entry
    # the interpreter local sessions give Spark's Python processes (runtime.spark.pyworker)
    assert b"pgcdc-spark-python = pgcdc.runtime.spark.pyworker:main" in entry
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files")


def test_sdist_contents(artifacts):
    import tarfile

    with tarfile.open(artifacts["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "setup.py",
        "spec/pgoutput.yaml",
        "spec/replication.yaml",
        "pgcdc/runtime/speedups.h",
        "generated/pgoutput_codec/_speedups.c",
        "generated/.codegen/pgoutput_codec.files",
        "generated/kaitai/pgoutput_capture.ksy",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def _version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, artifacts) -> Path:
    """A fresh virtualenv with the Quickstart's extras, installed from the wheel."""
    home = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    extras = install_block_extras(quickstart_blocks())
    _pip(home, "install", "-q", f"{artifacts['wheel']}[{extras}]")
    _pip(home, "uninstall", "-y", "-q", "pgcdc")  # each test installs its artifact
    return home


def _pip(home: Path, *args: str) -> None:
    proc = subprocess.run(
        [str(home / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(home)
    env["PATH"] = f"{home / 'bin'}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_quickstart(kind, artifacts, venv, tmp_path):
    _pip(venv, "install", "-q", "--no-deps", "--force-reinstall", str(artifacts[kind]))
    env = _env(venv)
    # The package must come from the venv, not from this checkout.
    where = subprocess.run(
        [
            "python",
            "-c",
            "import pgcdc, pgoutput_codec as p; print(pgcdc.__file__, p.speedups_enabled())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv)) and where.split()[1] == "True", where

    blocks = quickstart_blocks()[1:]  # the install block is what this fixture did
    outputs = []
    try:
        for lang, code in blocks:
            if "demo stop" in code:
                _check_state_equals_server(tmp_path, env)
            argv = ["bash", "-e", "-c", code] if lang == "sh" else ["python", "-c", code]
            proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, (
                f"{lang} block failed:\n{code}\n{proc.stdout}\n{proc.stderr}"
            )
            outputs.append(proc.stdout)
            if "pgcdc apply" in code:
                # A normal run prints no Spark warnings.
                assert "WARN" not in proc.stderr, proc.stderr
    finally:
        subprocess.run(
            ["pgcdc", "demo", "stop", "--dir", "demo"], cwd=tmp_path, env=env, capture_output=True
        )
    changes = [json.loads(line) for line in outputs[1].splitlines()]
    assert len(changes) == 3 and {c["op"] for c in changes} == {"c"}
    assert changes[0]["source"]["table"] == "accounts"
    assert not (tmp_path / "demo" / "demo.json").exists()


def _check_state_equals_server(cwd: Path, env) -> None:
    """The Parquet state written by `pgcdc apply` equals the demo server's table, read by
    psycopg from the server (no pgcdc code on that side)."""
    import psycopg
    from psycopg.rows import dict_row

    import pyarrow.parquet as pq

    dsn = subprocess.run(
        ["pgcdc", "demo", "dsn", "--dir", "demo"], cwd=cwd, env=env, capture_output=True, text=True
    ).stdout.strip()
    columns = ("id", "owner", "balance", "opened", "tags", "note")
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM accounts").fetchall()
    server = {row["id"]: row for row in rows}
    table = pq.read_table(cwd / "demo" / "state" / "public.accounts").to_pylist()
    state = {row["id"]: {c: row[c] for c in columns} for row in table}
    assert len(server) > 900
    assert state == server
