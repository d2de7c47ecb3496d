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


def _stage_records(spark, sid: int) -> int:
    """The output records of stage ``sid``'s last attempt (0 once the store has let it go)."""
    try:
        return spark.sparkContext._jsc.sc().statusStore().lastStageAttempt(sid).outputRecords()
    except Exception:
        return 0


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
        open_ids: set[int] = set()  # stages seen active whose final count is not read yet
        shown = False
        while True:
            last = done.wait(0.5)
            try:
                stages = _stages(spark)
                # a stage that ended between two looks: its last tasks' records count too
                for sid in open_ids - {s[0] for s in stages}:
                    written[sid] = max(written.get(sid, 0), _stage_records(spark, sid))
                    open_ids.discard(sid)
            except Exception:  # the JVM is going away
                break
            for sid, *_, rows in stages:
                written[sid] = max(written.get(sid, 0), rows)
                open_ids.add(sid)
            rows = sum(written.values())
            took = time.monotonic() - start
            counts = f"{rows:,} rows written ({_rate(rows / took if took else 0)} rows/s), "
            if stages:
                tasks = sum(s[1] for s in stages)
                finished = sum(s[2] for s in stages)
                running = sum(s[3] for s in stages)
                line = f"{finished}/{tasks} units done, {running} running, {counts}"
            elif last and shown:  # Spark is through: the final count, before the summary
                line = f"all units done, {counts}"
            else:
                line = ""
            if line:
                stream.write(f"\r\x1b[K{prog}: {line}{took:.0f}s")
                stream.flush()
                shown = True
            if last:
                break
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
