"""Change events per second from a capture file: decode + relation lookup + typed values +
transaction assembly, for 10-column rows from a text slot and a binary slot, whole
transactions and streamed ones (buffered, then released at Stream Commit); the same read
through Record objects, and as ``pgcdc changes`` JSON Lines. Where the time goes, per stage:
wall clock, and CPU instructions per event counted by valgrind (the same on every run,
whatever else the machine does). Also the peak Python memory while a large streamed
transaction spills to disk.

Target (issue 14): at least 300k events/s with the C accelerator.

    python -m bench.events_bench [--skip-instructions]
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc

import pgoutput_codec as pgc
from pgcdc.capture import files as sources
from pgcdc.cli import changes
from pgcdc.events.reader import EventReader, read_events
from pgcdc.values import RowLoader
from pgoutput_codec._decoder import decode_tuple

TARGET = 300_000  # events/s, whole transactions, C accelerator (issue 14)

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
    """Events through the chunk path (``read_chunks(sources.iter_chunks(path))``)."""
    gc.collect()
    t0 = time.perf_counter()
    n = 0
    for _ in EventReader(**options).read_chunks(sources.iter_chunks(path)):
        n += 1
    return n, time.perf_counter() - t0


def _consume_raw(path) -> tuple[int, float]:
    """The same a message at a time (``read_raw(sources.iter_raw(path))``)."""
    gc.collect()
    t0 = time.perf_counter()
    n = sum(1 for _ in EventReader().read_raw(sources.iter_raw(path)))
    return n, time.perf_counter() - t0


def _consume_records(path) -> tuple[int, float]:
    """The same through Record objects (``read_events(sources.iter_records(path))``)."""
    gc.collect()
    t0 = time.perf_counter()
    n = sum(1 for _ in read_events(sources.iter_records(path)))
    return n, time.perf_counter() - t0


def _json_lines(path) -> tuple[int, float]:
    """``pgcdc changes PATH`` (the CLI's own main) with its output to /dev/null."""
    gc.collect()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        t0 = time.perf_counter()
        status = changes.main([str(path)])
        seconds = time.perf_counter() - t0
    assert status == 0
    return 0, seconds


# -- stages, cumulative: each runs everything the one before it does, plus one step -------


def _stage_read(path):
    for _ in sources.iter_raw(path):
        pass


def _stage_decode(path):
    for gates, _lsn, data in sources.iter_raw(path):
        decode_tuple(data, gates)


def _stage_load(path):
    loader = RowLoader([oid for _, oid in COLUMNS])
    for gates, _lsn, data in sources.iter_raw(path):
        msg = decode_tuple(data, gates)
        if type(msg) is pgc.Insert:
            loader.load(msg.new_tuple.columns)


def _stage_events(path):
    for _ in EventReader().read_raw(sources.iter_raw(path)):
        pass


def _stage_json(path):
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        changes.main([str(path)])


def _stage_chunks(path):
    for _ in EventReader().read_chunks(sources.iter_chunks(path)):
        pass


# message at a time, each stage doing what the one before it does plus one step
STAGES = {
    "read records": _stage_read,
    "decode (C accelerator)": _stage_decode,
    "load values (psycopg)": _stage_load,
    "relations + assembly + events": _stage_events,
}
# the whole pipeline: the chunk path (records read in C, Inserts decoded into columns and
# loaded a column at a time), and pgcdc changes on top of it
WHOLE = {
    "events, chunk path": _stage_chunks,
    "JSON lines (pgcdc changes)": _stage_json,
}


def _stage_child(stage: str, path: str, passes: int) -> None:
    fn = {**STAGES, **WHOLE}[stage]
    fn(path)  # warm: imports, caches, the interpreter's specialisation
    gc.collect()
    gc.disable()
    for _ in range(passes):
        fn(path)


def _instructions(stage: str, path: str, passes: int) -> int:
    proc = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-m", "bench.events_bench", "--stage", stage, path, str(passes)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def instructions_per_event(path, events: int, stages=(*STAGES, *WHOLE)) -> dict[str, float] | None:
    """Cumulative instructions per event of each stage (valgrind; None without it): the
    difference between 2 passes and 0 passes over the capture, divided by the events."""
    if shutil.which("valgrind") is None:
        return None
    return {
        stage: (_instructions(stage, str(path), 2) - _instructions(stage, str(path), 0))
        / (2 * events)
        for stage in stages
    }


def _breakdown(path) -> dict[str, float]:
    """Microseconds per event of each stage alone (wall clock, best of 3)."""
    totals = {}
    for stage, fn in STAGES.items():
        best = float("inf")
        for _ in range(3):
            gc.collect()
            t0 = time.perf_counter()
            fn(path)
            best = min(best, time.perf_counter() - t0)
        totals[stage] = best
    n = sum(1 for _ in EventReader().read_raw(sources.iter_raw(path)))
    out, before = {}, 0.0
    for stage, total in totals.items():
        out[stage] = max(total - before, 0.0) / n * 1e6
        before = total
    return out


def peak_memory_streamed(directory, rows: int, memory_limit: int) -> tuple[int, int]:
    """(payload bytes of one streamed transaction, peak traced Python memory reading it)."""
    path = os.path.join(directory, "big.pgcap")
    build_capture(path, binary=False, streamed=True, transactions=1, rows=rows)
    size = os.path.getsize(path)
    tracemalloc.start()
    n = sum(1 for _ in EventReader(memory_limit=memory_limit).read_raw(sources.iter_raw(path)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert n == rows
    return size, peak


def run(
    transactions: int = 2000, rows: int = 50, rounds: int = 3, instructions: bool = True
) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="pgcdc-bench-") as tmp:
        for streamed in (False, True):
            for binary in (False, True):
                path = os.path.join(tmp, f"{int(streamed)}{int(binary)}.pgcap")
                expected = build_capture(
                    path, binary=binary, streamed=streamed, transactions=transactions, rows=rows
                )
                n, _ = _consume(path)
                assert n == expected, (n, expected)
                # rounds interleave the three ways of reading, so drift hits them alike
                best = {"events": [], "raw": [], "records": [], "json": []}
                for _ in range(rounds):
                    best["events"].append(_consume(path)[1])
                    best["raw"].append(_consume_raw(path)[1])
                    best["records"].append(_consume_records(path)[1])
                    best["json"].append(_json_lines(path)[1])
                results.append(
                    {
                        "slot": "binary" if binary else "text",
                        "transactions": "streamed" if streamed else "whole",
                        "events": n,
                        "events_per_s": n / min(best["events"]),
                        "raw_per_s": n / min(best["raw"]),
                        "records_per_s": n / min(best["records"]),
                        "json_per_s": n / min(best["json"]),
                    }
                )
        parts = {
            fmt: _breakdown(os.path.join(tmp, f"0{b}.pgcap"))
            for fmt, b in (("text", 0), ("binary", 1))
        }
        counts = {}
        if instructions:
            small = {}
            for key in ("00", "01", "10", "11"):
                small[key] = os.path.join(tmp, f"small{key}.pgcap")
                build_capture(
                    small[key], binary=key[1] == "1", streamed=key[0] == "1", transactions=40,
                    rows=rows,
                )  # fmt: skip
            for key, path in small.items():
                # streamed: the whole pipeline only (its stages before it are the same)
                stages = (
                    (*STAGES, *WHOLE)
                    if key[0] == "0"
                    else ("relations + assembly + events", "events, chunk path")
                )
                counts[key] = instructions_per_event(path, 40 * rows, stages)
        size, peak = peak_memory_streamed(tmp, rows=100_000, memory_limit=8 << 20)
    print(
        f"\nchange events from a capture file: {transactions:,} transactions of {rows} inserts of "
        f"10-column rows; best of {rounds} interleaved rounds (wall clock)"
    )
    print(
        f"{'slot':8} {'transactions':13} {'events':>8} {'events/s':>10} {'msg at a time':>14} "
        f"{'via Records':>12} {'JSON lines/s':>13}"
    )
    for r in results:
        print(
            f"{r['slot']:8} {r['transactions']:13} {r['events']:>8} {r['events_per_s']:>10,.0f} "
            f"{r['raw_per_s']:>14,.0f} {r['records_per_s']:>12,.0f} {r['json_per_s']:>13,.0f}"
        )
    print(
        "events/s: the chunk path (read_chunks(iter_chunks)); msg at a time: "
        "read_raw(iter_raw); via Records: read_events(iter_records)"
    )
    best = max(r["events_per_s"] for r in results if r["transactions"] == "whole")
    verdict = "meets" if best >= TARGET else "MISSES"
    print(
        f"accelerator: {pgc.speedups_enabled()}; best whole-transaction rate {best:,.0f} "
        f"events/s: {verdict} the {TARGET:,} events/s target"
    )
    for fmt, p in parts.items():
        print(
            f"wall clock per event, whole transactions, {fmt} slot: "
            + ", ".join(f"{k} {v:.2f} us" for k, v in p.items())
        )
    if counts and all(c is not None for c in counts.values()):
        print("instructions per event (valgrind; cumulative stages, repeatable under load):")
        print(
            f"{'stage':32}"
            + "".join(f"{k:>12}" for k in ("text", "binary", "text str.", "bin. str."))
        )
        for stage in (*STAGES, *WHOLE):
            row = [counts[k].get(stage) for k in ("00", "01", "10", "11")]
            print(f"{stage:32}" + "".join("" if v is None else f"{v:>12,.0f}" for v in row))
        whole = counts["00"]
        steps, before = [], 0.0
        for stage in STAGES:
            steps.append(f"{stage} {whole[stage] - before:,.0f}")
            before = whole[stage]
        print("  each stage alone (text, whole, message at a time): " + "; ".join(steps))
    elif instructions:
        print("instructions per event: valgrind is not installed; skipped")
    print(
        f"one streamed transaction of {size / 1e6:.0f} MB (100k rows), memory limit 8 MB: "
        f"peak Python memory {peak / 1e6:.1f} MB"
    )
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--stage"]:
        _stage_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        run(instructions="--skip-instructions" not in sys.argv)
