"""Where records come from: capture files and capture directories, in capture order.

A capture file is the format of ``pgoutput_codec.capture`` (``.gz`` for gzip). A capture
directory is what ``pgcdc capture`` writes: segment files read through
``pgcdc.capture.segments.iter_records``, which also hides a partial record a crash left at
the end of the last segment.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from pgcdc.runtime.capture import FORMAT_VERSION, RECORD_HEADER
from pgoutput_codec import capture

from .chunks import ALLOWED_KEYS, GATES, Chunk
from .events import record_items

try:
    from .runtime._capturescan import scan as _c_scan
except ImportError:  # built without a C compiler: records one at a time
    _c_scan = None

CHUNK_RECORDS = 4096
CHUNK_BYTES = 4 << 20  # messages per chunk at most (a chunk holds at least one record)


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
    if p.name.endswith(".gz") and p.exists():
        yield from capture.read(p)
        return
    yield from _mapped(p, capture.iter_records)


def _mapped(p: Path, read) -> Iterator:
    """``read(data)`` of the capture file ``p``, memory-mapped: a multi-gigabyte capture is
    read through the page cache, not into memory. A DecodeError names the file."""
    if not p.exists():
        raise SourceError(f"{p}: no such capture file or directory")
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise SourceError(f"{p}: empty file, not a capture")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                yield from read(data)
            except capture.DecodeError as e:
                raise SourceError(f"{p}: {e}") from e


def iter_all(paths: Iterable[str | os.PathLike]) -> Iterator[capture.Record]:
    """The records of several captures, one after the other (one continuous stream)."""
    for path in paths:
        yield from iter_records(path)


def iter_raw(path: str | os.PathLike) -> Iterator[tuple[tuple | None, int, object]]:
    """The messages of a capture file or directory as ``(gates, lsn, data)`` triples, the
    input of :meth:`pgcdc.events.EventReader.read_raw`.

    Same records, order and errors as :func:`iter_records`, without a Record object per
    message (building one costs as much as decoding the message). ``gates`` is
    ``(protocol_version, in_stream, parallel_streaming)``, one shared tuple per combination;
    a record whose parameters are not valid comes as ``(None, lsn, record)`` (see
    :func:`pgcdc.events.record_items`).
    """
    p = Path(path)
    if p.is_dir() or p.name.endswith(".gz"):
        yield from record_items(iter_records(p))
        return
    yield from _mapped(p, _raw_records)


def iter_all_raw(paths: Iterable[str | os.PathLike]) -> Iterator[tuple[tuple | None, int, object]]:
    """:func:`iter_raw` of several captures, one after the other."""
    for path in paths:
        yield from iter_raw(path)


def raw_records(data: bytes, start: int = 0) -> Iterator[tuple[tuple | None, int, bytes]]:
    """``(gates, lsn, data)`` triples of the capture records in ``data[start:]``: the record
    layout without the file's magic, as ``LogicalStream.read_records`` appends them. Raises
    ``capture.DecodeError`` with the byte offset for a truncated record or unknown flags."""
    stop = [start]
    yield from _scan(data, start, stop)
    off = stop[0]
    if off < len(data):  # the rest through the reference reader, for its precise error
        head = capture.MAGIC + bytes((FORMAT_VERSION,))
        try:
            yield from record_items(capture.iter_records(head + bytes(data[off:])))
        except capture.DecodeError as e:  # the offset into `data`, not into the copy
            raise capture.DecodeError(off + e.offset - len(head), e.path, e.reason) from None


def _scan(data, off: int, stop: list[int]) -> Iterator[tuple[tuple, int, bytes]]:
    # The record layout of pgcdc.runtime.capture, read with its header struct; stops before
    # anything unusual (a protocol version or flags it does not know, truncation), leaving
    # its offset in stop[0] for the reference reader.
    unpack = RECORD_HEADER.unpack_from
    hsize = RECORD_HEADER.size
    gates_of = GATES.get
    n = len(data)
    while off + hsize <= n:
        version, flags, lsn, length = unpack(data, off)
        gates = gates_of((version, flags))
        end = off + hsize + length
        if gates is None or end > n:
            break
        yield gates, lsn, data[off + hsize : end]
        off = end
    stop[0] = off


def _raw_records(data) -> Iterator[tuple[tuple | None, int, bytes]]:
    # A capture file: the reference reader checks the head and takes over at anything
    # unusual, from that record on, so errors and their offsets are its own.
    magic = capture.MAGIC
    start = len(magic) + 1
    if data[: len(magic)] != magic or len(data) < start or data[len(magic)] != FORMAT_VERSION:
        yield from record_items(capture.iter_records(data))
        return
    stop = [start]
    done = 0
    for item in _scan(data, start, stop):
        yield item
        done += 1
    if stop[0] < len(data):
        yield from record_items(itertools.islice(capture.iter_records(data), done, None))


def iter_chunks(path: str | os.PathLike) -> Iterator[Chunk | tuple]:
    """The records of a capture file or directory for
    :meth:`pgcdc.events.EventReader.read_chunks`: :class:`~pgcdc.chunks.Chunk` objects of
    many records each, read in C, and ``(gates, lsn, data)`` triples for anything unusual
    (and everywhere without the C reader). Same records, order and errors as
    :func:`iter_raw`."""
    p = Path(path)
    if _c_scan is None or p.name.endswith(".gz"):
        yield from iter_raw(p)  # its Python scanner reads a file faster than records do
        return
    if p.is_dir():
        yield from _directory_chunks(p)
        return
    yield from _mapped(p, lambda data: _file_chunks(data, lambda: capture.iter_records(data)))


def iter_all_chunks(paths: Iterable[str | os.PathLike]) -> Iterator[Chunk | tuple]:
    """:func:`iter_chunks` of several captures, one after the other."""
    for path in paths:
        yield from iter_chunks(path)


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
    """:func:`raw_records` for :meth:`pgcdc.events.EventReader.read_chunks`: chunks of the
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


def _file_chunks(data, reference) -> Iterator[Chunk | tuple]:
    # As _raw_records: the reference reader checks the head and takes over at anything
    # unusual, from that record on, so errors and their offsets are its own.
    magic = capture.MAGIC
    start = len(magic) + 1
    if data[: len(magic)] != magic or len(data) < start or data[len(magic)] != FORMAT_VERSION:
        yield from record_items(reference())
        return
    yield from chunks_then(
        data,
        start,
        len(data),
        lambda _, done: record_items(itertools.islice(reference(), done, None)),
    )


def _directory_chunks(p: Path) -> Iterator[Chunk | tuple]:
    from .capture.segments import _segment_records, list_segments

    segments = list_segments(p)
    if not segments:
        yield from iter_raw(p)  # its error, or nothing
        return
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        data = seg.read_bytes()
        yield from _file_chunks(data, lambda seg=seg, last=last: _segment_records(seg, last))
