"""Files that survive a crash: written whole or not at all, and on disk before we go on."""

from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a directory's entries (a file created, renamed or removed in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str | os.PathLike, doc: dict) -> None:
    """``doc`` as indented JSON at ``path``, atomically: a temporary file beside it, fsynced,
    renamed over it, and the directory fsynced (a reader sees the old document or the new)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
