"""examples/spark_capture_to_parquet.py as a user runs it: one Parquet table per message type
the capture holds (no empty directories), row counts as the capture's manifest recorded them,
timestamps as INT64 microseconds (not INT96), and no Spark warnings on a normal run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "captures"


def _capture() -> dict:
    files = json.loads((CAPTURES / "manifest.json").read_text())["files"]
    # The richest one: protocol 4, parallel streaming, two-phase, messages.
    return max(files, key=lambda f: (f["protocol_version"], len(f["message_counts"])))


def test_example_job_writes_clean_parquet(tmp_path):
    entry = _capture()
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'generated'}"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "spark_capture_to_parquet.py")]
        + [str(CAPTURES / entry["path"]), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not re.search(r"\bWARN(ING)?\b", proc.stderr), proc.stderr

    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    for d in out.rglob("*"):
        if d.is_dir():
            assert any(d.iterdir()), f"empty directory {d}"
    expected = entry["message_counts"]
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", t).lower(): n for t, n in expected.items()}
    snake["type_message"] = snake.pop("type", 0)  # Spark's struct name for the Type message
    got = {d.name: pq.read_table(d).num_rows for d in dirs}
    assert got == {k: v for k, v in snake.items() if v}

    timestamps = 0
    for d in dirs:
        for f in d.glob("*.parquet"):
            schema = pq.ParquetFile(f).schema
            for i in range(len(schema)):
                col = schema.column(i)
                assert col.physical_type != "INT96", f"{f.name}: {col.path} is INT96"
                if col.logical_type.type == "TIMESTAMP":
                    assert col.physical_type == "INT64"
                    timestamps += 1
    assert timestamps > 0
