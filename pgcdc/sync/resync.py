"""``pgcdc sync --on-invalid-slot resync``: a new slot and a new snapshot for a directory
whose slot the server invalidated (``wal_status = lost``) or dropped, swapped into the
existing Delta tables one commit per table.

The changes between the tables' applied position and now are gone from the server, so the
tables cannot be brought up to date from the slot; they can be from a new snapshot. In order:

1. ``DIR/_resync.json`` (the marker) says a resync is under way, from which applied position
   and why; a ``resync`` log event says it too;
2. the capture process is stopped (it has usually ended: the slot is gone), the old slot is
   dropped when it still exists (an invalidated slot can be), and ``DIR/_capture``,
   ``DIR/_snapshot``, ``DIR/_snapshot_added`` and ``DIR/_published.json`` are moved to
   ``DIR/_resync_old/<when>/``;
3. the initial snapshot's code takes a new snapshot into ``DIR/_snapshot`` (the slot created
   again with an exported snapshot, every published table read at it);
4. apply loads it into staged Delta tables (``DIR/_resync_stage/``: the shape and types an
   initial load has), and each staged table replaces ``DIR/<schema>.<table>/`` in ONE Delta
   commit (an overwrite: every current file removed, the staged ones added, the
   ``pgcdc-apply`` transaction set to just before the new consistent point); a reader sees the old
   version or the new one, and time travel reaches the old ones;
5. apply's summary (``_pgcdc_state.json``) is applied up to the new consistent point, the
   marker goes, then ``DIR/_resync_old`` and the stage.

The new consistent point is past every position the old slot reached (the new slot is created
after), so apply's rule, skip a table's changes at or before its position, holds: the new
capture (from the consistent point) holds every change the snapshot does not.

Killed at any point, a rerun sees the marker and finishes the resync: with the new snapshot
complete and its slot alive, from the swap (tables already at the new point are left as they
are); else from the start (the new slot of an unfinished snapshot is dropped). SCD2 tables
are refused (see :func:`pgcdc.sync.config.scd2_refusal`): their history would miss the versions of the rows
while the slot was lost.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pgcdc.apply import delta
from pgcdc.apply.run import apply_changes
from pgcdc.apply.state import STATE_FILE, applied_before, applied_lsn
from pgcdc.durable import fsync_dir, write_json
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.sync.added import MEMBERSHIP

MARKER = "_resync.json"
OLD = "_resync_old"
STAGE = "_resync_stage"
SLOT_PATIENCE = 30.0  # seconds to wait for the old slot's walsender to go before ending it


def under_way(out: Path) -> dict | None:
    """The marker of a resync under way in ``out``, or None."""
    try:
        return json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None


def tidy(out: Path) -> None:
    """What a finished resync killed before its clean-up left (no marker: it committed)."""
    if under_way(out) is None:
        for name in (OLD, STAGE):
            shutil.rmtree(out / name, ignore_errors=True)


def resync(sync, reason: str) -> int:
    """Resync ``sync``'s directory (a :class:`pgcdc.sync.pipeline.Sync` with Spark started)
    from a new slot and snapshot; returns the new consistent point, the capture's start."""
    return _Resync(sync).run(reason)


