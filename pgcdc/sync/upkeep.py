"""``pgcdc sync``: the upkeep between cycles that keeps the tables cheap to read and the
directory small for months: a Delta checkpoint every CHECKPOINT_EVERY versions, a vacuum
every :func:`vacuum_every`, a warning when the retention would outgrow the disk, the applied
capture segments and loaded snapshots deleted (as ``pgcdc prune`` does), and the slot's
restart point moved along after a burst (:meth:`Upkeep.restart_point`)."""

from __future__ import annotations

import collections
import shutil
import time

import psycopg

from pgcdc.apply.vacuum import clean_log
from pgcdc.apply.vacuum import vacuum as vacuum_table
from pgcdc.capture.prune import PruneError, applied_position, prune
from pgcdc.capture.runner import human_bytes as _human
from pgcdc.sync.added import LOADED
from pgcdc.sync.config import RETAIN_LEAST

CHECKPOINT_EVERY = 100  # a Delta checkpoint every this many versions of a table
VACUUM_EVERY = 3600.0  # seconds between two vacuums of the tables at most (see vacuum_every)
LOG_RETENTION = 30 * 86400.0  # the log kept under --retain 0: Delta's logRetentionDuration
# the tables' files rewritten over this many seconds make the rate the disk check projects
REWRITE_WINDOW = 3600.0
DISK_WARN_EVERY = 3600.0  # seconds between two warnings that the retention outgrows the disk
# seconds between two prunes of the applied capture segments: every cycle plans over the
# segments left (their transactions), so few are kept
PRUNE_EVERY = 60.0
# a caught-up cycle logs a running-transactions record when the slot's restart_lsn trails the
# WAL by this much (what a restart's walsender would decode again)
RESTART_LAG = 1 << 20
RESTART_RECHECK = 1.0  # seconds: an idle cycle after that sees whether the record took


def vacuum_every(retain_hours: float) -> float:
    """Seconds between two vacuums: hourly, or a quarter of a shorter retention (a minute at
    least), so files past the retention stay on disk a quarter of it at most; hourly under
    --retain 0 (the log's cleanup only)."""
    if retain_hours <= 0:
        return VACUUM_EVERY
    return min(VACUUM_EVERY, max(60.0, retain_hours * 3600 / 4))


