"""Where records come from: capture files and capture directories, in capture order.

A capture file is the format of ``pgoutput_codec.capture`` (``.gz`` for gzip). A capture
directory is what ``pgcdc capture`` writes (:mod:`pgcdc.capture.segments`).

Every reader in pgcdc (``pgcdc changes``, :func:`pgcdc.events.reader.read_captures`, the Spark change
events and apply) reads through :class:`Captures`, which decides how far the input may be
read, so that only committed, durable work leaves a capture (the Spark tasks then open each
file of that plan with :func:`open_capture` and walk a slice of it with :func:`range_chunks`):

* a capture directory is read up to the durable position its ``state.json`` records, never
  past it (a segment cut shorter than that position is an error);
* a directory without ``state.json`` (a capture stopped before its first durable point, or
  copied while written) and plain capture files are read up to their last commit boundary:
  a trailing Begin whose Commit is not in the input starts a transaction that is not read
  (a note says so). Begin's final LSN is never taken as proof of a commit. Streamed and
  prepared transactions need no cut: :mod:`pgcdc.events.transactions` holds them until their Stream
  Commit / Commit Prepared, which is then inside what was read, or never emits them.

Several inputs are one continuous stream: only the end of the last one is cut.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import mmap
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from dataclasses import dataclass, field, replace
from pathlib import Path

import pgoutput_codec as pgc

from pgcdc.errors import SetupError
from pgoutput_codec import capture

from pgcdc.runtime.capture_file import FORMAT_VERSION, RECORD_HEADER
from pgcdc.capture.chunks import ALLOWED_KEYS, GATES, Chunk, record_items
from pgcdc.capture.segments import (
    durable_segments,
    file_records,
    read_state,
    segment_lsn,
    torn_header,
)

try:
    from pgcdc.runtime._capturescan import last_tags as _c_last_tags, scan as _c_scan
except ImportError:  # built without a C compiler: records one at a time
    _c_scan = _c_last_tags = None

__all__ = [
    "CaptureFile",
    "Captures",
    "ReadError",
    "SourceError",
    "iter_all",
    "iter_all_chunks",
    "iter_chunks",
    "iter_raw",
    "iter_records",
    "open_capture",
    "range_chunks",
]

log = logging.getLogger("pgcdc.capture.files")

CHUNK_RECORDS = 4096
CHUNK_BYTES = 4 << 20  # messages per chunk at most (a chunk holds at least one record)
FILE_HEADER_SIZE = len(capture.MAGIC) + 1


def _tag_table(*classes) -> bytes:
    """A 256-entry table of the tag bytes of these pgoutput message classes (from the spec)."""
    table = bytearray(256)
    for cls in classes:
        table[ord(cls.TAG)] = 1
    return bytes(table)


# a plain transaction's changes are emitted as they arrive: it is the one to cut
_OPENS, _CLOSES = _tag_table(pgc.Begin), _tag_table(pgc.Commit)


class ReadError(SetupError, ValueError):
    """A capture path that cannot be read as a capture."""


SourceError = ReadError  # its old name: callers may catch it by that name


@dataclass(frozen=True)
class CaptureFile:
    """One file of the stream, read from its header up to ``end`` (None: its end).

    ``boundary``: ``end`` is known to be a commit boundary (a directory's durable position).
    ``partial_ok``: a partial record at the end is a crash's leftover, not an error (the last
    segment of a directory without state.json)."""

    path: str
    end: int | None
    boundary: bool = False
    partial_ok: bool = False


@dataclass
class Captures:
    """What may be read of capture files and directories, in stream order (see the module
    docstring); ``notes`` says what was left unread and why."""

    files: list[CaptureFile]
    notes: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, paths: Iterable[str | os.PathLike], until=None) -> Captures:
        """Plan the read of ``paths``. Raises ReadError for a path that is not a capture,
        :class:`pgcdc.capture.segments.CaptureDirError` for a directory whose files do not
        match its state.json. ``until``: a directory's earlier durable position
        (:class:`pgcdc.capture.segments.State`) to read to, rather than its state.json's."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        files: list[CaptureFile] = []
        notes: list[str] = []
        for p in map(Path, paths):
            if p.is_dir():
                files += _directory_files(p, notes, until)
            elif p.exists():
                files.append(CaptureFile(str(p), None))
            else:
                raise ReadError(f"{p}: no such capture file or directory")
        out = cls(files, notes)
        out._cut_open_transaction()
        return out

    @property
    def catalog(self):
        """The :class:`pgcdc.values.Catalog` of the catalog.jsonl files beside what is read (a
        capture directory's, up to its durable position; a capture file's directory's), or
        None when there is none (a stream of built-in types, or captures made without it)."""
        if not hasattr(self, "_catalog"):
            self._catalog = catalog_of([f.path for f in self.files])
        return self._catalog

    def known_relations(self) -> list:
        """The Relation messages (pgoutput_codec.Relation) the capture recorded before the
        first record read here (relations.jsonl): a directory whose first segments were
        pruned still describes the relations of the changes in the rest."""
        if not self.files:
            return []
        from pgcdc.capture.catalog import relations_before  # lazy: psycopg via pgcdc.values, ~0.1 s

        first = Path(self.files[0].path)
        start = segment_lsn(first.name)
        found = relations_before(first.parent, start) if start is not None else []
        note = (
            f"{len(found)} relation(s) described by {first.parent / 'relations.jsonl'}, "
            f"recorded before {first.name} (the Relation messages are in segments not read)"
        )
        if found and note not in self.notes:
            self.notes.append(note)
        return found

    def logged(self) -> Captures:
        """Log the notes (logger ``pgcdc.capture.files``, WARNING) for callers that print none."""
        for note in self.notes:
            log.warning("%s", note)
        return self

    def _cut_open_transaction(self) -> None:
        # Walks back from the last file to the first one that says whether the stream ends
        # inside a transaction; plain transactions never interleave, so the last Begin
        # without a Commit after it is the only one that can be open.
        for i in range(len(self.files) - 1, -1, -1):
            f = self.files[i]
            if f.boundary:
                return
            with _data(f) as (data, end):
                if len(data) < FILE_HEADER_SIZE:
                    continue
                stop, last_open, last_close = _last_tags(data, FILE_HEADER_SIZE, end)
            if stop < end and not f.partial_ok:
                return  # a truncated file: its reader reports it, with the offset
            if last_open >= 0 and last_open >= last_close:
                self.files[i + 1 :] = []
                self.files[i] = replace(f, end=last_open, boundary=True)
                self.notes.append(
                    f"{f.path}: read up to its last commit boundary (byte {last_open}); the "
                    f"transaction begun there has no Commit in the input and is not read"
                )
                return
            if last_close >= 0:
                return

    def records(self) -> Iterator[capture.Record]:
        """The records, as ``pgoutput_codec.capture.Record`` objects."""
        for f in self.files:
            with _data(f) as (data, end):
                yield from _checked(f, _records(data, end, f))

    def raw(self) -> Iterator[tuple[tuple | None, int, object]]:
        """The records as ``(gates, lsn, data)`` triples, the input of
        :meth:`pgcdc.events.reader.EventReader.read_raw`: same records, order and errors as
        :meth:`records`, without a Record object per message (building one costs as much as
        decoding the message). ``gates`` is ``(protocol_version, in_stream,
        parallel_streaming)``, one shared tuple per combination; a record whose parameters
        are not valid comes as ``(None, lsn, record)`` (see :func:`pgcdc.capture.chunks.record_items`)."""
        for f in self.files:
            with _data(f) as (data, end):
                yield from _checked(f, _raw(data, end, f))

    def chunks(self) -> Iterator[Chunk | tuple]:
        """The records for :meth:`pgcdc.events.reader.EventReader.read_chunks`:
        :class:`~pgcdc.capture.chunks.Chunk` objects of many records each, read in C, and
        ``(gates, lsn, data)`` triples for anything unusual (and everywhere without the C
        reader). Same records, order and errors as :meth:`raw`."""
        if _c_scan is None:
            yield from self.raw()
            return
        for f in self.files:
            with _data(f) as (data, end):
                yield from _checked(
                    f,
                    _file_chunks(data, end, lambda data=data, end=end, f=f: _records(data, end, f)),
                )


