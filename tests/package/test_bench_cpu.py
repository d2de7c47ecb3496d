"""bench.cpu's readings against what the measured processes report of themselves
(``resource.getrusage``), not against /proc read a second way."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import cpu

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")

# Spins for about `s` seconds of CPU, prints its own CPU seconds, then waits for stdin to close
BURN = """
import resource, sys, time
t = time.process_time()
while time.process_time() - t < {s}:
    pass
u = resource.getrusage(resource.RUSAGE_SELF)
print(u.ru_utime + u.ru_stime, flush=True)
sys.stdin.read()
"""

# Starts a burner, waits for it (reaped: its CPU moves to this process's children's), prints
# the burner's own CPU seconds, then waits for stdin to close
PARENT = """
import subprocess, sys
child = subprocess.run([sys.executable, "-c", {burn!r}], input="", capture_output=True,
                       text=True, check=True)
print(child.stdout.strip(), flush=True)
sys.stdin.read()
"""


def _started(code: str) -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return proc, float(proc.stdout.readline())


def test_a_process_reads_as_the_cpu_it_used():
    busy = cpu.machine()
    proc, own = _started(BURN.format(s=0.4))
    try:
        read = cpu.process(proc.pid)
        assert own >= 0.4
        assert own - 0.05 <= read <= own + 0.05  # /proc counts in ticks of 10 ms
        assert cpu.machine() - busy >= own - 0.05
    finally:
        proc.communicate("")
    assert cpu.process(proc.pid) is None  # reaped: no such process


def test_a_server_counts_the_children_it_reaped_and_the_running_ones():
    parent, reaped = _started(PARENT.format(burn=BURN.format(s=0.3)))
    running, own = _started(BURN.format(s=0.2))  # not its child: not counted
    try:
        read = cpu.server(parent.pid)
        assert reaped >= 0.3
        assert reaped - 0.05 <= read - cpu.process(parent.pid) <= reaped + 0.05
        assert read < reaped + own  # the unrelated burner is not in it
    finally:
        parent.communicate("")
        running.communicate("")


def test_readings_subtract_per_part():
    first = cpu.Reading(machine=10.0, jvm=4.0, server=1.5)
    later = cpu.Reading(machine=13.0, jvm=5.0, server=2.5)
    used = later - first
    assert (used.machine, used.jvm, used.server, used.rest) == (3.0, 1.0, 1.0, 1.0)


def test_a_meter_of_a_process_gone_reads_none():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    assert cpu.Meter(proc.pid, proc.pid).read() is None
