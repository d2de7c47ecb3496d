"""What the commands that run Spark (``apply``, ``snapshot``) share: Ctrl-C that ends with one
line and exit 130, and a progress line on a TTY.

Ctrl-C cancels Spark's jobs with its log silenced, then interrupts the driver: the library
call unwinds (apply and snapshot write their state last, atomically, so nothing half-done is
recorded) and the command prints one line instead of py4j's and the JVM's traces.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager


class Interrupt:
    """Set by the signal handler; ``hit`` once the user asked to stop."""

    hit = False


@contextmanager
def interruptible(spark):
    """SIGINT/SIGTERM: cancel the session's jobs quietly, so the running Spark call fails and
    the library call unwinds; a second signal raises KeyboardInterrupt at once. Yields an
    :class:`Interrupt` to tell an interrupted run's errors apart.

    The handler raises nothing itself the first time: it runs in the main thread, which is
    usually inside a py4j socket read, and an exception there makes py4j log its own traces.
    Jobs are cancelled from another thread (py4j gives each thread its own connection), again
    every half second, so a job the driver starts after the first cancel fails too."""
    state = Interrupt()
    done = threading.Event()

    def cancel_until_done():
        try:
            spark.sparkContext.setLogLevel("OFF")
        except Exception:  # the JVM may already be going away
            pass
        while not done.is_set():
            try:
                spark.sparkContext.cancelAllJobs()
            except Exception:
                pass
            done.wait(0.5)

    def handler(signum, frame):
        if state.hit:
            raise KeyboardInterrupt
        state.hit = True
        logging.disable(logging.CRITICAL)  # py4j logs a failed call through the root logger
        threading.Thread(target=cancel_until_done, name="pgcdc-cancel", daemon=True).start()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
        if state.hit:  # the run ended between two jobs: it must not count as done
            raise KeyboardInterrupt
    finally:
        done.set()
        for s, h in old.items():
            signal.signal(s, h)


def _stages(spark) -> list[tuple[int, int, int, int, int]]:
    """(stage id, tasks, tasks done, tasks running, output records) of the active stages, from
    Spark's status store (kept with the UI off; a running task's records arrive with the
    executors' heartbeats, a finished task's at once)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    stages = store.activeStages()
    out = []
    for i in range(stages.size()):
        s = stages.apply(i)
        out.append(
            (s.stageId(), s.numTasks(), s.numCompleteTasks(), s.numActiveTasks(), s.outputRecords())
        )
    return out


def _rate(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


@contextmanager
def progress(spark, prog: str, stream=None):
    """A progress line on ``stream`` (stderr) while Spark runs, when it is a TTY: the units
    (tasks) of the active stages done of all, the rows written so far, their rate, the time."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def run():
        written: dict[int, int] = {}  # stage id -> output records, finished stages kept
        shown = False
        while not done.wait(0.5):
            try:
                stages = _stages(spark)
            except Exception:  # the JVM is going away
                break
            if not stages:
                continue
            for sid, *_, rows in stages:
                written[sid] = max(written.get(sid, 0), rows)
            tasks = sum(s[1] for s in stages)
            finished = sum(s[2] for s in stages)
            running = sum(s[3] for s in stages)
            rows = sum(written.values())
            took = time.monotonic() - start
            stream.write(
                f"\r\x1b[K{prog}: {finished}/{tasks} units done, {running} running, "
                f"{rows:,} rows written ({_rate(rows / took if took else 0)} rows/s), "
                f"{took:.0f}s"
            )
            stream.flush()
            shown = True
        if shown:
            stream.write("\r\x1b[K")
            stream.flush()

    thread = threading.Thread(target=run, name="pgcdc-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(2)
