"""``pgcdc sync`` held under a steady load for minutes: does anything grow?

A PostgreSQL 18 of the test harness with production decoding settings; ``pgcdc sync
--trigger 1s --master local[2]`` as a subprocess (``bench.sync_bench.SyncProcess``), started
on an empty published table and waited for until ``ready``. Then ``--rate`` changes/s (default
2,000) for ``--minutes`` (default 10): a transaction of ``--tx-rows`` changes (4/5 inserts, 1/5
updates of earlier rows) every ``tx-rows / rate`` seconds, as ``bench.sync_bench``'s latency
part offers them. Every ``--every`` seconds (default 60) one row:

- the resident memory (RSS) of sync's process, its capture child, the Spark JVM and Spark's
  Python workers (found under sync's process by their command lines);
- the cycles of the interval: how many, the median and longest ``took_s``, and the median
  commit-to-visible latency of the interval's transactions (each transaction's
  ``pg_current_wal_insert_lsn()`` before its COMMIT, against the first ``apply`` line past it);
- the Delta table: its version, its data files, and the table directory's bytes; the capture
  directory's bytes (segments are pruned once applied).

At the end the load stops, sync applies up to the last commit, and the Delta table is checked
against the server (rows, sum of the updated column); sync is stopped with SIGTERM (exit 0).
The machine is shared: each row carries the 1-minute load average.

``--retain HOURS`` is passed to sync (its vacuum; default sync's 24); the vacuums and disk
warnings sync logged are printed at the end.

    python -m bench.sync_soak [--minutes M] [--rate N] [--tx-rows N] [--every S] [--retain H]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from .sync_bench import (
    LAT_TABLE,
    READY_TIMEOUT,
    BenchError,
    SyncProcess,
    _lsn,
    _pct,
    delta_rows,
    load,
    offer_transaction,
    visible_at,
)

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_by_role(root: int) -> dict[str, int]:
    """Resident bytes of ``root`` and its descendants, summed by role."""
    from .sync_matrix import descendants

    out = {"sync": 0, "capture": 0, "jvm": 0, "spark python": 0, "other": 0}
    for pid in [root, *descendants(root)]:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if pid == root:
            role = "sync"
        elif "pgcdc.sync.child" in cmd:
            role = "capture"
        elif "java" in cmd.split(" ")[0]:
            role = "jvm"
        elif "pyspark" in cmd or "pgcdc-spark-python" in cmd:
            role = "spark python"
        else:
            role = "other"
        out[role] += pages * PAGE
    return out


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def table_state(path: Path) -> tuple[int, int, int]:
    """(version, data files, bytes of the table directory) of a Delta table."""
    from deltalake import DeltaTable

    try:
        t = DeltaTable(str(path))
        return t.version(), len(t.file_uris()), _dir_bytes(path)
    except Exception:  # noqa: BLE001 - not yet created, or mid-commit: say so in the row
        return -1, -1, _dir_bytes(path)


class Writer:
    """The steady load, in a thread: (commit time, LSN before the COMMIT) per transaction."""

    def __init__(self, srv, rate: int, tx_rows: int):
        self.srv, self.period, self.tx_rows = srv, tx_rows / rate, tx_rows
        self.commits: list[tuple[float, int]] = []
        self.late = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)

    def _run(self) -> None:
        rng = random.Random(1)
        try:
            with self.srv.connect() as w:
                next_id, t0, k = 1, time.monotonic(), 0
                while not self.stop.is_set():
                    delay = t0 + k * self.period - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -self.period:
                        self.late += 1
                    k += 1
                    next_id = offer_transaction(w, rng, next_id, self.tx_rows, 0, self.commits)
        except BaseException as e:  # noqa: BLE001 - said by the main thread
            self.error = e


def latencies(commits, applies) -> list[float]:
    """Each transaction's seconds from its commit to the first apply line past its LSN
    (transactions no line has passed yet are left out)."""
    return [applies[j][0] - t_commit for t_commit, j in visible_at(commits, applies)]


def run(minutes: float, rate: int, tx_rows: int, every: float, trigger: str, master: str,
        retain: float | None = None):  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from tests.postgres import servers

    tmp = Path(tempfile.mkdtemp(prefix="pgcdc-syncsoak-"))
    mib = 1 << 20
    print(f"pgcdc sync soak: {minutes:g} min at {rate:,} changes/s (transactions of {tx_rows}), "
          f"--trigger {trigger}, --master {master} (load {load()})")  # fmt: skip
    head = (f"{'min':>5}{'sync':>7}{'capture':>8}{'jvm':>7}{'workers':>8}{'cycles':>7}"
            f"{'took p50':>9}{'took max':>9}{'lat p50':>8}{'lat max':>8}{'version':>8}"
            f"{'files':>6}{'table MiB':>10}{'capture MiB':>12}{'load':>6}")  # fmt: skip
    try:
        with servers.running_server("pg18", servers.PRODUCTION_DECODING) as srv, \
                srv.connect() as conn:  # fmt: skip
            conn.execute(LAT_TABLE)
            conn.execute("CREATE PUBLICATION soak_pub FOR TABLE lat_t")
            out = tmp / "soak"
            extra = () if retain is None else ("--retain", f"{retain:g}")
            sync = SyncProcess(srv.conninfo(), "soak_pub", "soak", out, trigger, master, *extra)
            try:
                sync.wait(lambda d: d.get("event") == "ready", READY_TIMEOUT, "ready")
                first_line = len(sync.lines)
                writer = Writer(srv, rate, tx_rows)
                writer.thread.start()
                t0 = time.monotonic()
                print("RSS in MiB; cycles, took and latency (s) of the interval")
                print(head)
                seen_applies, seen_commits = 0, 0
                k = 1
                while time.monotonic() - t0 < minutes * 60:
                    time.sleep(max(0.0, t0 + k * every - time.monotonic()))
                    if writer.error is not None or sync.proc.poll() is not None:
                        raise BenchError(f"load: {writer.error!r}; sync:\n{sync.tail()}")
                    rss = rss_by_role(sync.proc.pid)
                    applies = sync.applies(first_line)
                    new = applies[seen_applies:]
                    seen_applies = len(applies)
                    commits = writer.commits[seen_commits:]
                    lat = latencies(commits, applies)
                    seen_commits += len(lat)
                    took = [d["took_s"] for _t, d in new] or [0.0]
                    version, files, size = table_state(out / "public.lat_t")
                    print(f"{k * every / 60:>5.1f}{rss['sync'] / mib:>7.0f}"
                          f"{rss['capture'] / mib:>8.0f}{rss['jvm'] / mib:>7.0f}"
                          f"{rss['spark python'] / mib:>8.0f}{len(new):>7}"
                          f"{statistics.median(took):>9.2f}{max(took):>9.2f}"
                          f"{_pct(lat, 0.5) if lat else float('nan'):>8.2f}"
                          f"{max(lat) if lat else float('nan'):>8.2f}{version:>8}{files:>6}"
                          f"{size / mib:>10.1f}{_dir_bytes(out / '_capture') / mib:>12.1f}"
                          f"{load():>6}", flush=True)  # fmt: skip
                    k += 1
                writer.stop.set()
                writer.thread.join(30)
                last = writer.commits[-1][1]
                sync.wait(lambda d: d.get("event") == "apply" and _lsn(d["applied_lsn"]) > last,
                          120, "apply line covering the last transaction", first_line)  # fmt: skip
                server = conn.execute("SELECT count(*), coalesce(sum(v), 0) FROM lat_t").fetchone()
                table = delta_rows(out / "public.lat_t")
                got = (table.num_rows, sum(table.column("v").to_pylist()))
                code = sync.stop()
                said = collections.Counter(d.get("event") for _t, d in sync.lines)
                for t, d in sync.lines:
                    if d.get("event") in ("disk", "vacuum"):
                        print(f"at {(t - t0) / 60:.1f} min: {d.get('message')}")
            finally:
                sync.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(writer.commits)
    print(f"{n:,} transactions ({n * tx_rows:,} changes, {writer.late} more than one period "
          f"late); Delta table (rows, sum v) {got}, server {tuple(server)}; exit {code}; "
          f"{said['vacuum']} vacuum(s), {said['disk']} disk warning(s)")  # fmt: skip
    if tuple(server) != got or code != 0:
        raise BenchError("the soak's table differs from the server, or sync did not exit 0")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sync_soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=2000, help="changes offered per second")
    p.add_argument("--tx-rows", type=int, default=50, help="changes per transaction")
    p.add_argument("--every", type=float, default=60.0, help="seconds between two rows")
    p.add_argument("--trigger", default="1s", help="pgcdc sync --trigger")
    p.add_argument("--master", default="local[2]", help="pgcdc sync --master")
    p.add_argument("--retain", type=float, help="pgcdc sync --retain (default sync's)")
    a = p.parse_args(argv)
    run(a.minutes, a.rate, a.tx_rows, a.every, a.trigger, a.master, a.retain)


if __name__ == "__main__":
    main()
