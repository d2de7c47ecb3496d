"""The capture directory: append-only segment files and the durable position.

Layout of a capture directory ``DIR``:

* ``DIR/<seq:08d>-<lsn:016X>.pgcap``: segments, in capture order when sorted by name. Each is
  a complete file of pgoutput_codec's capture format (``pgoutput_codec.capture.read`` and
  ``generated/kaitai/pgoutput_capture.ksy`` open it). ``lsn`` is the durable position the
  segment starts after.
* ``DIR/state.json``: the durable position: the segment and byte offset up to which records
  are fsynced, and the LSN a restart resumes from (what the server was told is flushed, or
  ahead of it; never behind). No connection details, so never credentials.

Only :class:`SegmentWriter` writes a directory. The position it records is the last transaction
boundary the source marked (nothing open before it), never merely the end of what was
appended: records of a transaction still open (a streamed one's chunks too) may be in the file
but lie past the recorded offset. It fsyncs segments before it records a position in
state.json (written to a temporary file, fsynced, renamed, directory fsynced), and the
position is only acknowledged to the server after that. After a crash, :meth:`recover`
truncates the last segment to the recorded offset and removes later segments: everything past
it is sent again by the server, so the files end up as an uninterrupted run would have left
them.

Readers read a directory through :mod:`pgcdc.capture.files` (``iter_records``, ``Captures``),
which reads capture files and directories alike: never past the durable position.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pgoutput_codec as pgc
from pgoutput_codec import capture as capfmt

from pgcdc.errors import SetupError
from pgcdc.durable import fsync_dir
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.runtime.capture_file import RECORD_HEADER

STATE_FILE = "state.json"
STATE_FORMAT = "pgcdc-capture-state"
STATE_VERSION = 1
SEGMENT_RE = re.compile(r"(\d{8})-([0-9A-F]{16})\.pgcap")
FILE_HEADER = capfmt.MAGIC + bytes((capfmt.FORMAT_VERSION,))
# A record's header (RECORD_HEADER, from pgcdc.runtime.capture_file): protocol_version u1, flags u1,
# lsn u8, length u4. Its flag bits: pgoutput_codec's contexts in order (in_stream,
# parallel_streaming).
FLAG_IN_STREAM = 0x01
FLAG_PARALLEL = 0x02


class CaptureDirError(SetupError):
    """The directory is not a usable capture directory (says which file and how to fix it)."""


def segment_name(seq: int, lsn: int) -> str:
    return f"{seq:08d}-{lsn:016X}.pgcap"


def segment_lsn(name: str) -> int | None:
    """The LSN a segment starts at, from its name (:func:`segment_name`); None for another
    file's name."""
    m = SEGMENT_RE.fullmatch(name)
    return int(m.group(2), 16) if m else None


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
    info: dict | None = None  # options: for humans and sanity checks
    # the server, database and slot the records come from (SourceIdentity.to_json); capture
    # refuses to resume, and apply to mix, another source. None in directories made before it
    source: dict | None = None

    def to_json(self) -> str:
        doc = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "lsn": format_lsn(self.lsn),
            "segment": self.segment,
            "offset": self.offset,
            "slot": self.slot,
            "info": self.info or {},
            "source": self.source,
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
        parse_lsn(doc["lsn"]),
        doc["segment"],
        int(doc["offset"]),
        doc.get("slot"),
        doc.get("info"),
        doc.get("source"),
    )


def source_identity(directory) -> dict | None:
    """The source a capture directory's state.json records (system_id, timeline, database,
    slot, slot_created_at), or None (no state.json yet, or made before pgcdc recorded it)."""
    state = read_state(directory)
    return None if state is None else state.source


def _write_state(directory: Path, state: State) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(state.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / STATE_FILE)
    fsync_dir(directory)