class Upkeep:
    """The upkeep of one sync's directory and slot (see the module docstring); ``sync``: a
    :class:`pgcdc.sync.pipeline.Sync`, of which it uses the public side."""

    def __init__(self, sync):
        self.sync = sync
        self.retain = sync.config.retain
        self.next_vacuum = time.monotonic() + vacuum_every(self.retain)
        self.rewrites: collections.deque = collections.deque()  # (time, table, bytes removed)
        self.next_disk_warning = 0.0
        self.next_prune = time.monotonic() + PRUNE_EVERY
        self.restart_points = True  # until the server refuses pg_log_standby_snapshot()
        self.next_restart_check = float("inf")  # an idle cycle's look at the restart point

    def maintain(self, written) -> None:
        """Keep the tables cheap to read for months: a checkpoint every CHECKPOINT_EVERY
        versions (readers replay the log from the last one: one commit per cycle adds up),
        a vacuum of the files removed more than --retain hours ago and of the log before them
        every :func:`vacuum_every` (a cycle that changes keys everywhere rewrites the whole
        table; a cycle a second adds 86,400 commits a day, which delta-rs lists at each open),
        and a warning when that retention would outgrow the disk (:meth:`check_disk`).

        The log is cleaned here only: sync's commits turn off delta-rs's cleanup after each
        commit, which reads the whole log every time (0.45 s a commit at 86,400 commits).
        Under --retain 0 (no vacuum) the log keeps Delta's default log retention,
        LOG_RETENTION, as delta-rs's cleanup did."""
        s = self.sync
        now = time.monotonic()
        doc = s.applied_doc() or {}
        entries = {n: (doc.get("tables") or {}).get(n) or {} for n in written}
        versions = {n: e.get("version") for n, e in entries.items()}
        for name, entry in entries.items():  # the cycle's commit of each table it wrote
            if entry.get("bytes_removed"):
                self.rewrites.append((now, name, entry["bytes_removed"]))
                if s.metrics is not None:
                    s.metrics.rewritten_bytes += entry["bytes_removed"]
        due = now >= self.next_vacuum
        vacuum = self.retain > 0 and due
        log_keep = self.retain * 3600 if self.retain > 0 else LOG_RETENTION
        self.prune_when_due()
        for name in sorted(doc.get("tables") or {}) if due else sorted(written):
            if name in s.aside.names:
                continue  # (its Delta table may be what is wrong with it)
            path = s.out / name
            try:
                version = versions.get(name)
                if version and version % CHECKPOINT_EVERY == 0:
                    from deltalake import DeltaTable  # lazy: deltalake

                    DeltaTable(str(path)).create_checkpoint()
                if due:
                    t0 = time.monotonic()
                    gone = vacuum_table(str(path), self.retain * 3600) if vacuum else []
                    logs = clean_log(str(path), log_keep)
                    if gone or logs:
                        took = time.monotonic() - t0
                        s.log.event("info", "vacuum", f"{name}: {len(gone)} data file(s) "
                                    f"and {logs} log file(s) no version of the last "
                                    f"{log_keep / 3600:g}h uses deleted in {took:.1f}s",
                                    table=name, files=len(gone), log_files=logs,
                                    took_s=round(took, 3))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - upkeep: the next cycle tries again
                s.log.event("warning", "maintain", f"{name}: {e}", table=name)
        if due:
            self.next_vacuum = time.monotonic() + vacuum_every(self.retain)

    def idle_due(self) -> bool:
        """Whether :meth:`idle` has something to do now."""
        now = time.monotonic()
        return now >= self.next_prune or now >= self.next_restart_check

    def idle(self) -> None:
        """What a moment with nothing to apply does (the loop's idle cycle, the query's watch
        between batches): prune the applied segments when due, and look again a second after
        a burst's end whether the slot's restart point took (:meth:`restart_point`)."""
        self.prune_when_due()
        if time.monotonic() >= self.next_restart_check:
            self.restart_point(again=True)  # did the last record take?

    def prune_when_due(self) -> None:
        """Prune the applied segments and look at the disk, once a minute (and once a rerun
        has caught up): after a cycle, whether it applied anything or not."""
        if time.monotonic() >= self.next_prune:
            if not self.sync.config.keep_segments:
                self.prune()
            self.check_disk()
            self.next_prune = time.monotonic() + PRUNE_EVERY

    def check_disk(self) -> None:
        """Warn (once an hour at most) when the files the cycles rewrite, kept for --retain
        (a day when never vacuumed), would take more than half the free space of DIR's disk:
        copy-on-write tables whose updates fall all over them keep a table's size per
        cycle."""
        s = self.sync
        now = time.monotonic()
        while self.rewrites and self.rewrites[0][0] < now - REWRITE_WINDOW:
            self.rewrites.popleft()
        if not self.rewrites or now < self.next_disk_warning:
            return
        span = now - self.rewrites[0][0]
        if span < PRUNE_EVERY:
            return  # too short to tell a rate
        per_table = collections.Counter()
        for _t, name, n in self.rewrites:
            per_table[name] += n
        rate = sum(per_table.values()) / span
        retain = self.retain * 3600
        kept = rate * (retain + vacuum_every(self.retain) if retain > 0 else 86400)
        try:
            free = shutil.disk_usage(s.out).free
        except OSError:
            return
        if kept <= free / 2:
            return
        self.next_disk_warning = now + DISK_WARN_EVERY
        top, top_bytes = per_table.most_common(1)[0]
        if retain > 0:
            held = f"kept for --retain {self.retain:g}h"
            fix = f"use a shorter --retain (down to {RETAIN_LEAST:g}) or a longer --trigger"
        else:
            held = "a day of it kept (--retain 0 never vacuums)"
            fix = f"give a --retain ({RETAIN_LEAST:g} at least) or a longer --trigger"
        s.log.event(
            "warning", "disk",
            f"cycles rewrite {_human(rate)}/s of table files ({top}: {_human(top_bytes / span)}/s; "
            f"updates all over a table rewrite it whole); {held}, that is about {_human(kept)} "
            f"on disk, and {s.out}'s disk has {_human(free)} free: {fix}",
            rewrite_bytes_per_s=round(rate), kept_bytes=round(kept), free_bytes=free, table=top,
        )  # fmt: skip

    def prune(self) -> None:
        """Delete the capture's segments every table has applied (pgcdc prune)."""
        s = self.sync
        if s.adding is not None:
            return  # the load reads the captures from the added snapshot's point: kept
        try:
            plan = prune(s.capture_dir, applied_position(s.out, s.capture_dir))
        except (PruneError, OSError) as e:
            s.log.event("warning", "prune", f"capture segments not pruned: {e}")
            return
        if plan.delete:
            s.log.event("info", "prune", f"{len(plan.delete)} applied capture segment(s), "
                        f"{_human(plan.bytes)}, deleted", segments=len(plan.delete),
                        bytes=plan.bytes)  # fmt: skip
        self.drop_loaded_snapshots()

    def drop_loaded_snapshots(self) -> None:
        """Delete the rows of the snapshots every table has loaded (the initial one, those of
        tables added later): the Delta tables hold them now, and once the capture's segments
        after them are pruned they can rebuild nothing, while a snapshot is a copy of its
        tables (the whole database, for the initial one). Each keeps its ``_snapshot.json``
        (point, tables, keys, OIDs: what the checks read). ``--keep-segments`` keeps them
        whole (the snapshot and every segment rebuild the tables)."""
        s = self.sync
        if s.adding is not None:
            return  # (its load reads its snapshot)
        done = []
        if (s.snapshot_dir / "_snapshot.json").exists() and not s.snapshot_pending():
            done.append(s.snapshot_dir)
        added = sorted(s.added_dir.iterdir()) if s.added_dir.is_dir() else []
        done += [d for d in added if (d / LOADED).exists()]
        freed, tables = 0, []
        for d in done:
            for t in sorted(p for p in d.iterdir() if p.is_dir() and "." in p.name):
                freed += sum(f.stat().st_size for f in t.rglob("*") if f.is_file())
                shutil.rmtree(t)
                tables.append(t.name)
        if tables:
            s.log.event("info", "snapshot_pruned", f"the rows of {len(tables)} loaded "
                        f"snapshot table(s), {_human(freed)}, deleted: the Delta tables "
                        "hold them", tables=tables, bytes=freed)  # fmt: skip

    def restart_point(self, again: bool = False) -> None:
        """Caught up: when the slot's restart_lsn trails the server's WAL by RESTART_LAG or
        more, log a running-transactions record (``pg_log_standby_snapshot()``, PostgreSQL
        16+), which the capture's next confirms move restart_lsn to. The server logs one
        only every 15 s of activity (and at checkpoints), so a sync stopped within that of a
        burst's end had the next walsender decode the burst again from before its start (a
        slot created at its start logs one there: 0.2-0.3 s of a 200,000-change rerun).
        Refused (an older server, a role without the grant, a standby): once is enough.

        The server keeps one candidate restart point at a time: a record decoded while the one
        before it still waits for a confirm (one logged at the burst's start, when the burst
        was applied in a single cycle) is passed over. So an idle cycle a second later looks
        ``again``, once, and logs another if restart_lsn still trails (it may for good: a
        transaction left open holds the restart point where it began)."""
        s = self.sync
        self.next_restart_check = float("inf")
        if not self.restart_points:
            return
        rows = s.query(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8"
            " FROM pg_replication_slots WHERE slot_name = %s",
            [s.config.slot],
        )
        if not rows or rows[0][0] is None or rows[0][0] < RESTART_LAG:
            return
        try:
            s.connection().execute("SELECT pg_log_standby_snapshot()")
            if not again:
                self.next_restart_check = time.monotonic() + RESTART_RECHECK
        except psycopg.Error as e:
            self.restart_points = False
            s.log.event("info", "restart_points", "the slot's restart point follows the "
                        "server's own running-transactions records (every 15 s of "
                        f"activity): {str(e).strip().splitlines()[0]}")  # fmt: skip
