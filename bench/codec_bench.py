"""Decode/encode throughput of the generated codec vs pypgoutput and a Kaitai-generated parser.

Corpus: synthetic CDC transactions (Begin, Relation, Inserts/Updates/Deletes of 10 text
columns, Commit), protocol version 1, the kind of stream a busy OLTP table produces.
Every peer decodes the same bytes in the same run; the best of several rounds is reported.
"""

from __future__ import annotations

import gc
import importlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from io import BytesIO
from pathlib import Path

import pgoutput_codec as pgc

ROOT = Path(__file__).resolve().parent.parent
KSY = ROOT / "generated" / "kaitai" / "pgoutput_message.ksy"


def corpus(transactions: int = 2000, rows: int = 10, seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    cols = tuple(
        pgc.RelationColumn(flags=int(i == 0), name=f"col_{i}", type_oid=25, type_modifier=-1)
        for i in range(10)
    )

    def row():
        return pgc.TupleData(
            columns=tuple(
                pgc.TupleColumn(
                    kind="t",
                    value=rnd.randbytes(rnd.randint(4, 24)).hex().encode()[: rnd.randint(4, 24)],
                )
                for _ in range(10)
            )
        )

    out = []
    lsn = 0x1_0000_0000
    for x in range(transactions):
        xid = 1000 + x
        msgs = [
            pgc.Begin(final_lsn=lsn + 4096, commit_time=780_000_000_000_000 + x, xid=xid),
            pgc.Relation(
                relation_oid=16384,
                namespace="public",
                relation_name="orders",
                replica_identity=ord("d"),
                columns=cols,
            ),
        ]
        for r in range(rows):
            kind = r % 5
            if kind < 3:
                msgs.append(pgc.Insert(relation_oid=16384, new_tuple=row()))
            elif kind == 3:
                msgs.append(pgc.Update(relation_oid=16384, new_tuple=row()))
            else:
                key = pgc.TupleData(
                    columns=(pgc.TupleColumn(kind="t", value=b"42"),)
                    + (pgc.TupleColumn(kind="n", value=None),) * 9
                )
                msgs.append(pgc.Delete(relation_oid=16384, old_kind="K", old_tuple=key))
        msgs.append(
            pgc.Commit(
                flags=0,
                commit_lsn=lsn + 4096,
                end_lsn=lsn + 4200,
                commit_time=780_000_000_000_000 + x,
            )
        )
        lsn += 8192
        out.extend(pgc.encode(m, protocol_version=1) for m in msgs)
    return out


def _timed(fn) -> float:
    """Wall time of one run, with the cyclic GC off for every peer alike (as timeit does):
    otherwise the collector rescanning the growing result list dominates the numbers."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def _interleaved(runs: dict, rounds: int) -> dict:
    """Times of each run in every round, taking turns, so that a slow spell of a shared
    machine hits every implementation alike instead of whichever ran during it."""
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (fn, switch) in runs.items():
            switch()
            times[name].append(_timed(fn))
    pgc.use_speedups(True)
    return times


def kaitai_parser():
    """Compile the project's .ksy with the real Kaitai compiler and import its Python output."""
    out = Path(tempfile.mkdtemp(prefix="ksc-bench-"))
    proc = subprocess.run(
        ["node", str(ROOT / "tools" / "ksc.mjs"), "-t", "python", "-d", str(out), str(KSY)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kaitai compile failed: {proc.stdout}{proc.stderr}")
    sys.path.insert(0, str(out / "python"))  # ksc writes each language into its own folder
    module = importlib.import_module("pgoutput_message")
    from kaitaistruct import KaitaiStream

    cls = module.PgoutputMessage

    def parse(b):
        return cls(1, False, False, KaitaiStream(BytesIO(b)))

    return parse


OURS_C, OURS_PY = "pgoutput_codec (C accelerator, default)", "pgoutput_codec (pure-Python fallback)"
PYPGOUTPUT, KAITAI = "pypgoutput 0.0.3", "kaitai-struct-compiler 0.11 (python)"
HANDWRITTEN = "hand-written struct decoder (tuples)"
# The targets for our decode: times faster than each peer; encode at least decode.
# (ours, peer) -> how many times faster ours must decode (issue 11: C stays >= 12x pypgoutput,
# pure Python >= 4x). Judged on instructions (bench.instructions): wall-clock ratios on a shared
# machine swing by +-30% from round to round, and are printed as a cross-check.
TARGETS = {
    (OURS_C, PYPGOUTPUT): 12.0,
    (OURS_PY, PYPGOUTPUT): 4.0,
    (OURS_C, KAITAI): 5.0,
    (OURS_PY, KAITAI): 5.0,
}


def workloads(data: list[bytes]) -> dict:
    """(implementation, op) -> (run over the corpus, switch that selects the implementation)."""
    import pypgoutput

    from . import handwritten

    dec = pgc.StreamDecoder(protocol_version=1)
    decode = dec.decode
    msgs = [decode(b) for b in data]
    encode = pgc.encode
    assert [encode(m, protocol_version=1) for m in msgs] == data
    assert pgc.speedups_enabled(), "the C accelerator is not built: make generate"

    classes = {
        ord("B"): pypgoutput.Begin,
        ord("C"): pypgoutput.Commit,
        ord("R"): pypgoutput.Relation,
        ord("I"): pypgoutput.Insert,
        ord("U"): pypgoutput.Update,
        ord("D"): pypgoutput.Delete,
    }
    parse = kaitai_parser()
    hand = handwritten.decode

    def c():
        pgc.use_speedups(True)

    def py():
        pgc.use_speedups(False)

    return {
        (OURS_C, "decode"): (lambda: [decode(b) for b in data], c),
        (OURS_C, "encode"): (lambda: [encode(m, protocol_version=1) for m in msgs], c),
        (OURS_PY, "decode"): (lambda: [decode(b) for b in data], py),
        (OURS_PY, "encode"): (lambda: [encode(m, protocol_version=1) for m in msgs], py),
        (HANDWRITTEN, "decode"): (lambda: [hand(b) for b in data], c),
        (PYPGOUTPUT, "decode"): (lambda: [classes[b[0]](b) for b in data], c),
        (KAITAI, "decode"): (lambda: [parse(b) for b in data], c),
    }


def run(transactions: int = 2000, rounds: int = 9) -> list[dict]:
    data = corpus(transactions)
    n = len(data)
    size = sum(map(len, data))
    times = _interleaved(workloads(data), rounds)
    return [
        {
            "impl": impl,
            "op": op,
            "msgs": n,
            "seconds": min(ts),
            "rounds": ts,
            "msgs_per_s": n / min(ts),
            "mb_per_s": size / min(ts) / 1e6,
        }
        for (impl, op), ts in times.items()
    ]


def paired_ratio(results: list[dict], a: tuple[str, str], b: tuple[str, str]) -> tuple:
    """How many times faster a is than b: the median of the per-round ratios (each round runs
    both back to back, so a slow spell cancels out), with their range."""
    rounds = {(r["impl"], r["op"]): r["rounds"] for r in results}
    ratios = sorted(tb / ta for ta, tb in zip(rounds[a], rounds[b]))
    return statistics.median(ratios), ratios[0], ratios[-1]


def print_table(results: list[dict]) -> None:
    rate = {(r["impl"], r["op"]): r["msgs_per_s"] for r in results}
    first = results[0]
    print(
        f"\ncodec: {first['msgs']} messages, synthetic CDC corpus (protocol 1, 10 text columns),"
        f" best of {len(first['rounds'])} interleaved rounds"
    )
    print(f"{'implementation':40} {'op':7} {'msgs/s':>12} {'MB/s':>8} {'C decode vs it':>15}")
    ours = rate[(OURS_C, "decode")]
    for r in results:
        ratio = (
            f"{ours / r['msgs_per_s']:14.2f}x"
            if r["op"] == "decode" and r["impl"] != OURS_C
            else ""
        )
        print(
            f"{r['impl']:40} {r['op']:7} {r['msgs_per_s']:12,.0f} {r['mb_per_s']:8.1f} {ratio:>15}"
        )
    print("verdicts: median of the per-round ratios (range over rounds)")
    checks = [
        ((impl, "decode"), (peer, "decode"), target) for (impl, peer), target in TARGETS.items()
    ]
    checks += [((impl, "encode"), (impl, "decode"), 1.0) for impl in (OURS_C, OURS_PY)]
    for a, b, target in checks:
        got, lo, hi = paired_ratio(results, a, b)
        verdict = "meets" if got >= target else "MISSES"
        against = f"its {b[1]}" if a[0] == b[0] else f"{b[0]} {b[1]}"
        print(
            f"{a[0]} {a[1]} vs {against}: {got:.2f}x ({lo:.2f}-{hi:.2f}), "
            f"{verdict} the {target:g}x target"
        )


if __name__ == "__main__":
    print_table(run())
