"""Helpers shared by the tests (from apply/test_apply_runs.py)."""

from __future__ import annotations

from pathlib import Path
import pytest

pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")


REPO = Path(__file__).resolve().parents[2]


TABLES = ("acct", "bag", "note")