class SegmentWriter:
    """Appends records to the segments of one capture directory.

    Records are appended in the capture format to :attr:`buf` (a bytearray: a whole batch of
    records is one ``+=`` each, and reaches the file in one ``write``), by :meth:`append` or by
    a source that writes into ``buf`` directly. :meth:`mark` says where in ``buf`` the last
    transaction boundary ends and which LSN resumes after it; :meth:`commit` makes everything
    up to that mark durable (fsync) and records the mark in state.json. Records after the mark
    (an open transaction) are written too, but state.json never covers them, so a crash drops
    them and the server sends them again. Segments rotate at a commit once they exceed
    ``max_bytes`` or ``max_seconds``: the records after the mark, if still in memory, start the
    next segment.
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
        self.buffer_bytes = buffer_bytes  # buf is handed to the OS once it holds this much
        self.fsync = fsync
        self.state: State | None = None
        self.buf = bytearray()  # records of the current segment not yet handed to the OS
        self._fd: int | None = None
        self._name: str | None = None
        self._seq = 0
        self._written = 0  # bytes of the current segment handed to the OS
        self._mark: tuple[int, int] | None = None  # (lsn, segment offset) of the last boundary
        self._opened_at = 0.0
        self.slot: str | None = None
        self.info: dict | None = None
        self.source: dict | None = None

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
        fsync_dir(self.directory)
        self.state = state
        self._seq = int(SEGMENT_RE.fullmatch(state.segment).group(1))
        self._fd = os.open(keep, os.O_WRONLY | os.O_APPEND)
        self._name = state.segment
        self._written = state.offset
        self._opened_at = time.monotonic()
        return state

    # -- writing ----------------------------------------------------------------------------

    def _open_segment(self, start_lsn: int) -> None:
        self._seq += 1
        self._name = segment_name(self._seq, start_lsn)
        path = self.directory / self._name
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.buf[:0] = FILE_HEADER
        self._written = 0
        self._opened_at = time.monotonic()

    def start(self, lsn: int) -> None:
        """Make sure a segment is open (a new directory's first segment starts at ``lsn``)."""
        if self._fd is None:
            self._open_segment(lsn)

    def append(self, protocol_version: int, flags: int, lsn: int, payload) -> None:
        """Append one record (a source may also write records into :attr:`buf` itself)."""
        buf = self.buf
        buf += RECORD_HEADER.pack(protocol_version, flags, lsn, len(payload))
        buf += payload

    def mark(self, end: int, lsn: int) -> None:
        """The records in ``buf[:end]`` end at a transaction boundary; a restart after them
        resumes from ``lsn``."""
        self._mark = (lsn, self._written + end)

    def mark_end(self, lsn: int) -> None:
        """:meth:`mark` at the end of everything appended so far."""
        self.mark(len(self.buf), lsn)

    @property
    def marked(self) -> bool:
        """A boundary was marked that is not yet durable."""
        return self._mark is not None

    def _write(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def write_out(self) -> None:
        """Hand buffered records to the OS (no fsync): readers see them, a crash may not."""
        if self.buf and self._fd is not None:
            self._write(self.buf)
            self._written += len(self.buf)
            self.buf.clear()

    def maybe_write_out(self) -> None:
        if len(self.buf) >= self.buffer_bytes:
            self.write_out()

    def commit(self) -> State | None:
        """fsync the records up to the mark, then record the mark as the durable position
        (None: no mark since the last commit)."""
        if self._mark is None:
            return None
        lsn, offset = self._mark
        self._mark = None
        cut = offset - self._written  # bytes of buf up to the mark (<= 0: written already)
        if cut > 0:
            self._write(memoryview(self.buf)[:cut])
            self._written = offset
            del self.buf[:cut]
        new_segment = self.state is None or self.state.segment != self._name
        if self.fsync:
            os.fsync(self._fd)
            if new_segment:
                fsync_dir(self.directory)  # the new segment's directory entry
        self._record(State(lsn, self._name, offset, self.slot, self.info, self.source))
        if (self._written == offset) and (
            offset >= self.max_bytes
            or (
                time.monotonic() - self._opened_at >= self.max_seconds and offset > len(FILE_HEADER)
            )
        ):  # rotate; what follows the mark (still in buf) starts the next segment
            os.close(self._fd)
            self._open_segment(lsn)
        return self.state

    def commit_position(self, lsn: int) -> State | None:
        """Record ``lsn`` as the durable position when nothing was appended after the last one
        (the server's WAL end while idle)."""
        assert not self.pending, "records after the durable position: commit() them first"
        self.mark_end(lsn)
        return self.commit()

    def _record(self, state: State) -> None:
        _write_state(self.directory, state)
        self.state = state

    @property
    def pending(self) -> bool:
        """Records were appended after the durable position."""
        end = self._written + len(self.buf)
        st = self.state
        if st is None or self._name != st.segment:  # a new segment: anything but its header
            return end > len(FILE_HEADER)
        return end != st.offset

    def close(self) -> None:
        """Close without committing (what was not committed is dropped at the next recover)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.buf.clear()
        self._mark = None


def torn_header(head) -> bool:
    """``head``, a file's bytes, is a capture file's header cut short (by a crash, right after
    the file was created)."""
    return len(head) < len(FILE_HEADER) and FILE_HEADER.startswith(bytes(head))


def file_records(data, torn_ok: bool) -> Iterator[capfmt.Record]:
    """The records of a capture file's bytes (``data``: bytes, or an mmap of the file).

    ``torn_ok``: the file is the last one a capture wrote, with no durable position to stop
    at, so a crash may have torn its tail: a header not yet written in full, or a partial
    last record, is then neither a record nor an error. Anything else that does not decode
    raises ``pgoutput_codec.DecodeError``."""
    if torn_ok and torn_header(data):
        return  # created, header not yet written in full: a crash left it
    try:
        yield from capfmt.iter_records(data)
    except pgc.DecodeError as e:
        torn = e.path[:2] == ("capture", "records") and (
            "truncated" in str(e) or "file has" in str(e)
        )
        if not (torn_ok and torn):
            raise
        # a partial trailing record left by a crash: not a record, never yielded


def _segment_records(path: Path, last: bool, end: int | None = None) -> Iterator[capfmt.Record]:
    data = path.read_bytes()
    if end is not None:
        data = data[:end]
    try:
        yield from file_records(data, torn_ok=last)
    except pgc.DecodeError as e:
        raise CaptureDirError(f"{path}: {e} (byte {e.offset})") from None


def durable_segments(
    directory, until: State | None = None
) -> tuple[list[tuple[Path, int | None]], State | None]:
    """The segments a reader may read, each with the offset to stop at (None: its end), and
    the state they come from.

    With state.json: the segments up to the one it names, that one up to its durable offset:
    never what a running (or killed) capture wrote past it. A named segment that is missing,
    or shorter than its durable offset, is a CaptureDirError (the files were changed outside
    pgcdc: reading on would silently lose committed changes). Without state.json (a capture
    that never reached its first durable point): every segment to its end; the caller reads
    only up to the last commit boundary (see :mod:`pgcdc.capture.files`).

    ``until``: a durable position state.json gave earlier, read to instead of today's (what
    was durable then stays as it was: a capture never rewrites it). A reader pinned to one
    range reads the same records however far the capture went on; when its segment is pruned,
    nothing (the prune deletes only what the tables applied)."""
    d = Path(directory)
    if not d.is_dir():
        raise CaptureDirError(f"{d}: not a directory")
    segments = list_segments(d)
    state = read_state(d) if until is None else until
    if state is None:
        return [(p, None) for p in segments], None
    names = [p.name for p in segments]
    if until is not None and until.segment not in names:
        return [], until
    if state.segment not in names:
        raise CaptureDirError(
            f"{d / STATE_FILE} names segment {state.segment}, which is missing: restore it, "
            "or capture into a new directory"
        )
    last = names.index(state.segment)
    size = segments[last].stat().st_size
    if size < state.offset:
        raise CaptureDirError(
            f"{segments[last]} has {size} bytes, fewer than the {state.offset} recorded as "
            "durable in state.json: it was cut outside pgcdc (restore the file, or capture "
            "into a new directory)"
        )
    return [(p, None) for p in segments[:last]] + [(segments[last], state.offset)], state


def iter_written(directory) -> Iterator[capfmt.Record]:
    """Every record written to a capture directory, durable or not, in capture order: the
    capture's own view (tests, inspection), never a reader's. A partial record at the end of
    the last segment (a crash mid-write) is not yielded; anywhere else it is an error."""
    segments = list_segments(directory)
    if not segments and not Path(directory).is_dir():
        raise CaptureDirError(f"{directory}: not a directory")
    for i, path in enumerate(segments):
        yield from _segment_records(path, last=i == len(segments) - 1)
