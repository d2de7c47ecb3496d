"""Typed values: RowLoader.load on 10-column rows (text slot, binary slot), the same rows a
column at a time (RowLoader.load_rows, the chunk path of change events), and dumps_row.

The rows' bytes come from psycopg's own dumpers (text and binary), so they are what a server
sends for these values. ``python -m bench.values_bench`` prints the table.
"""

from __future__ import annotations

import time
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pgoutput_codec as pgc
import psycopg
from psycopg import postgres, pq
from psycopg.adapt import Transformer

from pgcdc.values import RowLoader, dumps_row

# (column name, type name, value of row i)
COLUMNS = (
    ("id", "int4", lambda i: i),
    ("account", "int8", lambda i: 10_000_000_000 + i),
    ("name", "text", lambda i: f"customer {i} ünï"),
    ("amount", "numeric", lambda i: Decimal(f"{i}.{i % 100:02d}")),
    ("created", "timestamptz", lambda i: datetime(2024, 1, 1, tzinfo=timezone.utc)
     + timedelta(seconds=i)),
    ("active", "bool", lambda i: i % 2 == 0),
    ("key", "uuid", lambda i: uuid.UUID(int=i)),
    ("score", "float8", lambda i: i / 7),
    ("day", "date", lambda i: date(2024, 1, 1) + timedelta(days=i % 365)),
    ("note", "varchar", lambda i: "x" * (i % 20)),
)  # fmt: skip


def make_rows(n: int, binary: bool) -> tuple[list[int], list[tuple]]:
    """(type OIDs, n rows of TupleColumns) as a text or binary slot sends them."""
    oids = [postgres.types[t].oid for _, t, _ in COLUMNS]
    fmt = pq.Format.BINARY if binary else pq.Format.TEXT
    dumpers = [psycopg.adapters.get_dumper_by_oid(oid, fmt)(type(None)) for oid in oids]
    kind = "b" if binary else "t"
    rows = []
    for i in range(n):
        cols = []
        for (_, _, make), dumper in zip(COLUMNS, dumpers):
            data = bytes(dumper.dump(make(i)))
            cols.append(pgc.TupleColumn(kind=kind, value=data))
        rows.append(tuple(cols))
    return oids, rows


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(n: int = 20_000, rounds: int = 7) -> list[dict]:
    """Best of ``rounds`` interleaved rounds; psycopg's own batch call on the same bytes (a
    Transformer with its default loaders, no checks, no fallbacks) is the yardstick."""
    names = [c for c, _, _ in COLUMNS]
    jobs = {}
    for label, binary in (("text", False), ("binary", True)):
        oids, rows = make_rows(n, binary)
        load = RowLoader(oids).load
        tx = Transformer()
        tx.set_loader_types(oids, pq.Format.BINARY if binary else pq.Format.TEXT)
        raw = [[c.value for c in r] for r in rows]
        jobs[f"RowLoader.load, {label} slot"] = lambda load=load, rows=rows: [load(r) for r in rows]
        # the chunk path: all rows a column at a time, from flat kinds and values
        kinds = [c.kind for r in rows for c in r]
        flat = [c.value for r in rows for c in r]
        load_rows = RowLoader(oids).load_rows
        jobs[f"RowLoader.load_rows, {label}"] = lambda f=load_rows, k=kinds, v=flat: f(k, v, n)
        jobs[f"psycopg load_sequence, {label}"] = lambda tx=tx, raw=raw: [
            tx.load_sequence(v) for v in raw
        ]
        if not binary:
            values = [load(r) for r in rows]
            jobs["dumps_row"] = lambda values=values, oids=oids: [
                dumps_row(names, v, oids) for v in values
            ]
    best = dict.fromkeys(jobs, float("inf"))
    for _ in range(rounds):
        for op, fn in jobs.items():
            best[op] = min(best[op], _best(fn, 1))
    results = [{"op": op, "rows": n, "secs": secs} for op, secs in best.items()]
    print_table(results)
    return results


def print_table(results: list[dict]) -> None:
    ncols = len(COLUMNS)
    print(f"\nvalues: {ncols}-column rows ({', '.join(t for _, t, _ in COLUMNS)}), best of rounds")
    print(f"{'operation':34} {'rows/s':>12} {'values/s':>12} {'us/row':>8}")
    for r in results:
        rate = r["rows"] / r["secs"]
        us = 1e6 / rate
        print(f"{r['op']:34} {rate:12,.0f} {rate * ncols:12,.0f} {us:8.2f}")


if __name__ == "__main__":
    run()
