"""CPU instructions per message, counted by valgrind (cachegrind): the same workloads as
codec_bench, but a number that does not move with the load of a shared machine.

Each implementation runs in its own child process under cachegrind, once with no pass over
the corpus and once with PASSES passes; the difference divided by the messages decoded is the
cost of one message (set-up, imports and the Kaitai compile cancel out). Needs valgrind.
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys

from . import codec_bench

PASSES = 2
TRANSACTIONS = 200  # 2,600 messages: valgrind runs Python about 50x slower


def _child(index: int, passes: int) -> None:
    data = codec_bench.corpus(TRANSACTIONS)
    fn, switch = list(codec_bench.workloads(data).values())[index]
    switch()
    gc.collect()
    gc.disable()  # as in the timed runs: the cyclic GC rescanning the results is not decoding
    for _ in range(passes):
        fn()


def _instructions(index: int, passes: int) -> int:
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "bench.instructions",
            "--child",
            str(index),
            str(passes),
        ],
        capture_output=True,
        text=True,
        check=True,
        # str hashing is salted per process: a fixed seed makes the counts repeat exactly
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def run() -> dict | None:
    """{(implementation, op): instructions per message}, or None without valgrind."""
    if shutil.which("valgrind") is None:
        print("\ninstructions: valgrind is not installed (apt-get install valgrind); skipped")
        return None
    n = len(codec_bench.corpus(TRANSACTIONS))
    names = list(codec_bench.workloads(codec_bench.corpus(1)).keys())
    return {
        name: (_instructions(i, PASSES) - _instructions(i, 0)) / (PASSES * n)
        for i, name in enumerate(names)
    }


def print_table(per_msg: dict) -> None:
    print(
        f"\ninstructions per message (valgrind cachegrind, {TRANSACTIONS} transactions,"
        " same corpus as above)"
    )
    for (impl, op), count in per_msg.items():
        print(f"{impl:40} {op:7} {count:12,.0f}")
    for (impl, peer), target in codec_bench.TARGETS.items():
        got = per_msg[(peer, "decode")] / per_msg[(impl, "decode")]
        verdict = "meets" if got >= target else "MISSES"
        print(
            f"{impl} decode vs {peer}: {got:.2f}x fewer instructions, {verdict} the "
            f"{target:g}x target"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        result = run()
        if result is not None:
            print_table(result)
