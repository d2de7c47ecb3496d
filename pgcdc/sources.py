"""Where records come from: capture files and capture directories, in capture order.

A capture file is the format of ``pgoutput_codec.capture`` (``.gz`` for gzip). A capture
directory is what ``pgcdc capture`` writes: segment files read through
``pgcdc.capture.segments.iter_records``, which also hides a partial record a crash left at
the end of the last segment.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from pgoutput_codec import capture


class SourceError(ValueError):
    """A capture path that cannot be read as a capture."""


def iter_records(path: str | os.PathLike) -> Iterator[capture.Record]:
    """The records of one capture file or capture directory, in order."""
    p = Path(path)
    if p.is_dir():
        try:
            from .capture.segments import iter_records as iter_segments
        except ImportError as e:
            raise SourceError(
                f"{p} is a directory, but reading capture directories needs "
                f"pgcdc.capture.segments ({e})"
            ) from e
        yield from iter_segments(p)
        return
    if not p.exists():
        raise SourceError(f"{p}: no such capture file or directory")
    if p.name.endswith(".gz"):
        yield from capture.read(p)
        return
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise SourceError(f"{p}: empty file, not a capture")
        # mmap: a multi-gigabyte capture is read through the page cache, not into memory
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                yield from capture.iter_records(data)
            except capture.DecodeError as e:
                raise SourceError(f"{p}: {e}") from e


def iter_all(paths: Iterable[str | os.PathLike]) -> Iterator[capture.Record]:
    """The records of several captures, one after the other (one continuous stream)."""
    for path in paths:
        yield from iter_records(path)
