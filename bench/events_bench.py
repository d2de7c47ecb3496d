"""Change events per second from a capture file: decode + relation lookup + typed values +
transaction assembly, for 10-column rows from a text slot and a binary slot, whole
transactions and streamed ones (buffered, then released at Stream Commit). Also the peak
Python memory while a large streamed transaction spills to disk.

Target (issue 14): at least 300k events/s with the C accelerator.

    python -m bench.events_bench
"""

from __future__ import annotations

import gc
import os
import struct
import tempfile
import time
import tracemalloc

import pgoutput_codec as pgc
from pgcdc import sources
from pgcdc.events import read_events

# 10 columns: int4 int8 text bool float8 timestamptz date text int4 float8
COLUMNS = (
    ("id", 23),
    ("a", 20),
    ("b", 25),
    ("c", 16),
    ("d", 701),
    ("e", 1184),
    ("f", 1082),
    ("g", 25),
    ("h", 23),
    ("i", 701),
)
RELATION_OID = 16384


def _row(i: int, binary: bool) -> pgc.TupleData:
    if binary:
        values = (
            struct.pack(">i", i),
            struct.pack(">q", i * 1000),
            f"name {i}".encode(),
            b"\x01" if i % 2 else b"\x00",
            struct.pack(">d", i * 0.5),
            struct.pack(">q", 757_000_000_000_000 + i),
            struct.pack(">i", 9000 + i % 300),
            b"some text value",
            struct.pack(">i", -i),
            struct.pack(">d", 1.25),
        )
    else:
        values = (
            str(i).encode(),
            str(i * 1000).encode(),
            f"name {i}".encode(),
            b"t" if i % 2 else b"f",
            repr(i * 0.5).encode(),
            b"2023-12-28 10:13:20.000001+00",
            b"2024-08-22",
            b"some text value",
            str(-i).encode(),
            b"1.25",
        )
    kind = "b" if binary else "t"
    return pgc.TupleData(columns=tuple(pgc.TupleColumn(kind=kind, value=v) for v in values))


def _relation(xid=None) -> pgc.Relation:
    return pgc.Relation(
        xid=xid,
        relation_oid=RELATION_OID,
        namespace="public",
        relation_name="bench",
        replica_identity=ord("d"),
        columns=tuple(
            pgc.RelationColumn(flags=int(n == "id"), name=n, type_oid=t, type_modifier=-1)
            for n, t in COLUMNS
        ),
    )


def build_capture(path, *, binary: bool, streamed: bool, transactions: int, rows: int) -> int:
    """A capture of `transactions` transactions of `rows` inserts each; returns the events."""
    pv, streaming = (4, "on") if streamed else (1, "off")
    payloads = []
    lsn = 0x1000000
    for t in range(transactions):
        xid = 1000 + t
        lsn += 0x100
        first = lsn
        commit = first + 0x40 * (rows + 2)
        if streamed:
            payloads.append(
                (
                    lsn,
                    pgc.encode(
                        pgc.StreamStart(xid=xid, first_segment=1),
                        protocol_version=pv,
                        streaming=streaming,
                    ),
                )
            )
            msgs = [_relation(xid)] + [
                pgc.Insert(xid=xid, relation_oid=RELATION_OID, new_tuple=_row(i, binary))
                for i in range(rows)
            ]
            for m in msgs:
                lsn += 0x40
                payloads.append(
                    (lsn, pgc.encode(m, protocol_version=pv, streaming=streaming, in_stream=True))
                )
            payloads.append(
                (lsn, pgc.encode(pgc.StreamStop(), protocol_version=pv, streaming=streaming))
            )
            end = pgc.StreamCommit(
                xid=xid, flags=0, commit_lsn=commit, end_lsn=commit + 8, commit_time=1
            )
        else:
            payloads.append(
                (
                    lsn,
                    pgc.encode(
                        pgc.Begin(final_lsn=commit, commit_time=1, xid=xid), protocol_version=pv
                    ),
                )
            )
            msgs = [_relation()] + [
                pgc.Insert(relation_oid=RELATION_OID, new_tuple=_row(i, binary))
                for i in range(rows)
            ]
            for m in msgs:
                lsn += 0x40
                payloads.append((lsn, pgc.encode(m, protocol_version=pv)))
            end = pgc.Commit(flags=0, commit_lsn=commit, end_lsn=commit + 8, commit_time=1)
        lsn = commit
        payloads.append((lsn, pgc.encode(end, protocol_version=pv, streaming=streaming)))
    pgc.capture.write(path, pgc.capture.from_payloads(payloads, pv, streaming))
    return transactions * rows