class _Resync:
    def __init__(self, sync):
        self.sync, self.log, self.out = sync, sync.log, sync.out
        self.slot = sync.config.slot
        self.moved = [d.name for d in (sync.capture_dir, sync.snapshot_dir, sync.added_dir)]
        self.moved.append(MEMBERSHIP)  # the new snapshot's record is what the checks compare
        self.manifest = sync.snapshot_dir / "_snapshot.json"

    def run(self, reason: str) -> int:
        t0 = time.monotonic()
        doc = under_way(self.out)
        resumed = doc is not None
        if doc is None:
            doc = {"slot": self.slot, "reason": reason, "old_applied_lsn": self._applied(),
                   "old": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), "phase": "prepare",
                   "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
            self._write(doc)
        where = doc.get("old_applied_lsn")
        text = (f"{reason}: resyncing {self.out} from a new slot {self.slot} and a new "
                f"snapshot (the tables stay at {where or 'their state'} until each is "
                "replaced in one commit)")  # fmt: skip
        if resumed:
            text = f"resuming the resync under way in {self.out} ({doc.get('reason')})"
        self.log.event("warning", "resync", text, reason=doc.get("reason"), slot=self.slot,
                       applied_lsn=where, resumed=resumed)  # fmt: skip
        self._stop_capture()
        if not self._snapshot_ready(doc):
            self._prepare(doc)
            point = self.sync.take_snapshot(
                f"resync: taking a new snapshot of {','.join(self.sync.pubs)} into "
                f"{self.sync.snapshot_dir} (slot {self.slot} created again)"
            )
            doc.update(phase="swap", consistent_point=format_lsn(point))
            self._write(doc)
        point = parse_lsn(json.loads(self.manifest.read_text())["consistent_point"])
        tables = self._swap(point)
        self.sync.aside.taken_up(self.sync, list(tables))  # (a new snapshot of each)
        self._finish(doc)
        took = time.monotonic() - t0
        self.log.event("info", "resync_done", f"resync: {len(tables)} table(s) replaced by the "
                       f"snapshot at {format_lsn(point)} in {took:.1f}s; the capture starts "
                       "there", tables=tables, consistent_point=format_lsn(point),
                       old_applied_lsn=where, took_s=round(took, 2))  # fmt: skip
        return point

    # -- the steps --------------------------------------------------------------------------

    def _applied(self) -> str | None:
        """The position the tables are current to: apply's, or the snapshot's when no
        change was applied since it was loaded."""
        text = applied_lsn(self.out)
        point = max(parse_lsn(text) if text else 0, self.sync.consistent_point())
        return format_lsn(point) if point else None

    def _write(self, doc: dict) -> None:
        write_json(self.out / MARKER, doc)

    def _stop_capture(self) -> None:
        cap = self.sync.capture
        if cap is not None:
            cap.stop()
            cap.wait(60)

    def _snapshot_ready(self, doc: dict) -> bool:
        """The new snapshot is complete and its slot alive: only the swap is left."""
        if doc.get("phase") != "swap" or not self.manifest.exists():
            return False
        snap = json.loads(self.manifest.read_text())
        if snap.get("consistent_point") != doc.get("consistent_point"):
            return False
        health = self.sync.health()
        if health is None:
            self.sync.connection()  # cannot ask: raises with the server's reason
        return health.exists and not health.invalidated

    def _prepare(self, doc: dict) -> None:
        """Drop the slot (the old one, or a new one whose snapshot did not finish) and move
        the directory's capture and snapshots aside."""
        self._drop_slot()
        old = self.out / OLD / doc["old"]
        for name in self.moved:
            src = self.out / name
            if not src.exists():
                continue
            old.mkdir(parents=True, exist_ok=True)
            dst, n = old / name, 1
            while dst.exists():
                dst, n = old / f"{name}.{n}", n + 1
            os.rename(src, dst)
        fsync_dir(self.out)
        doc["phase"] = "snapshot"
        doc.pop("consistent_point", None)
        self._write(doc)

    def _drop_slot(self) -> None:
        import psycopg

        conn = self.sync.connection()
        deadline = time.monotonic() + SLOT_PATIENCE
        while True:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                               [self.slot]).fetchone()  # fmt: skip
            if row is None:
                return
            if row[0] is None:
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", [self.slot])
                    return
                except (psycopg.errors.ObjectInUse, psycopg.errors.UndefinedObject):
                    continue  # taken or dropped meanwhile: look again
            if time.monotonic() >= deadline:  # a walsender left over (a killed sync's)
                conn.execute("SELECT pg_terminate_backend(%s)", [row[0]])
            time.sleep(0.2)

    def _swap(self, point: int) -> dict:
        """Each table of the new snapshot replaced (or created) in one Delta commit; {table:
        rows}. Tables a killed run already swapped are left as they are."""
        stage = self.out / STAGE
        shutil.rmtree(stage, ignore_errors=True)
        apply_changes(self.sync.spark, [], str(stage), scd=1, snapshot=str(self.sync.snapshot_dir))
        try:
            staged = json.loads((stage / STATE_FILE).read_text())
        except FileNotFoundError:  # nothing published: nothing staged
            staged = {"tables": {}}
        doc = self.sync.applied_doc()
        if doc is None:
            doc = {k: staged[k] for k in ("format", "layout", "version", "scd") if k in staged}
            doc["tables"] = {}
        doc["tables"] = dict(doc.get("tables") or {})
        text = format_lsn(point)
        position = applied_before(point)  # a transaction committing at the point is the slot's
        applied = format_lsn(position)
        run = f"pgcdc-resync-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        done = {}
        for name, entry in sorted(staged["tables"].items()):
            uri = str(self.out / name)
            if delta.is_delta_table(uri) and (delta.position(uri) or 0) >= position:
                version = delta.open_table(uri).version()  # swapped before a kill
            else:
                meta = {"pgcdc.run": run, "pgcdc.table": name, "pgcdc.commit_lsn": applied,
                        "pgcdc.tx_ordinal": 0, "pgcdc.resync": text}  # fmt: skip
                version = delta.replace_with_table(uri, str(stage / name), app_version=position,
                                                   metadata=meta)  # fmt: skip
            rows = sum(r or 0 for _p, _s, r in delta.current_files(uri))
            doc["tables"][name] = {**entry, "version": version, "rows": rows}
            done[name] = rows
        doc["applied_lsn"] = applied
        doc["resync"] = {"consistent_point": text, "finished_at":
                         time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        write_json(self.out / STATE_FILE, doc)
        return done

    def _finish(self, doc: dict) -> None:
        shutil.rmtree(self.out / STAGE, ignore_errors=True)
        (self.out / MARKER).unlink()
        fsync_dir(self.out)
        shutil.rmtree(self.out / OLD, ignore_errors=True)
