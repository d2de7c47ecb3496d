"""Capture files: messages with the parameters needed to decode each one.

Layout (big-endian), also described by each spec's generated capture .ksy, so the Kaitai Web
IDE opens these files with nothing to set:

    magic            the spec's capture magic (e.g. PGOUTCAP)
    format_version   u1 = 1
    records, to the end of the file:
        version      u1   the spec's version parameter (e.g. protocol_version)
        flags        u1   bit i: the spec's i-th context holds for this message
        lsn          u8   the LSN the server reported with the message
        length       u4
        message      `length` bytes of one message

Paths ending in .gz are read and written gzip-compressed. A generated codec's `capture` module
declares its Record class (version, contexts, lsn, data) and binds a CaptureFormat to it.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator
from struct import Struct

from .errors import DecodeError

__all__ = ["FORMAT_VERSION", "RECORD_HEADER", "CaptureFormat"]

FORMAT_VERSION = 1
RECORD_HEADER = Struct(">BBQI")  # version, flags, lsn, length


def _open(target, mode: str):
    if isinstance(target, (str, os.PathLike)):
        path = os.fspath(target)
        if path.endswith(".gz"):
            # mtime 0 keeps rewritten captures byte-identical
            return gzip.GzipFile(path, mode, mtime=0) if "w" in mode else gzip.open(path, mode)
        return open(path, mode)
    return None


class CaptureFormat:
    """Reads and writes capture files of one codec.

    `record` is the codec's Record class, built as record(version, *contexts, lsn, data);
    `contexts` names its context fields in flag-bit order; `resolve` checks a record's
    parameters (the codec's ParamSpec.resolve for version and contexts)."""

    def __init__(self, magic: bytes, record: type, contexts: tuple[str, ...]):
        self.magic = magic
        self.record = record
        self.contexts = contexts

    # -- writing ---------------------------------------------------------------------------
    def dumps(self, records: Iterable) -> bytes:
        parts = [self.magic, bytes((FORMAT_VERSION,))]
        pack = RECORD_HEADER.pack
        for index, r in enumerate(records):
            flags = 0
            for bit, name in enumerate(self.contexts):
                if getattr(r, name):
                    flags |= 1 << bit
            data = bytes(r.data)
            try:
                parts.append(pack(r.version, flags, r.lsn, len(data)))
            except Exception as exc:  # struct.error or TypeError: a field out of range
                raise DecodeError(
                    0, ("capture", "records", index), f"cannot write this record: {exc}"
                ) from None
            parts.append(data)
        return b"".join(parts)

    def write(self, target, records: Iterable) -> None:
        """Write records to a path (gzip when it ends in .gz) or a binary file object."""
        data = self.dumps(records)
        f = _open(target, "wb")
        if f is None:
            target.write(data)
            return
        with f:
            f.write(data)

    # -- reading ---------------------------------------------------------------------------
    def iter_records(self, data: bytes) -> Iterator:
        """Records of a capture held in memory; DecodeError names the file offset and record."""
        magic = self.magic
        if data[: len(magic)] != magic:
            raise DecodeError(0, ("capture", "magic"), f"not a capture file (expected {magic!r})")
        if len(data) < len(magic) + 1 or data[len(magic)] != FORMAT_VERSION:
            raise DecodeError(
                len(magic),
                ("capture", "format_version"),
                f"unsupported capture format version (expected {FORMAT_VERSION})",
            )
        off = len(magic) + 1
        n = len(data)
        index = 0
        unpack = RECORD_HEADER.unpack_from
        size = RECORD_HEADER.size
        record = self.record
        bits = tuple(1 << i for i in range(len(self.contexts)))
        while off < n:
            if off + size > n:
                raise DecodeError(off, ("capture", "records", index), "truncated record header")
            version, flags, lsn, length = unpack(data, off)
            start = off + size
            if start + length > n:
                raise DecodeError(
                    start,
                    ("capture", "records", index, "message"),
                    f"record says {length} bytes, file has {n - start}",
                )
            yield record(
                version, *(bool(flags & b) for b in bits), lsn, data[start : start + length]
            )
            off = start + length
            index += 1

    def loads(self, data: bytes) -> list:
        return list(self.iter_records(data))

    def read(self, source) -> list:
        """Read all records from a path (gzip when it ends in .gz) or a binary file object."""
        f = _open(source, "rb")
        if f is None:
            return self.loads(source.read())
        with f:
            return self.loads(f.read())