def _consume(path, **options) -> tuple[int, float]:
    gc.collect()
    t0 = time.perf_counter()
    n = 0
    for _ in read_events(sources.iter_records(path), **options):
        n += 1
    return n, time.perf_counter() - t0


def _breakdown(path) -> dict[str, float]:
    """Microseconds per event of each stage, measured alone on the same capture."""
    from pgcdc.values import RowLoader

    gc.disable()  # the stages build big lists; collections would be charged to them
    t0 = time.perf_counter()
    recs = list(sources.iter_records(path))
    t1 = time.perf_counter()
    msgs = [r.decode() for r in recs]
    t2 = time.perf_counter()
    inserts = [m.new_tuple.columns for m in msgs if type(m) is pgc.Insert]
    loader = RowLoader([oid for _, oid in COLUMNS])
    t3 = time.perf_counter()
    for cols in inserts:
        loader.load(cols)
    t4 = time.perf_counter()
    gc.enable()
    _, total = _consume(path)
    n = len(inserts)
    read, decode, load = (t1 - t0) / n, (t2 - t1) / n, (t4 - t3) / n
    return {
        "read records": read * 1e6,
        "decode": decode * 1e6,
        "load values": load * 1e6,
        "relations + assembly + events": (total / n - read - decode - load) * 1e6,
        "total": total / n * 1e6,
    }


def peak_memory_streamed(directory, rows: int, memory_limit: int) -> tuple[int, int]:
    """(payload bytes of one streamed transaction, peak traced Python memory reading it)."""
    path = os.path.join(directory, "big.pgcap")
    build_capture(path, binary=False, streamed=True, transactions=1, rows=rows)
    size = os.path.getsize(path)
    tracemalloc.start()
    n = sum(1 for _ in read_events(sources.iter_records(path), memory_limit=memory_limit))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == rows
    return size, peak


def run(transactions: int = 2000, rows: int = 50, rounds: int = 3) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="pgcdc-bench-") as tmp:
        for streamed in (False, True):
            for binary in (False, True):
                path = os.path.join(tmp, f"{int(streamed)}{int(binary)}.pgcap")
                expected = build_capture(
                    path, binary=binary, streamed=streamed, transactions=transactions, rows=rows
                )
                best = min(_consume(path)[1] for _ in range(rounds))
                n, _ = _consume(path)
                assert n == expected, (n, expected)
                results.append(
                    {
                        "slot": "binary" if binary else "text",
                        "transactions": "streamed" if streamed else "whole",
                        "events": n,
                        "events_per_s": n / best,
                    }
                )
        parts = _breakdown(os.path.join(tmp, "01.pgcap"))
        size, peak = peak_memory_streamed(tmp, rows=100_000, memory_limit=8 << 20)
    print(f"{'slot':8} {'transactions':13} {'events':>8} {'events/s':>10}")
    for r in results:
        print(f"{r['slot']:8} {r['transactions']:13} {r['events']:>8} {r['events_per_s']:>10,.0f}")
    print(f"accelerator: {pgc.speedups_enabled()}; target >= 300,000 events/s (whole, C)")
    print(
        "where the time goes per event (binary, whole): "
        + ", ".join(f"{k} {v:.2f} us" for k, v in parts.items())
    )
    print(
        f"one streamed transaction of {size / 1e6:.0f} MB (100k rows), memory limit 8 MB: "
        f"peak Python memory {peak / 1e6:.1f} MB"
    )
    return results


if __name__ == "__main__":
    run()
