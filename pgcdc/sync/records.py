"""What is new in a sync's capture directory since the last look: whether a cycle has
anything to apply, and how many changes."""

from __future__ import annotations

import dataclasses
import mmap
from pathlib import Path

import pgoutput_codec as pgc

from pgcdc.capture.chunks import is_chunk
from pgcdc.capture.files import FILE_HEADER_SIZE, range_chunks
from pgcdc.capture.segments import durable_segments, segment_lsn


def _tags(*classes) -> frozenset[int]:
    """The pgoutput tags (a message's first byte) of the generated message ``classes``."""
    return frozenset(ord(cls.TAG) for cls in classes)


_BEGIN = ord(pgc.Begin.TAG)
# the events counted: insert, update, delete, truncate
_CHANGES = _tags(pgc.Insert, pgc.Update, pgc.Delete, pgc.Truncate)
# records that alone leave nothing to apply: a transaction's frame, the descriptions of
# relations, types and origins, and logical decoding messages. Anything else (a stream's or a
# prepared transaction's records) makes the cycle run apply, whatever the count.
_QUIET = _tags(pgc.Begin, pgc.Commit, pgc.Relation, pgc.Type, pgc.Origin, pgc.Message)
# a Begin's final LSN: its first field, 8 bytes big-endian after the tag (read here without
# decoding the message: a rerun's first look reads every Begin of its backlog)
assert [f.name for f in dataclasses.fields(pgc.Begin)][:1] == ["final_lsn"]
_FINAL_LSN = slice(1, 1 + 8)


def _final_lsn(data, at: int = 0) -> int:
    """The final LSN of the Begin whose tag is ``data[at]``."""
    return int.from_bytes(data[at + _FINAL_LSN.start : at + _FINAL_LSN.stop], "big")


class NewRecords:
    """Reads the capture directory's durable records once each, from where the last look
    stopped: how many change events (I/U/D/T) are new, and whether anything is to apply.

    A cycle looks before apply (is anything new?) and again after it with ``upto``, the
    position apply reached: apply reads what is durable when it starts, which is often more
    than the first look saw (the capture writes on), and those events are the cycle's too.
    What the second look reads past ``upto`` is kept for the next look, so no change is
    counted twice or lost from the count, and the next cycle still applies it.

    A segment followed by one that starts at or before the applied position is not read: a
    segment ends at a transaction's end, so every transaction in it committed before the
    next one's start (its name's LSN). A rerun's first look read every segment not yet
    pruned (0.27 s for 300 MB); it reads from the applied transaction's segment on. Only the
    count of a streamed transaction's changes written before that position and committed
    after it is lost (apply still applies them, and its Stream Commit still says there is
    something to apply)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.done: dict[str, int] = {}  # segment name -> bytes looked at
        self.later = (0, False)  # (events, worth applying) read past the last upto

    def after_apply(self, floor: int | None, applied: int, until=None) -> tuple[int, int | None]:
        """Look again once apply has reached ``applied`` (a commit LSN; apply read at least
        what the last look saw, being started after it): (the changes it applied past that
        look, the durable position when nothing durable is left to apply: the tables hold
        everything up to it; else None)."""
        events, _worth, durable = self.look(floor, upto=applied, until=until)
        return events, None if self.later[1] else durable

    def look(
        self, floor: int | None, upto: int | None = None, until=None
    ) -> tuple[int, bool, int | None]:
        """(change events, whether to apply, durable LSN). Transactions whose Begin says they
        commit at or before ``floor`` (the applied position) are not counted; those that
        commit past ``upto`` are left to the next look. ``until``: a durable position to look
        no further than (a Structured Streaming batch's end), rather than state.json's."""
        if not (self.directory / "state.json").exists():
            return 0, False, None
        files, state = durable_segments(self.directory, until)
        names = {path.name for path, _end in files}
        self.done = {n: b for n, b in self.done.items() if n in names}  # pruned ones go
        ceiling = (1 << 64) if upto is None else upto
        events, worth = self.later
        self.later = (0, False)
        counts = [0, 0]  # events now, events past upto
        worths = [worth, False]
        side = 0  # where the current transaction's changes go (None: applied already)

        def begin(final: int):
            if floor is not None and final <= floor:
                return None
            return 0 if final <= ceiling else 1

        starts = [segment_lsn(path.name) for path, _end in files]
        for k, (path, end) in enumerate(files):
            size = path.stat().st_size
            end = size if end is None else end
            start = self.done.get(path.name, FILE_HEADER_SIZE)
            if start >= end:
                continue
            if floor is not None and k + 1 < len(files) and starts[k + 1] <= floor + 1:
                self.done[path.name] = end  # applied: a rerun's first look reads none of it
                continue
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for item in range_chunks(data, start, end):
                    if is_chunk(item) and _plain(item):
                        side = _count_chunk(item, side, begin, counts, worths)
                        continue
                    triples = item.triples(0, len(item.tags)) if is_chunk(item) else (item,)
                    for gates, _lsn, payload in triples:
                        tag = payload[0] if len(payload) else 0
                        if tag == _BEGIN:
                            side = begin(_final_lsn(payload))
                        elif tag in _CHANGES:
                            where = 0 if gates and gates[1] else side  # a stream's: commit unknown
                            if where is not None:
                                counts[where] += 1
                                worths[where] = True
                        elif tag not in _QUIET:
                            worths[side or 0] = True
            self.done[path.name] = end
        self.later = (counts[1], worths[1])
        return events + counts[0], worths[0], None if state is None else state.lsn


_EVEN_KEYS = bytes(range(0, 256, 2))  # a record's key is odd when it was sent in a stream
_PLAIN_TAGS = bytes(_QUIET | _CHANGES)


def _plain(chunk) -> bool:
    """No record of the chunk was streamed, and every one is a change or quiet: its changes
    can be counted a transaction at a time (the usual chunk: 0.3 us a record otherwise, a
    tenth of a rerun's first cycle)."""
    return not chunk.keys.translate(None, _EVEN_KEYS) and not chunk.tags.translate(
        None, _PLAIN_TAGS
    )


def _count_chunk(chunk, side, begin, counts: list, worths: list):
    """Count a plain chunk's changes into ``counts``/``worths`` by the side each transaction
    goes to (``begin`` of its Begin's final LSN; ``side`` is the open one's); the last side."""
    tags, vals, offs = chunk.tags, chunk.values, chunk.offsets
    pos, n = 0, len(tags)
    while True:
        b = tags.find(_BEGIN, pos)
        stop = n if b < 0 else b
        if side is not None and stop > pos:
            c = sum(tags.count(t, pos, stop) for t in _CHANGES)
            if c:
                counts[side] += c
                worths[side] = True
        if b < 0:
            return side
        side = begin(_final_lsn(vals, offs[b]))
        pos = b + 1
