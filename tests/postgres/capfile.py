"""Reader/writer for the project's capture container (``.pgcap`` / ``.pgcap.gz``).

Stand-in until ``pgoutput_codec.capture`` exists; the format is identical (all big-endian):

    header: magic b"PGOUTCAP", u1 format_version (= 1)
    records until EOF: u1 protocol_version, u1 flags, u8 lsn, u4 length, length bytes
        flags bit0 = in_stream (between Stream Start 'S' and the next Stream Stop 'E',
                     exclusive of both), bit1 = parallel_streaming (slot option streaming=parallel)
"""

from __future__ import annotations

import gzip
import io
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"PGOUTCAP"
FORMAT_VERSION = 1
_REC = struct.Struct(">BBQI")

FLAG_IN_STREAM = 0x01
FLAG_PARALLEL = 0x02


@dataclass(frozen=True)
class Record:
    protocol_version: int
    in_stream: bool
    parallel_streaming: bool
    lsn: int
    data: bytes


def _open(path, mode: str):
    p = str(path)
    if p.endswith(".gz"):
        # mtime=0 keeps regenerated fixtures byte-stable
        if "w" in mode:
            return gzip.GzipFile(p, mode, compresslevel=9, mtime=0)
        return gzip.open(p, mode)
    return open(p, mode)


def dumps(records) -> bytes:
    out = io.BytesIO()
    out.write(MAGIC + bytes([FORMAT_VERSION]))
    for r in records:
        flags = (FLAG_IN_STREAM if r.in_stream else 0) | (FLAG_PARALLEL if r.parallel_streaming else 0)
        out.write(_REC.pack(r.protocol_version, flags, r.lsn, len(r.data)))
        out.write(r.data)
    return out.getvalue()


def loads(blob: bytes) -> list[Record]:
    if blob[:8] != MAGIC:
        raise ValueError("not a pgoutput capture (bad magic)")
    if blob[8] != FORMAT_VERSION:
        raise ValueError(f"unsupported capture format version {blob[8]}")
    pos, recs = 9, []
    while pos < len(blob):
        if pos + _REC.size > len(blob):
            raise ValueError(f"truncated record header at offset {pos}")
        pv, flags, lsn, n = _REC.unpack_from(blob, pos)
        pos += _REC.size
        if pos + n > len(blob):
            raise ValueError(f"truncated record payload at offset {pos}")
        recs.append(Record(pv, bool(flags & FLAG_IN_STREAM), bool(flags & FLAG_PARALLEL), lsn,
                           bytes(blob[pos:pos + n])))
        pos += n
    return recs


def write(path, records) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "wb") as f:
        f.write(dumps(records))


def read(path) -> list[Record]:
    with _open(path, "rb") as f:
        return loads(f.read())


def records_from_payloads(payloads, protocol_version: int, parallel: bool) -> list[Record]:
    """Build records from (lsn, payload) pairs, tracking in_stream from the message bytes."""
    recs, in_stream = [], False
    for lsn, data in payloads:
        kind = data[:1]
        recs.append(Record(protocol_version, in_stream and kind not in (b"S", b"E"), parallel,
                           lsn, bytes(data)))
        if kind == b"S":
            in_stream = True
        elif kind == b"E":
            in_stream = False
    return recs
