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

from pgcdc.runtime.codec_errors import DecodeError, EncodeError

__all__ = ["FORMAT_VERSION", "RECORD_HEADER", "CaptureFormat", "checked_payloads"]

FORMAT_VERSION = 1
RECORD_HEADER = Struct(">BBQI")  # version, flags, lsn, length
MAX_LSN = (1 << 64) - 1
MAX_LENGTH = (1 << 32) - 1
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _lsn_problem(lsn) -> str | None:
    if type(lsn) is not int:
        if isinstance(lsn, str):
            return f"an LSN is an int (use pgcdc.parse_lsn for text), not {lsn!r}"
        return f"an LSN is an int, not {type(lsn).__name__}"
    if not 0 <= lsn <= MAX_LSN:
        return f"LSN {lsn} is outside 0..{MAX_LSN}"
    return None


def checked_payloads(items: Iterable) -> Iterator[tuple[int, bytes]]:
    """(lsn, payload) pairs as (int, bytes); DecodeError names the pair that is not one."""
    for index, item in enumerate(items):
        path = ("capture", "records", index)
        try:
            lsn, payload = item
        except (TypeError, ValueError):
            raise DecodeError(
                0, path, f"expected an (lsn, payload) pair, got {item!r:.60}"
            ) from None
        why = _lsn_problem(lsn)
        if why is not None:
            raise DecodeError(0, (*path, "lsn"), why)
        if not isinstance(payload, _BYTES_LIKE):
            raise DecodeError(
                0, (*path, "message"), f"a message is bytes-like, not {type(payload).__name__}"
            )
        yield lsn, bytes(payload)


def _buffer(data):
    """The capture held in memory (bytes-like, or an mmap); TypeError otherwise."""
    try:
        memoryview(data).release()
    except TypeError:
        raise TypeError(
            f"a capture is bytes, bytearray, memoryview or mmap, not {type(data).__name__}"
        ) from None
    return data


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
    `contexts` names its context fields in flag-bit order; `versions` lists the version values
    a record may carry when written. Reading raises DecodeError, writing EncodeError, each with
    the file offset and the record's path; input that is not bytes-like is a TypeError."""

    def __init__(
        self, magic: bytes, record: type, contexts: tuple[str, ...], versions: tuple | None = None
    ):
        self.magic = magic
        self.record = record
        self.contexts = contexts
        self.versions = versions  # the version values a record may have (None: any byte)

    # -- writing ---------------------------------------------------------------------------
    def dumps(self, records: Iterable) -> bytes:
        """The capture file's bytes; EncodeError names the record and field that cannot be
        written (the file offset it would have had, and ("capture", "records", i, field))."""
        parts = [self.magic, bytes((FORMAT_VERSION,))]
        off = len(self.magic) + 1
        pack = RECORD_HEADER.pack
        record = self.record
        for index, r in enumerate(records):
            path = ("capture", "records", index)
            if not isinstance(r, record):
                raise EncodeError(
                    off, path, f"expected a {record.__name__}, got {type(r).__name__}"
                )
            version = r.version
            if type(version) is not int or (
                self.versions is not None and version not in self.versions
            ):
                allowed = list(self.versions) if self.versions is not None else "0..255"
                raise EncodeError(off, (*path, "version"), f"{version!r} is not one of {allowed}")
            flags = 0
            for bit, name in enumerate(self.contexts):
                value = getattr(r, name)
                if type(value) is not bool:
                    raise EncodeError(off, (*path, name), f"expected a bool, got {value!r:.40}")
                if value:
                    flags |= 1 << bit
            why = _lsn_problem(r.lsn)
            if why is not None:
                raise EncodeError(off, (*path, "lsn"), why)
            data = r.data
            if not isinstance(data, _BYTES_LIKE):
                raise EncodeError(
                    off, (*path, "data"), f"expected bytes, got {type(data).__name__}"
                )
            data = bytes(data)
            if len(data) > MAX_LENGTH:
                raise EncodeError(off, (*path, "data"), f"{len(data)} bytes is over {MAX_LENGTH}")
            try:
                parts.append(pack(version, flags, r.lsn, len(data)))
            except Exception as exc:  # struct.error: a version outside 0..255
                raise EncodeError(off, path, f"cannot write this record: {exc}") from None
            parts.append(data)
            off += RECORD_HEADER.size + len(data)
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
        data = _buffer(data)
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
            if flags >> len(bits):
                raise DecodeError(
                    off + 1,
                    ("capture", "records", index, "flags"),
                    f"flag bits 0x{flags:02x} set beyond the {len(bits)} context(s)",
                )
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
