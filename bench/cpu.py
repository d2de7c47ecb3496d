"""CPU seconds from ``/proc`` for the benches: the machine's, one process's and a server's.

On a shared 2-core machine the wall time of the same run varies by the hour (the peer of
``bench.source_bench`` took 1.3 s one day and 3.5 s another), and which process used the
cores says more than a ratio of two wall times: a Spark query's JVM, the server's walsender
and the Python workers share them. Linux only; elsewhere every reading is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command (which may hold spaces): [0] the
    state, [1] the parent's pid, [11:13] user and system ticks, [13:15] reaped children's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def machine() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all but idle and I/O wait)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def process(pid: int) -> float | None:
    """CPU seconds of one process: every thread it ran, ended ones included."""
    f = stat_fields(pid)
    return None if f is None else (int(f[11]) + int(f[12])) / _TICK


def server(postmaster: int) -> float | None:
    """CPU seconds of a PostgreSQL server: the postmaster, the children it has reaped (a
    walsender that ended, a backend that disconnected) and the ones running."""
    f = stat_fields(postmaster)
    if f is None:
        return None
    ticks = sum(int(x) for x in f[11:15])
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            child = stat_fields(int(d.name))
            if child is not None and int(child[1]) == postmaster:
                ticks += int(child[11]) + int(child[12])
    return ticks / _TICK


def postmaster_pid(datadir: Path) -> int:
    """The postmaster's pid, from the first line of its ``postmaster.pid``."""
    return int((Path(datadir) / "postmaster.pid").read_text().split("\n", 1)[0])


@dataclass(frozen=True)
class Reading:
    machine: float
    jvm: float
    server: float

    def __sub__(self, before: Reading) -> Reading:
        return Reading(
            self.machine - before.machine, self.jvm - before.jvm, self.server - before.server
        )

    @property
    def rest(self) -> float:
        """Neither the JVM nor the server: the Python workers, this process, the rest."""
        return self.machine - self.jvm - self.server


class Meter:
    """Readings of the machine, a JVM and a server, to subtract one from another."""

    def __init__(self, jvm_pid: int, postmaster: int):
        self.jvm_pid, self.postmaster = jvm_pid, postmaster

    def read(self) -> Reading | None:
        m, j, s = machine(), process(self.jvm_pid), server(self.postmaster)
        return None if None in (m, j, s) else Reading(m, j, s)
