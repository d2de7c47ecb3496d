"""The repository root and the tables of the two-phase workload that tests/apply/conftest.py's
``runs`` captures (test_apply_runs, test_delta_apply, test_delta_s3)."""

from __future__ import annotations

from pathlib import Path
import pytest

pq = pytest.importorskip("pyarrow.parquet")
pc = pytest.importorskip("pyarrow.compute")


REPO = Path(__file__).resolve().parents[2]


TABLES = ("acct", "bag", "note")
