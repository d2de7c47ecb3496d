"""Decode/encode throughput of the generated codec vs pypgoutput and a Kaitai-generated parser.

Corpus: synthetic CDC transactions (Begin, Relation, Inserts/Updates/Deletes of 10 text
columns, Commit), protocol version 1, the kind of stream a busy OLTP table produces.
Every peer decodes the same bytes in the same run; the best of several rounds is reported.
"""

from __future__ import annotations

import gc
import importlib
import random
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
    cols = tuple(pgc.RelationColumn(flags=int(i == 0), name=f"col_{i}", type_oid=25, type_modifier=-1)
                 for i in range(10))

    def row():
        return pgc.TupleData(columns=tuple(
            pgc.TupleColumn(kind="t", value=rnd.randbytes(rnd.randint(4, 24)).hex().encode()[:rnd.randint(4, 24)])
            for _ in range(10)))

    out = []
    lsn = 0x1_0000_0000
    for x in range(transactions):
        xid = 1000 + x
        msgs = [pgc.Begin(final_lsn=lsn + 4096, commit_time=780_000_000_000_000 + x, xid=xid),
                pgc.Relation(relation_oid=16384, namespace="public", relation_name="orders",
                             replica_identity=ord("d"), columns=cols)]
        for r in range(rows):
            kind = r % 5
            if kind < 3:
                msgs.append(pgc.Insert(relation_oid=16384, new_tuple=row()))
            elif kind == 3:
                msgs.append(pgc.Update(relation_oid=16384, new_tuple=row()))
            else:
                key = pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=b"42"),) +
                                    (pgc.TupleColumn(kind="n", value=None),) * 9)
                msgs.append(pgc.Delete(relation_oid=16384, old_kind="K", old_tuple=key))
        msgs.append(pgc.Commit(flags=0, commit_lsn=lsn + 4096, end_lsn=lsn + 4200,
                               commit_time=780_000_000_000_000 + x))
        lsn += 8192
        out.extend(pgc.encode(m, protocol_version=1) for m in msgs)
    return out


def _best(fn, rounds: int) -> float:
    """Best wall time of `rounds` runs, with the cyclic GC off for every peer alike (as timeit
    does): otherwise the collector rescanning the growing result list dominates the numbers."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return best


def kaitai_parser():
    """Compile the project's .ksy with the real Kaitai compiler and import its Python output."""
    out = Path(tempfile.mkdtemp(prefix="ksc-bench-"))
    proc = subprocess.run(["node", str(ROOT / "tools" / "ksc.mjs"), "-t", "python", "-d", str(out),
                           str(KSY)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kaitai compile failed: {proc.stdout}{proc.stderr}")
    sys.path.insert(0, str(out / "python"))  # ksc writes each language into its own folder
    module = importlib.import_module("pgoutput_message")
    from kaitaistruct import KaitaiStream

    cls = module.PgoutputMessage

    def parse(b):
        return cls(1, False, False, KaitaiStream(BytesIO(b)))

    return parse


def run(transactions: int = 2000, rounds: int = 5) -> list[dict]:
    data = corpus(transactions)
    n = len(data)
    size = sum(map(len, data))
    results = []

    def report(name, seconds, op="decode"):
        row = {"impl": name, "op": op, "msgs": n, "seconds": seconds,
               "msgs_per_s": n / seconds, "mb_per_s": size / seconds / 1e6}
        results.append(row)
        return row

    dec = pgc.StreamDecoder(protocol_version=1)
    decode = dec.decode
    report("pgoutput_codec (StreamDecoder)", _best(lambda: [decode(b) for b in data], rounds))
    msgs = [decode(b) for b in data]
    assert [pgc.encode(m, protocol_version=1) for m in msgs] == data
    encode = pgc.encode
    report("pgoutput_codec", _best(lambda: [encode(m, protocol_version=1) for m in msgs], rounds),
           op="encode")

    import pypgoutput

    classes = {ord("B"): pypgoutput.Begin, ord("C"): pypgoutput.Commit,
               ord("R"): pypgoutput.Relation, ord("I"): pypgoutput.Insert,
               ord("U"): pypgoutput.Update, ord("D"): pypgoutput.Delete}
    report("pypgoutput 0.0.3", _best(lambda: [classes[b[0]](b) for b in data], max(2, rounds // 2)))

    parse = kaitai_parser()
    report("kaitai-struct-compiler 0.11 (python)", _best(lambda: [parse(b) for b in data],
                                                          max(2, rounds // 2)))
    return results


def print_table(results: list[dict]) -> None:
    ours = next(r for r in results if r["op"] == "decode")
    print(f"\ncodec: {ours['msgs']} messages, synthetic CDC corpus (protocol 1, 10 text columns)")
    print(f"{'implementation':40} {'op':7} {'msgs/s':>12} {'MB/s':>8} {'vs ours':>8}")
    for r in results:
        ratio = ours["msgs_per_s"] / r["msgs_per_s"] if r["op"] == "decode" else float("nan")
        print(f"{r['impl']:40} {r['op']:7} {r['msgs_per_s']:12,.0f} {r['mb_per_s']:8.1f} "
              f"{'' if r is ours or r['op'] != 'decode' else f'{ratio:7.2f}x'}")


if __name__ == "__main__":
    print_table(run())
