"""Readers of the Delta Lake tables pgcdc apply writes, independent of pgcdc's own code:
delta-rs (``deltalake``) and DuckDB's delta extension (loaded from the ``duckdb-ext-delta``
wheel, never downloaded)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
import pytest


def is_delta(path) -> bool:
    return (Path(path) / "_delta_log").is_dir()


def read_table(path, version: int | None = None):
    """A table's current rows (a pyarrow Table): delta-rs for a Delta table, else pyarrow
    over the (parquet layout's) directory."""
    if is_delta(path):
        from deltalake import DeltaTable

        return DeltaTable(str(path), version=version).to_pyarrow_table()
    import pyarrow.parquet as pq

    return pq.read_table(path)


def delta_extension() -> str:
    """The path of DuckDB's delta extension as the duckdb-ext-delta wheel installs it."""
    for f in importlib.metadata.files("duckdb-ext-delta") or ():
        if f.name == "delta.duckdb_extension":
            return str(f.locate())
    pytest.fail("duckdb-ext-delta installs no delta.duckdb_extension")


def duckdb_connect():
    """A DuckDB connection with the delta extension loaded from the wheel (offline)."""
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute(f"LOAD '{delta_extension()}'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def duckdb_table(path, con=None):
    """A table's current rows read by DuckDB's delta_scan, as a pyarrow Table."""
    con = con or duckdb_connect()
    return con.execute("SELECT * FROM delta_scan(?)", [str(path)]).fetch_arrow_table()
