"""Delete a Delta table's data files that no version of the last ``retain`` seconds uses.

delta-rs's ``vacuum`` takes its retention in whole hours. A table that sync rewrites every
second (updates in every file) keeps an hour of rewrites that way, the table's size times
3,600, so under an hour the files to keep are worked out here, by Delta's own rule: a file
removed at time ``t`` may go once ``t`` is older than the retention. The files of the
version that was current at the cut-off and every file added since hold every removed file
whose removal is younger than the cut-off (and no other removed file), so those are kept; of the files delta-rs
itself lists as removed (its ``vacuum`` with no retention, dry run), the others are deleted.
Either way, the directories a cycle's files were written in (one per write) go when empty.
"""

from __future__ import annotations

import json
import math
import time
from urllib.parse import unquote

HOUR = 3600.0
LOG = "_delta_log"


def vacuum(uri: str, retain: float, *, now: float | None = None) -> list[str]:
    """Delete the files of the Delta table at ``uri`` that no version of the last ``retain``
    seconds uses (one hour and more: delta-rs's vacuum, rounded up to whole hours); the paths
    deleted, relative to the table."""
    from . import delta

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
    from . import delta

    cut = _version_at(dt, (now - retain) * 1000)
    if cut is None:
        return []  # every version is younger than the retention
    removed = dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True)
    if not removed:
        return []
    keep = {unquote(p) for p, _s, _r in delta.current_files(uri, delta.open_table(uri, cut))}
    keep |= added_since(uri, cut, dt.version())
    from pyarrow import fs as pafs

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


def _version_at(dt, at_ms: float) -> int | None:
    """The table's version current at ``at_ms`` (the last one committed by then), or None
    when the first version is younger. Reads only as much of the history as it needs."""
    limit = 256
    while True:
        history = dt.history(limit)  # newest first
        for entry in history:
            if entry.get("timestamp", 0) <= at_ms:
                return entry["version"]
        if len(history) < limit:
            return None
        limit *= 4


def added_since(uri: str, version: int, latest: int) -> set[str]:
    """Paths (decoded) of the files that the commits after ``version`` up to ``latest`` add."""
    from . import delta

    fs, root = delta.filesystem(uri)
    paths = set()
    for v in range(version + 1, latest + 1):
        with fs.open_input_stream(f"{root}/{LOG}/{v:020d}.json") as fh:
            for line in fh.read().decode().splitlines():
                add = json.loads(line).get("add") if line.strip() else None
                if add is not None:
                    paths.add(unquote(add["path"]))
    return paths


def _drop_empty_dirs(fs, root: str, dirs: set[str]) -> None:
    """The directories (a run's files each get one) that the deletion left empty."""
    from pyarrow import fs as pafs

    for d in sorted(dirs):
        try:
            if not fs.get_file_info(pafs.FileSelector(f"{root}/{d}")):
                fs.delete_dir(f"{root}/{d}")
        except OSError:
            pass
