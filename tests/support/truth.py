"""The server's rows as to_jsonb gives them against apply's tables read back (Parquet or Delta):
tests/apply/."""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import math
from decimal import Decimal
import pytest
from tests.support.delta import read_table

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


META = {"_pg_text", "_commit_lsn", "_tx_ordinal"}


def _norm(mine, truth):
    """A Parquet value in the server's to_jsonb form (guided by the truth's JSON type)."""
    if isinstance(mine, str) and isinstance(truth, (Decimal, int)) and not isinstance(truth, bool):
        return Decimal(mine)
    if (
        isinstance(mine, str)
        and isinstance(truth, (dict, list))
        or (isinstance(mine, str) and truth is None and mine == "null")
    ):
        return json.loads(mine, parse_float=Decimal)
    if isinstance(mine, bytes):
        return "\\x" + mine.hex()
    if isinstance(mine, dt.datetime):
        if mine.tzinfo is not None:
            return mine.astimezone(dt.timezone.utc).isoformat()
        return mine.isoformat()
    if isinstance(mine, dt.date):
        return mine.isoformat()
    if isinstance(mine, float):
        if math.isnan(mine):
            return "NaN"
        if math.isinf(mine):
            return "Infinity" if mine > 0 else "-Infinity"
        return Decimal(repr(mine))
    if isinstance(mine, list):
        t = truth if isinstance(truth, list) and len(truth) == len(mine) else [None] * len(mine)
        return [_norm(m, x) for m, x in zip(mine, t)]
    return mine


def _special(text):
    if text[:1] in "[{":
        return json.loads(text, parse_float=Decimal)
    return text


def _canon(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)


def _parquet_rows(path, truth_rows) -> list[str]:
    rows = read_table(path).to_pylist()
    # pair columns' JSON types with any truth row (types agree across rows but for NULLs)
    sample = {}
    for r in truth_rows:
        for k, v in r.items():
            if v is not None and k not in sample:
                sample[k] = v
    out = []
    for r in rows:
        special = dict(r.get("_pg_text") or {})
        row = {}
        for k, v in r.items():
            if k in META:
                continue
            row[k] = _special(special[k]) if k in special else _norm(v, sample.get(k))
        out.append(_canon(row))
    return sorted(out)


def _truth(conn, table) -> tuple[list[str], list[dict]]:
    rows = [
        json.loads(r[0], parse_float=Decimal)
        for r in conn.execute(f"SELECT to_jsonb(t)::text FROM {table} t").fetchall()
    ]
    canon = []
    for r in rows:
        canon.append(
            _canon({k: (Decimal(repr(v)) if isinstance(v, float) else v) for k, v in r.items()})
        )
    return sorted(canon), rows


def _rows_of(table: pa.Table, truth_rows) -> list[str]:
    """A pyarrow table in the server's to_jsonb form (through test_apply_postgres' rules)."""
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(table, f"{tmp}/t.parquet")
        return _parquet_rows(f"{tmp}/t.parquet", truth_rows)
