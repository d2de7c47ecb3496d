"""The capture directory: append-only segment files and the durable position.

Layout of a capture directory ``DIR``:

* ``DIR/<seq:08d>-<lsn:016X>.pgcap``: segments, in capture order when sorted by name. Each is
  a complete file of pgoutput_codec's capture format (``pgoutput_codec.capture.read`` and
  ``generated/kaitai/pgoutput_capture.ksy`` open it). ``lsn`` is the durable position the
  segment starts after.
* ``DIR/state.json``: the durable position: the segment and byte offset up to which records
  are fsynced, and the LSN a restart resumes from (what the server was told is flushed, or
  ahead of it; never behind). No connection details, so never credentials.

Only :class:`SegmentWriter` writes a directory; it fsyncs segments before it records a position
in state.json (written to a temporary file, fsynced, renamed, directory fsynced), and the
position is only acknowledged to the server after that. After a crash, :meth:`recover`
truncates the last segment to the recorded offset and removes later segments: everything past
it is sent again by the server, so the files end up as an uninterrupted run would have left
them.

Readers call :func:`iter_records`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from struct import Struct

import pgoutput_codec as pgc
from pgoutput_codec import capture as capfmt

from ..lsn import format_lsn, parse_lsn

STATE_FILE = "state.json"
STATE_FORMAT = "pgcdc-capture-state"
STATE_VERSION = 1
SEGMENT_RE = re.compile(r"(\d{8})-([0-9A-F]{16})\.pgcap")
FILE_HEADER = capfmt.MAGIC + bytes((capfmt.FORMAT_VERSION,))
# One record's header in the capture format: protocol_version u1, flags u1, lsn u8, length u4.
RECORD_HEADER = Struct(">BBQI")
# Its flag bits: pgoutput_codec's contexts in order (in_stream, parallel_streaming).
FLAG_IN_STREAM = 0x01
FLAG_PARALLEL = 0x02


class CaptureDirError(Exception):
    """The directory is not a usable capture directory (says which file and how to fix it)."""


def segment_name(seq: int, lsn: int) -> str:
    return f"{seq:08d}-{lsn:016X}.pgcap"


def list_segments(directory) -> list[Path]:
    d = Path(directory)
    return sorted(p for p in d.iterdir() if SEGMENT_RE.fullmatch(p.name)) if d.is_dir() else []


@dataclass(frozen=True)
class State:
    """The durable position of a capture directory."""

    lsn: int  # resume from here
    segment: str  # file name of the segment holding the last durable record
    offset: int  # bytes of that segment that are durable
    slot: str | None = None
    info: dict | None = None  # options, server identity: for humans and sanity checks

    def to_json(self) -> str:
        doc = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "lsn": format_lsn(self.lsn),
            "segment": self.segment,
            "offset": self.offset,
            "slot": self.slot,
            "info": self.info or {},
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def read_state(directory) -> State | None:
    path = Path(directory) / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CaptureDirError(f"{path}: unreadable state file ({e})") from None
    if doc.get("format") != STATE_FORMAT or doc.get("version") != STATE_VERSION:
        raise CaptureDirError(f"{path}: not a pgcdc capture state file (version {STATE_VERSION})")
    return State(
        parse_lsn(doc["lsn"]), doc["segment"], int(doc["offset"]), doc.get("slot"), doc.get("info")
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_state(directory: Path, state: State) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(state.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / STATE_FILE)
    _fsync_dir(directory)


class SegmentWriter:
    """Appends records to the segments of one capture directory.

    ``append`` buffers; ``commit(lsn)`` makes everything appended so far durable and records
    ``lsn`` as the resume position (call it only at a transaction boundary). Segments rotate
    at a commit once they exceed ``max_bytes`` or ``max_seconds``.
    """

    def __init__(
        self,
        directory,
        *,
        max_bytes: int = 64 << 20,
        max_seconds: float = 600.0,
        buffer_bytes: int = 1 << 20,
        fsync: bool = True,
    ):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.buffer_bytes = buffer_bytes
        self.fsync = fsync
        self.state: State | None = None
        self._file = None
        self._name: str | None = None
        self._seq = 0
        self._offset = 0  # bytes written to the current segment (durable or not)
        self._opened_at = 0.0
        self.slot: str | None = None
        self.info: dict | None = None

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> State | None:
        """Bring the directory back to its durable position; returns it (None: nothing durable
        yet, the directory is emptied of segments)."""
        self.close()
        self.directory.mkdir(parents=True, exist_ok=True)
        state = read_state(self.directory)
        segments = list_segments(self.directory)
        if state is None:
            for p in segments:  # never acknowledged: the server sends all of it again
                p.unlink()
            self.state = None
            self._seq = 0
            return None
        names = [p.name for p in segments]
        if state.segment not in names:
            raise CaptureDirError(
                f"{self.directory / STATE_FILE} names segment {state.segment}, which is missing; "
                "the directory was changed by hand: restore the segment or start a new directory"
            )
        keep = self.directory / state.segment
        size = keep.stat().st_size
        if size < state.offset:
            raise CaptureDirError(
                f"{keep} has {size} bytes, fewer than the {state.offset} recorded as durable "
                "in state.json: the file was truncated outside pgcdc"
            )
        if size > state.offset:
            with open(keep, "r+b") as f:  # drop what was written but never made durable
                f.truncate(state.offset)
                os.fsync(f.fileno())
        for p in segments[names.index(state.segment) + 1 :]:
            p.unlink()
        _fsync_dir(self.directory)
        self.state = state
        self._seq = int(SEGMENT_RE.fullmatch(state.segment).group(1))
        self._file = open(keep, "ab", buffering=self.buffer_bytes)  # noqa: SIM115
        self._name = state.segment
        self._offset = state.offset
        self._opened_at = time.monotonic()
        return state

    # -- writing ----------------------------------------------------------------------------

    def _open_segment(self, start_lsn: int) -> None:
        self._seq += 1
        self._name = segment_name(self._seq, start_lsn)
        path = self.directory / self._name
        self._file = open(path, "xb", buffering=self.buffer_bytes)  # noqa: SIM115
        self._file.write(FILE_HEADER)
        self._offset = len(FILE_HEADER)
        self._opened_at = time.monotonic()

    def start(self, lsn: int) -> None:
        """Make sure a segment is open (a new directory's first segment starts at ``lsn``)."""
        if self._file is None:
            self._open_segment(lsn)

    def append(self, protocol_version: int, flags: int, lsn: int, payload) -> None:
        n = len(payload)
        self._file.write(RECORD_HEADER.pack(protocol_version, flags, lsn, n))
        self._file.write(payload)
        self._offset += RECORD_HEADER.size + n

    def write_out(self) -> None:
        """Hand buffered records to the OS (no fsync): readers see them, a crash may not."""
        if self._file is not None:
            self._file.flush()

    def commit(self, lsn: int) -> State:
        """fsync what was appended, then record ``lsn`` (a transaction boundary) as durable."""
        f = self._file
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())
            if self.state is None or self.state.segment != self._name:
                _fsync_dir(self.directory)  # the new segment's directory entry
        self.state = State(lsn, self._name, self._offset, self.slot, self.info)
        _write_state(self.directory, self.state)
        if self._offset >= self.max_bytes or (
            time.monotonic() - self._opened_at >= self.max_seconds
            and self._offset > len(FILE_HEADER)
        ):
            f.close()
            self._open_segment(lsn)
        return self.state

    @property
    def pending(self) -> bool:
        """Records were appended since the last commit."""
        return (
            self.state is None
            or self._offset != self.state.offset
            or (self._name != self.state.segment)
        )

    def close(self) -> None:
        """Close without committing (what was not committed is dropped at the next recover)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _segment_records(path: Path, last: bool) -> Iterator[capfmt.Record]:
    data = path.read_bytes()
    if last and len(data) < len(FILE_HEADER) and FILE_HEADER.startswith(data):
        return  # created, header not yet written in full: a crash left it
    try:
        yield from capfmt.iter_records(data)
    except pgc.DecodeError as e:
        truncated = e.path[:2] == ("capture", "records") and (
            "truncated" in str(e) or "file has" in str(e)
        )
        if not (last and truncated):
            raise CaptureDirError(f"{path}: {e} (byte {e.offset})") from None
        # a partial trailing record left by a crash: not a record, never yielded


def iter_records(directory) -> Iterator[capfmt.Record]:
    """All records of a capture directory, in capture order. A partial record at the end of the
    last segment (a crash mid-write) is not yielded; anywhere else it is an error."""
    segments = list_segments(directory)
    if not segments and not Path(directory).is_dir():
        raise CaptureDirError(f"{directory}: not a directory")
    for i, path in enumerate(segments):
        yield from _segment_records(path, last=i == len(segments) - 1)
