"""Buffers for transactions that cannot be emitted yet, spilled to disk past a memory bound.

A streamed transaction (protocol 2+) arrives in blocks interleaved with others and is only
known to commit at Stream Commit; a prepared one waits for COMMIT PREPARED. Either can be
gigabytes, so every buffer keeps the raw message bytes (not decoded objects) and a shared
:class:`MemoryBudget` moves the largest buffer to an anonymous temporary file when the total
passes the bound, the way PostgreSQL's reorder buffer spills past logical_decoding_work_mem.
Memory then stays flat however large the transaction grows.

An aborted subtransaction's entries are removed from memory at once and remembered as an
aborted xid, so entries already on disk are skipped when the buffer is read back.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator

DEFAULT_MEMORY_LIMIT = 64 << 20
# Python's memory per buffered entry besides the payload: the 5-tuple with its GC header (96),
# three ints that are not small (88), the bytes header and malloc's rounding (~49), the list
# slot (8). Counted so that the bound holds for small rows too.
ENTRY_OVERHEAD = 240

# subxid, message index, lsn, relation-cache epoch, payload length
_HEAD = struct.Struct(">QQQQI")
_READ_CHUNK = 1 << 20
_WRITE_CHUNK = 1 << 20


class MemoryBudget:
    """The bound shared by all open buffers of one reader."""

    def __init__(self, limit: int = DEFAULT_MEMORY_LIMIT, spill_dir: str | None = None):
        if limit < 0:
            raise ValueError(f"memory limit must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.spill_dir = spill_dir
        self.in_memory = 0
        self.buffers: set[TransactionBuffer] = set()
        self.spilled_bytes = 0  # total ever written to disk, for reports and tests

    def grew(self) -> None:
        """Called after buffers grew: spill the largest until the total is within the bound."""
        while self.in_memory > self.limit and self.buffers:
            largest = max(self.buffers, key=lambda b: b.nbytes)
            if not largest.nbytes:
                break
            largest.spill()


class TransactionBuffer:
    """The changes of one open transaction in arrival order: (subxid, index, lsn, epoch, data)."""

    __slots__ = ("budget", "entries", "nbytes", "_file", "_file_entries", "aborted", "__weakref__")

    def __init__(self, budget: MemoryBudget):
        self.budget = budget
        self.entries: list[tuple[int, int, int, int, bytes]] = []
        self.nbytes = 0
        self._file = None
        self._file_entries = 0
        self.aborted: set[int] = set()
        budget.buffers.add(self)

    def append(self, subxid: int, index: int, lsn: int, epoch: int, data: bytes) -> None:
        self.entries.append((subxid, index, lsn, epoch, data))
        size = len(data) + ENTRY_OVERHEAD
        self.nbytes += size
        budget = self.budget
        budget.in_memory += size
        if budget.in_memory > budget.limit:
            budget.grew()

    def abort_subxact(self, subxid: int) -> None:
        """Drop the entries of one aborted subtransaction (in memory now, on disk when read)."""
        self.aborted.add(subxid)
        kept = [e for e in self.entries if e[0] != subxid]
        if len(kept) != len(self.entries):
            size = sum(len(e[4]) + ENTRY_OVERHEAD for e in kept)
            self.budget.in_memory -= self.nbytes - size
            self.nbytes = size
            self.entries = kept

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def spill(self) -> None:
        """Move the in-memory entries to this buffer's temporary file."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="pgcdc-spill-", dir=self.budget.spill_dir)
        # Written a megabyte at a time: joining all entries into one blob would hold a second
        # copy of everything being spilled, doubling the peak the bound is meant to cap.
        pack = _HEAD.pack
        write = self._file.write
        chunk = bytearray()
        written = 0
        for subxid, index, lsn, epoch, data in self.entries:
            chunk += pack(subxid, index, lsn, epoch, len(data))
            chunk += data
            if len(chunk) >= _WRITE_CHUNK:
                write(chunk)
                written += len(chunk)
                chunk.clear()
        write(chunk)
        written += len(chunk)
        self.budget.spilled_bytes += written
        self._file_entries += len(self.entries)
        self.budget.in_memory -= self.nbytes
        self.entries = []
        self.nbytes = 0

    def __len__(self) -> int:
        return self._file_entries + len(self.entries)

    def __iter__(self) -> Iterator[tuple[int, int, int, int, bytes]]:
        """All entries that were not aborted, spilled ones first (they came first)."""
        aborted = self.aborted
        if self._file is not None:
            f = self._file
            f.flush()
            f.seek(0)
            for entry in _read_entries(f, self._file_entries):
                if entry[0] not in aborted:
                    yield entry
            f.seek(0, 2)  # appends continue at the end
        for entry in self.entries:
            if entry[0] not in aborted:
                yield entry

    def close(self) -> None:
        """Release memory and the file; the buffer is empty afterwards."""
        self.budget.in_memory -= self.nbytes
        self.budget.buffers.discard(self)
        self.entries = []
        self.nbytes = 0
        if self._file is not None:
            self._file.close()
            self._file = None
            self._file_entries = 0


def _read_entries(f, count: int) -> Iterator[tuple[int, int, int, int, bytes]]:
    # Read in chunks: one read per entry costs far more than slicing a megabyte.
    unpack = _HEAD.unpack_from
    hsize = _HEAD.size
    buf = b""
    pos = 0
    for _ in range(count):
        if len(buf) - pos < hsize:
            buf = buf[pos:] + f.read(_READ_CHUNK)
            pos = 0
        subxid, index, lsn, epoch, n = unpack(buf, pos)
        pos += hsize
        if len(buf) - pos < n:
            buf = buf[pos:] + f.read(max(_READ_CHUNK, n))
            pos = 0
        yield subxid, index, lsn, epoch, buf[pos : pos + n]
        pos += n