def _directory_files(p: Path, notes: list[str], until=None) -> list[CaptureFile]:
    segs, state = durable_segments(p, until)
    if state is not None:
        return [CaptureFile(str(path), end, boundary=end is not None) for path, end in segs]
    if segs:
        notes.append(
            f"{p} has no state.json (a capture stopped before its first durable point, or "
            "copied while written): read up to its last commit boundary"
        )
    # a partial record is a crash's leftover at the end of the last segment only
    last = len(segs) - 1
    return [CaptureFile(str(path), None, partial_ok=i == last) for i, (path, _) in enumerate(segs)]


def catalog_of(paths):
    """The catalog (see :attr:`Captures.catalog`) of the directories holding capture files
    ``paths``; read once per process while its files stay as they are (Spark tasks ask for
    it unit after unit)."""
    dirs = tuple(dict.fromkeys(str(Path(p).parent) for p in paths))
    stamp = []
    for d in dirs:
        try:
            st = os.stat(os.path.join(d, "catalog.jsonl"))
            stamp.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append(None)
    return _catalog_of(dirs, tuple(stamp))


@lru_cache(maxsize=64)
def _catalog_of(dirs: tuple, stamp: tuple):
    from pgcdc.capture.catalog import load_catalog  # lazy: psycopg via pgcdc.values, ~0.1 s

    if not any(stamp):
        return None
    until = {}
    for d in dirs:
        try:
            state = read_state(d)
        except Exception:  # not a capture directory: a file's folder
            state = None
        if state is not None:
            until[d] = state.lsn
    return load_catalog(dirs, until)


