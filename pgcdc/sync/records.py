"""What is new in a sync's capture directory since the last look: whether a cycle has
anything to apply, and how many changes."""

from __future__ import annotations

from pathlib import Path


# pgoutput tags (a message's first byte)
_BEGIN = ord("B")
_CHANGES = frozenset(b"IUDT")  # insert, update, delete, truncate: the events counted
# records that alone leave nothing to apply: a transaction's frame, the descriptions of
# relations, types and origins, and logical decoding messages. Anything else (a stream's or a
# prepared transaction's records) makes the cycle run apply, whatever the count.
_QUIET = frozenset(b"BCRYOM")


class NewRecords:
    """Reads the capture directory's durable records once each, from where the last look
    stopped: how many change events (I/U/D/T) are new, and whether anything is to apply."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.done: dict[str, int] = {}  # segment name -> bytes looked at

    def look(self, floor: int | None) -> tuple[int, bool, int | None]:
        """(change events, whether to apply, durable LSN). Transactions whose Begin says they
        commit at or before ``floor`` (the applied position) are not counted."""
        import mmap

        from ..capture.segments import durable_segments
        from ..chunks import is_chunk
        from ..sources import FILE_HEADER_SIZE, range_chunks

        if not (self.directory / "state.json").exists():
            return 0, False, None
        files, state = durable_segments(self.directory)
        names = {path.name for path, _end in files}
        self.done = {n: b for n, b in self.done.items() if n in names}  # pruned ones go
        events, worth, counting = 0, False, True
        for path, end in files:
            size = path.stat().st_size
            end = size if end is None else end
            start = self.done.get(path.name, FILE_HEADER_SIZE)
            if start >= end:
                continue
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for item in range_chunks(data, start, end):
                    if is_chunk(item):
                        vals, offs = item.values, item.offsets
                        recs = zip(item.keys, item.tags, range(len(item.tags)))
                        for key, tag, i in recs:
                            if tag == _BEGIN:
                                o = offs[i] + 1
                                final = int.from_bytes(vals[o : o + 8], "big")
                                counting = floor is None or final > floor
                            elif tag in _CHANGES:
                                if counting or key & 1:  # in a stream: not yet known; count it
                                    events += 1
                                    worth = True
                            elif tag not in _QUIET:
                                worth = True
                    else:
                        gates, _lsn, payload = item
                        tag = payload[0] if len(payload) else 0
                        if tag == _BEGIN:
                            final = int.from_bytes(payload[1:9], "big")
                            counting = floor is None or final > floor
                        elif tag in _CHANGES:
                            if counting or (gates and gates[1]):
                                events += 1
                                worth = True
                        elif tag not in _QUIET:
                            worth = True
            self.done[path.name] = end
        return events, worth, None if state is None else state.lsn
