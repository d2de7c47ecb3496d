"""Prune a capture directory: delete the segments every change of which is applied.

    from pgcdc.capture.prune import prune, applied_position
    plan = prune("cap", applied_position("tables", "cap"), dry_run=True)
    print(plan.delete)        # the segment files that would go

A segment goes when all of these hold:

* it lies before the segment state.json names (the last durable one, which a running capture
  appends to): everything in it is durable, and no capture writes to it again;
* every transaction it holds committed at or before the applied position (the commit LSN of
  the last applied transaction, what ``pgcdc apply`` records as ``applied_lsn``);
* every transaction prepared in it (two-phase) was committed at or before that position, or
  rolled back, in a segment that goes too;
* so did every segment before it: only a prefix of the segments goes, oldest first, so a
  directory pruned halfway (a crash) is as valid as one pruned in full.

Never pruned: the segment a capture is writing, ``state.json``, ``catalog.jsonl`` and
``relations.jsonl`` (readers of the later segments need the relations and types the earlier
ones described). Readers (``pgcdc changes``, apply) read what is left: segments start at
transaction boundaries, and a run that starts past the applied position needs nothing before.

Run it between apply runs, not during one: a run that listed a segment before it was deleted
fails to open it (and a rerun works).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pgoutput_codec as pgc

from pgcdc.errors import SetupError
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.segments import _segment_records, durable_segments, read_state

APPLY_STATE_FILE = "_pgcdc_state.json"  # pgcdc.apply.state.STATE_FILE, read without Spark
# the tags (first payload byte) of the messages that carry a commit_lsn, a prepared gid, or
# roll one back
_COMMITS = frozenset(ord(m.TAG) for m in (pgc.Commit, pgc.StreamCommit, pgc.CommitPrepared))
_COMMIT_PREPARED = ord(pgc.CommitPrepared.TAG)
_PREPARES = frozenset(ord(m.TAG) for m in (pgc.Prepare, pgc.StreamPrepare))
_ROLLBACK = ord(pgc.RollbackPrepared.TAG)


class PruneError(SetupError, ValueError):
    """Nothing was deleted: the directory, or the applied state, cannot say what is safe."""


@dataclass
class Segment:
    """What pruning needs to know of one segment file."""

    path: Path
    size: int
    last_commit_lsn: int | None = None  # the highest commit LSN in it (None: no commit)
    prepared: set = field(default_factory=set)  # gids prepared in it
    committed: set = field(default_factory=set)  # gids committed (COMMIT PREPARED) in it
    rolled_back: set = field(default_factory=set)  # gids rolled back in it


@dataclass
class PrunePlan:
    directory: Path
    durable_lsn: int | None
    applied_lsn: int | None
    delete: list[Segment] = field(default_factory=list)
    keep: list[Path] = field(default_factory=list)
    stopped_at: str | None = None  # why the first kept segment is kept
    deleted: bool = False

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.delete)

    def to_json(self) -> dict:
        return {
            "directory": str(self.directory),
            "durable_lsn": None if self.durable_lsn is None else format_lsn(self.durable_lsn),
            "applied_lsn": None if self.applied_lsn is None else format_lsn(self.applied_lsn),
            "delete": [s.path.name for s in self.delete],
            "bytes": self.bytes,
            "keep": [p.name for p in self.keep],
            "stopped_at": self.stopped_at,
            "deleted": self.deleted,
        }


def scan_segment(path: Path) -> Segment:
    """The commit LSNs and two-phase gids of one (complete) segment."""
    seg = Segment(path, path.stat().st_size)
    commits, prepares = _COMMITS, _PREPARES
    for rec in _segment_records(path, last=False):
        data = rec.data
        tag = data[0]
        if tag not in commits and tag not in prepares and tag != _ROLLBACK:
            continue
        msg = pgc.decode(
            data,
            protocol_version=rec.protocol_version,
            streaming="parallel" if rec.parallel_streaming else _streaming(rec.protocol_version),
            in_stream=rec.in_stream,
        )
        if tag in commits:
            if seg.last_commit_lsn is None or msg.commit_lsn > seg.last_commit_lsn:
                seg.last_commit_lsn = msg.commit_lsn
            if tag == _COMMIT_PREPARED:
                seg.committed.add(msg.gid)
        elif tag in prepares:
            seg.prepared.add(msg.gid)
        else:
            seg.rolled_back.add(msg.gid)
    return seg


def _streaming(protocol_version: int) -> str:
    return "on" if protocol_version >= 2 else "off"  # what a Stream Commit needs to decode


def plan_prune(directory, applied_lsn: int | None) -> PrunePlan:
    """Which segments of ``directory`` may go, given everything up to ``applied_lsn`` (a
    commit LSN) is applied; reads the segments, deletes nothing."""
    files, state = durable_segments(directory)
    plan = PrunePlan(Path(directory), None if state is None else state.lsn, applied_lsn)
    if state is None:
        plan.keep = [p for p, _ in files]
        plan.stopped_at = "nothing is durable yet (no state.json)"
        return plan
    candidates = [p for p, _ in files[:-1]]  # never the segment state.json names
    open_gids: set = set()
    taken: list[Segment] = []
    cut = 0  # segments [0, cut) go
    if applied_lsn is None:
        plan.stopped_at = "nothing is applied yet"
    for i, path in enumerate(candidates if applied_lsn is not None else []):
        seg = scan_segment(path)
        if seg.last_commit_lsn is not None and seg.last_commit_lsn > applied_lsn:
            plan.stopped_at = (
                f"{path.name} holds a transaction committed at {format_lsn(seg.last_commit_lsn)}, "
                f"past the applied position {format_lsn(applied_lsn)}"
            )
            break
        open_gids |= seg.prepared
        open_gids -= seg.committed | seg.rolled_back
        taken.append(seg)
        if not open_gids:
            cut = i + 1
    else:
        if applied_lsn is not None:
            plan.stopped_at = (
                f"{files[-1][0].name} is the last durable segment (a capture writes it)"
            )
    if open_gids and cut < len(taken):
        plan.stopped_at = (
            f"{taken[cut].path.name} holds a prepared transaction not yet committed or rolled "
            "back by the applied position"
        )
    plan.delete = taken[:cut]
    gone = {s.path for s in plan.delete}
    plan.keep = [p for p, _ in files if p not in gone]
    return plan


def prune(directory, applied_lsn: int | None, *, dry_run: bool = False) -> PrunePlan:
    """:func:`plan_prune`, then delete the segments it names, oldest first (unless
    ``dry_run``), and make the deletions durable."""
    plan = plan_prune(directory, applied_lsn)
    if dry_run or not plan.delete:
        return plan
    for seg in plan.delete:
        seg.path.unlink()
    fd = os.open(plan.directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    plan.deleted = True
    return plan


def applied_position(state_dir, capture_dir=None) -> int | None:
    """The applied position (a commit LSN) an apply state directory records, or None when
    nothing is applied yet. With ``capture_dir``: PruneError when the state was applied from
    another source (server, database, slot) than the capture directory's."""
    path = Path(state_dir) / APPLY_STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise PruneError(
            f"{path}: not found (not an apply state, or nothing applied yet)"
        ) from None
    except (OSError, ValueError) as e:
        raise PruneError(f"{path}: unreadable ({e})") from None
    if capture_dir is not None:
        state = read_state(capture_dir)
        mine = (state.source or {}) if state is not None else {}
        theirs = doc.get("source") or {}
        keys = ("system_id", "database", "slot")
        if mine and theirs and any(mine.get(k) != theirs.get(k) for k in keys):
            raise PruneError(
                f"{path} was applied from another source ({_describe(theirs)}) than "
                f"{capture_dir} ({_describe(mine)}): its position says nothing of these segments"
            )
    applied = doc.get("applied_lsn")
    return parse_lsn(applied) if applied else None


def _describe(source: dict) -> str:
    return f"system {source.get('system_id')}, database {source.get('database')}, slot {source.get('slot')}"