@contextmanager
def open_capture(f: CaptureFile):
    """``(data, start, end)`` of one file of a plan (:attr:`Captures.files`), its header
    checked: its records are ``data[start:end]``, for :func:`range_chunks`. The buffer is
    memory-mapped (decompressed for .gz) and valid inside the ``with`` block only. Raises
    ReadError for a file that is not a capture; a file whose header a crash cut short
    (``partial_ok``) has no records."""
    with _data(f) as (data, end):
        magic = capture.MAGIC
        head = bytes(data[: min(end, FILE_HEADER_SIZE)])
        if f.partial_ok and torn_header(head):
            yield data, end, end  # created, header not yet written in full: a crash left it
            return
        if len(head) < FILE_HEADER_SIZE or head[: len(magic)] != magic:
            raise ReadError(f"{f.path}: not a capture file (expected {magic!r})")
        if head[len(magic)] != FORMAT_VERSION:
            raise ReadError(
                f"{f.path}: unsupported capture format version (expected {FORMAT_VERSION})"
            )
        yield data, FILE_HEADER_SIZE, end


@contextmanager
def _data(f: CaptureFile):
    """(buffer, end) of a capture file: memory-mapped (a multi-gigabyte capture is read
    through the page cache, not into memory) and read up to ``end``, decompressed for .gz."""
    p = Path(f.path)
    if f.path.endswith(".gz"):
        try:
            with gzip.open(p, "rb") as g:
                data = g.read() if f.end is None else g.read(f.end)
        except (OSError, EOFError) as e:
            raise ReadError(f"{p}: {e}") from None
        yield data, len(data)
        return
    try:
        fh = open(p, "rb")
    except FileNotFoundError:
        raise ReadError(f"{p}: no such capture file or directory") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            if f.partial_ok:
                yield b"", 0
                return
            raise ReadError(f"{p}: empty file, not a capture")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data, size if f.end is None else min(f.end, size)


def _checked(f: CaptureFile, items: Iterator) -> Iterator:
    """Names the file in a DecodeError."""
    try:
        yield from items
    except capture.DecodeError as e:
        raise ReadError(f"{f.path}: {e}") from e


