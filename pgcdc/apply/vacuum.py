"""Delete what a Delta table no longer needs past a retention: the data files no version of
the last ``retain`` seconds uses (:func:`vacuum`) and the log before them (:func:`clean_log`).

delta-rs's ``vacuum`` takes its retention in whole hours. A table that sync rewrites every
second (updates in every file) keeps an hour of rewrites that way, the table's size times
3,600, so under an hour the files to keep are worked out here, by Delta's own rule: a file
removed at time ``t`` may go once ``t`` is older than the retention. The files of the version
that was current at the cut-off and every file added since hold every removed file whose
removal is younger than the cut-off (and no other removed file), so those are kept; of the
files delta-rs itself lists as removed (its ``vacuum`` with no retention, dry run), the others
are deleted. Either way, the directories a cycle's files were written in (one per write) go
when empty.

The log: a cycle a second adds 86,400 commits a day to ``_delta_log``, and delta-rs lists that
directory each time it opens the table (65 ms an open at 100,000 commits, 3 ms at a few; a
cycle opens its tables several times). Versions older than the retention cannot be read
anyway once their files are vacuumed, so the commits and checkpoints before the last
checkpoint at or before the version current at the cut-off are deleted: every version from
there on still reads, from that checkpoint and the commits after it.
"""

from __future__ import annotations

import json
import math
import re
import time
from urllib.parse import unquote

from pgcdc.apply import delta

HOUR = 3600.0
LOG = "_delta_log"
_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(?:\.\d+\.\d+)?\.parquet)$")


def vacuum(uri: str, retain: float, *, now: float | None = None) -> list[str]:
    """Delete the files of the Delta table at ``uri`` that no version of the last ``retain``
    seconds uses (one hour and more: delta-rs's vacuum, rounded up to whole hours); the paths
    deleted, relative to the table."""

    dt = delta.open_table(uri)
    fs, root = delta.filesystem(uri)
    if retain >= HOUR:
        gone = dt.vacuum(retention_hours=math.ceil(retain / HOUR), enforce_retention_duration=False,
                         dry_run=False)  # fmt: skip
    else:
        gone = _within_the_hour(uri, dt, fs, root, retain, time.time() if now is None else now)
    if not delta.is_remote(uri):
        _drop_empty_dirs(fs, root, {p.rpartition("/")[0] for p in gone} - {""})
    return gone


def _within_the_hour(uri, dt, fs, root, retain: float, now: float) -> list[str]:
    """The removed files whose removal is older than ``now - retain``, deleted."""
    from pyarrow import fs as pafs

    cut = version_at(fs, root, (now - retain) * 1000)
    if cut is None:
        return []  # every version is younger than the retention
    removed = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True)
    if not removed:
        return []
    keep = {unquote(p) for p, _s, _r in delta.current_files(uri, delta.open_table(uri, cut))}
    keep |= added_since(fs, root, cut, dt.version())
    # delta-rs lists a removed file until its tombstone expires, deleted or not
    doomed = [p for p in removed if unquote(p) not in keep]
    infos = fs.get_file_info([f"{root}/{p}" for p in doomed])
    gone = []
    for path, info in zip(doomed, infos):
        if info.type == pafs.FileType.NotFound:
            continue
        try:
            fs.delete_file(f"{root}/{path}")
        except FileNotFoundError:
            continue
        gone.append(path)
    return gone


def clean_log(uri: str, retain: float, *, now: float | None = None) -> int:
    """Delete the log files (commits, checkpoints) of the Delta table at ``uri`` before the
    last checkpoint at or before the version current ``retain`` seconds ago (one hour and
    more: rounded up to whole hours, as :func:`vacuum`); how many were deleted."""

    if retain >= HOUR:
        retain = math.ceil(retain / HOUR) * HOUR
    now = time.time() if now is None else now
    fs, root = delta.filesystem(uri)
    files = log_files(fs, root)
    cut = version_at(fs, root, (now - retain) * 1000, files)
    if cut is None:
        return 0
    checkpoints = [v for v, kind, _n in files if kind != "json" and kind != "crc" and v <= cut]
    if not checkpoints:
        return 0
    base = max(checkpoints)
    doomed = [name for v, _kind, name in files if v < base]
    for name in doomed:
        try:
            fs.delete_file(f"{root}/{LOG}/{name}")
        except FileNotFoundError:
            pass
    return len(doomed)


def log_files(fs, root: str) -> list[tuple[int, str, str]]:
    """(version, kind, file name) of the table's log files, by version: kind ``json``,
    ``crc`` or ``checkpoint...parquet``."""
    from pyarrow import fs as pafs

    out = []
    for info in fs.get_file_info(pafs.FileSelector(f"{root}/{LOG}")):
        m = _LOG_FILE.match(info.base_name)
        if m:
            out.append((int(m.group(1)), m.group(2), info.base_name))
    return sorted(out)


def version_at(fs, root: str, at_ms: float, files=None) -> int | None:
    """The version current at ``at_ms`` (the last one whose commit time is at or before it),
    or None when the oldest commit in the log is younger: a binary search over the commits'
    times (sync's commits are its only ones, in time order)."""
    versions = sorted(v for v, kind, _n in (files or log_files(fs, root)) if kind == "json")
    if not versions or _commit_ms(fs, root, versions[0]) > at_ms:
        return None
    lo, hi = 0, len(versions) - 1  # versions[lo] is at or before at_ms
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _commit_ms(fs, root, versions[mid]) <= at_ms:
            lo = mid
        else:
            hi = mid - 1
    return versions[lo]


def _actions(fs, root: str, version: int) -> list[dict]:
    """The actions of one commit (its JSON file, a line each)."""
    with fs.open_input_stream(f"{root}/{LOG}/{version:020d}.json") as fh:
        return [json.loads(line) for line in fh.read().decode().splitlines() if line.strip()]


def _commit_ms(fs, root: str, version: int) -> float:
    """A commit's time: its ``commitInfo`` timestamp, else the file's modification time."""
    for action in _actions(fs, root, version):
        info = action.get("commitInfo")
        if info is not None and info.get("timestamp") is not None:
            return float(info["timestamp"])
    return fs.get_file_info(f"{root}/{LOG}/{version:020d}.json").mtime.timestamp() * 1000


def added_since(fs, root: str, version: int, latest: int) -> set[str]:
    """Paths (decoded) of the files that the commits after ``version`` up to ``latest`` add."""
    return {
        unquote(action["add"]["path"])
        for v in range(version + 1, latest + 1)
        for action in _actions(fs, root, v)
        if "add" in action
    }


def _drop_empty_dirs(fs, root: str, dirs: set[str]) -> None:
    """The directories (a run's files each get one) that the deletion left empty."""
    from pyarrow import fs as pafs

    for d in sorted(dirs):
        try:
            if not fs.get_file_info(pafs.FileSelector(f"{root}/{d}")):
                fs.delete_dir(f"{root}/{d}")
        except OSError:
            pass