def _last_tags(data, start: int, end: int) -> tuple[int, int, int]:
    """(end of the last whole record, offset of the last Begin, end of the last Commit)."""
    if _c_last_tags is not None:
        return _c_last_tags(data, start, end, _OPENS, _CLOSES)
    unpack = RECORD_HEADER.unpack_from
    hsize = RECORD_HEADER.size
    off, last_open, last_close = start, -1, -1
    while off + hsize <= end:
        length = unpack(data, off)[3]
        body = off + hsize
        if body + length > end:
            break
        if length:
            tag = data[body]
            if _OPENS[tag]:
                last_open = off
            if _CLOSES[tag]:
                last_close = body + length
        off = body + length
    return off, last_open, last_close


def _records(data, end: int, f: CaptureFile) -> Iterator[capture.Record]:
    """The reference reader over data[:end]; a partial last record is dropped where the file
    allows it."""
    if end < len(data):
        data = data[:end]
    yield from file_records(data, torn_ok=f.partial_ok)


def _raw(data, end: int, f: CaptureFile) -> Iterator[tuple[tuple | None, int, object]]:
    if f.path.endswith(".gz") or f.partial_ok:
        yield from record_items(_records(data, end, f))
        return
    yield from _raw_records(data, end, lambda: _records(data, end, f))


def iter_records(path: str | os.PathLike) -> Iterator[capture.Record]:
    """The records of one capture file or capture directory, in order."""
    yield from Captures.open([path]).logged().records()


def iter_all(paths: Iterable[str | os.PathLike]) -> Iterator[capture.Record]:
    """The records of several captures, one after the other (one continuous stream)."""
    yield from Captures.open(paths).logged().records()


def iter_raw(path: str | os.PathLike) -> Iterator[tuple[tuple | None, int, object]]:
    """:meth:`Captures.raw` of one capture file or directory."""
    yield from Captures.open([path]).logged().raw()


def iter_chunks(path: str | os.PathLike) -> Iterator[Chunk | tuple]:
    """:meth:`Captures.chunks` of one capture file or directory."""
    yield from Captures.open([path]).logged().chunks()


def iter_all_chunks(paths: Iterable[str | os.PathLike]) -> Iterator[Chunk | tuple]:
    """:meth:`Captures.chunks` of several captures, one after the other."""
    yield from Captures.open(paths).logged().chunks()


def raw_records(data: bytes, start: int = 0) -> Iterator[tuple[tuple | None, int, bytes]]:
    """``(gates, lsn, data)`` triples of the capture records in ``data[start:]``: the record
    layout without the file's magic, as ``LogicalStream.read_records`` appends them. Raises
    ``capture.DecodeError`` with the byte offset for a truncated record or unknown flags."""
    stop = [start]
    yield from _scan(data, start, len(data), stop)
    off = stop[0]
    if off < len(data):  # the rest through the reference reader, for its precise error
        head = capture.MAGIC + bytes((FORMAT_VERSION,))
        try:
            yield from record_items(capture.iter_records(head + bytes(data[off:])))
        except capture.DecodeError as e:  # the offset into `data`, not into the copy
            raise capture.DecodeError(off + e.offset - len(head), e.path, e.reason) from None


def _scan(data, off: int, n: int, stop: list[int]) -> Iterator[tuple[tuple, int, bytes]]:
    # The record layout of pgcdc.runtime.capture_file, read with its header struct; stops before
    # anything unusual (a protocol version or flags it does not know, truncation), leaving
    # its offset in stop[0] for the reference reader.
    unpack = RECORD_HEADER.unpack_from
    hsize = RECORD_HEADER.size
    gates_of = GATES.get
    while off + hsize <= n:
        version, flags, lsn, length = unpack(data, off)
        gates = gates_of((version, flags))
        end = off + hsize + length
        if gates is None or end > n:
            break
        yield gates, lsn, data[off + hsize : end]
        off = end
    stop[0] = off


def _raw_records(data, end: int, reference) -> Iterator[tuple[tuple | None, int, bytes]]:
    # A capture file: the reference reader checks the head and takes over at anything
    # unusual, from that record on, so errors and their offsets are its own.
    magic = capture.MAGIC
    if data[: len(magic)] != magic or end < FILE_HEADER_SIZE or data[len(magic)] != FORMAT_VERSION:
        yield from record_items(reference())
        return
    stop = [FILE_HEADER_SIZE]
    done = 0
    for item in _scan(data, FILE_HEADER_SIZE, end, stop):
        yield item
        done += 1
    if stop[0] < end:
        yield from record_items(itertools.islice(reference(), done, None))


def chunks_of(data, start: int = 0, stop: int | None = None) -> Iterator[Chunk]:
    """Chunks of the plain records in ``data[start:stop]`` (the record layout without the
    file's magic); stops quietly at the first record that is not plain, leaving its offset
    in the generator's return value. Holds no view of ``data`` between chunks."""
    end = len(data) if stop is None else stop
    off = start
    while True:
        off, keys, tags, lsns, offsets, values = _c_scan(
            data, off, end, CHUNK_RECORDS, CHUNK_BYTES, ALLOWED_KEYS
        )
        if not keys:
            return off
        lsns = memoryview(lsns).cast("Q").tolist()
        yield Chunk(keys, tags, lsns, memoryview(offsets).cast("i"), values)


def raw_chunks(data, start: int = 0) -> Iterator[Chunk | tuple]:
    """:func:`raw_records` for :meth:`pgcdc.events.reader.EventReader.read_chunks`: chunks of the
    records in ``data[start:]``, then triples from the first record that is not plain (with
    the same errors)."""
    yield from chunks_then(data, start, len(data), lambda off, _: raw_records(data, off))


def chunks_then(data, start: int, end: int, rest) -> Iterator[Chunk | tuple]:
    """Chunks of the plain records in ``data[start:end]``, then ``rest(offset, records)``
    from the first record that is not plain, if any (``records``: how many came before it),
    which reads it and says what is wrong with it. Without the C reader, ``rest`` reads them
    all, one at a time."""
    if _c_scan is None:
        yield from rest(start, 0)
        return
    chunks = chunks_of(data, start, end)
    done = 0
    while True:
        try:
            chunk = next(chunks)
        except StopIteration as stop:
            off = stop.value
            break
        done += len(chunk.keys)
        yield chunk
    if off < end:
        yield from rest(off, done)


def range_chunks(data, start: int, end: int) -> Iterator[Chunk | tuple]:
    """The whole records of ``data[start:end]`` (``start`` at a record, as
    :func:`open_capture` or a summary gives it) for
    :meth:`pgcdc.events.reader.EventReader.read_chunks`: chunks of the plain records read in C, then
    ``(gates, lsn, payload)`` triples from the first record that is not plain (all of them
    without the C reader). A partial record at the end (a crash while appending) is not a
    record and ends the walk. Record i of a chunk starts ``RECORD_HEADER.size * i +
    chunk.offsets[i]`` bytes after the chunk's first; a triple's record takes
    ``RECORD_HEADER.size + len(payload)`` bytes."""
    yield from chunks_then(data, start, end, lambda off, _: _range_triples(data, off, end))


def _range_triples(data, start: int, end: int) -> Iterator[tuple[tuple, int, bytes]]:
    # one record at a time, whatever its protocol version (a decoder says what is wrong)
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    gates_of: dict = {}
    off = start
    while off + size <= end:
        version, flags, lsn, length = unpack(data, off)
        body = off + size
        if body + length > end:
            return
        gates = gates_of.get((version, flags))
        if gates is None:
            gates = gates_of[(version, flags)] = (version, bool(flags & 1), bool(flags & 2))
        yield gates, lsn, data[body : body + length]
        off = body + length


def _file_chunks(data, end: int, reference) -> Iterator[Chunk | tuple]:
    # As _raw_records: the reference reader checks the head and takes over at anything
    # unusual, from that record on, so errors and their offsets are its own.
    magic = capture.MAGIC
    if data[: len(magic)] != magic or end < FILE_HEADER_SIZE or data[len(magic)] != FORMAT_VERSION:
        yield from record_items(reference())
        return
    yield from chunks_then(
        data,
        FILE_HEADER_SIZE,
        end,
        lambda _, done: record_items(itertools.islice(reference(), done, None)),
    )
