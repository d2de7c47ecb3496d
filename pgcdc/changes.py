"""``pgcdc changes``: print the change events of captures as JSON Lines.

One line per event, with Debezium's field names::

    {"op":"u","before":{"id":1},"after":{"id":2,"note":"x"},"unchanged":[],
     "source":{"lsn":"0/1A2B3C8","commit_lsn":"0/1A2B4F0","tx_ordinal":1,
               "commit_time":"2024-05-06T07:08:09.123456+00:00","xid":750,"origin":null,
               "schema":"public","table":"t"}}

Values are rendered as PostgreSQL's ``to_jsonb(row)`` renders them (see ``pgcdc.values``).
``unchanged`` lists unchanged TOAST columns that are left out of ``after``. A truncate gives
one ``t`` event per table (with ``"truncate": {"cascade": .., "restart_identity": ..}``); a
logical message is ``m`` with ``"message": {"prefix", "content" (\\x hex), "transactional"}``.
``--transactions`` adds ``{"status": "BEGIN"|"END", "id": xid, ...}`` lines around each
transaction. ``--columns`` adds the table's columns to each change line, with each type's
name: built-in types by name, others as their Type message named them (enums and composites
by their own name, a domain by its base type's, which is how pgoutput describes it). Their
values are their text, except a domain over a built-in type, which loads as that type.
``--lenient`` keeps going past values that do not load or unknown relations: the event
carries the value as sent and an ``errors`` list.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys

import orjson

import pgoutput_codec as pgc

from .events import EventReader
from .lsn import format_lsn, parse_lsn
from .capture.segments import CaptureDirError
from .sources import Captures, SourceError
from .spill import DEFAULT_MEMORY_LIMIT
from .values import dumps_images


_LOW = 0xFFFFFFFF


class EventRenderer:
    """Event -> one JSON line (bytes, no newline)."""

    def __init__(self, *, columns: bool = False):
        self._time_cache = (None, b"null")
        self._source_cache: tuple = (None, b"", b"")
        # columns: each change line also describes its table's columns (name, type name as
        # the stream described it, type OID, key), rendered once per relation version
        self._columns: dict[int, tuple[object, bytes]] | None = {} if columns else None

    def columns(self, rel) -> bytes:
        """``[{"name", "type", "oid", "key"}, ...]`` of a relation version."""
        cached = self._columns.get(id(rel))
        if cached is not None and cached[0] is rel:
            return cached[1]
        keys = set(rel.key_indexes)
        text = orjson.dumps(
            [
                {"name": n, "type": t, "oid": o, "key": i in keys}
                for i, (n, t, o) in enumerate(zip(rel.names, rel.type_names, rel.type_oids))
            ]
        )
        self._columns[id(rel)] = (rel, text)
        return text

    def _time(self, micros) -> bytes:
        cached = self._time_cache
        if cached[0] == micros:
            return cached[1]
        text = b"null" if micros is None else orjson.dumps(pgc.pg_datetime(micros).isoformat())
        self._time_cache = (micros, text)
        return text

    def source(self, ev) -> bytes:
        # Only lsn and tx_ordinal change from one event of a transaction to the next: the
        # rest is rendered once per (transaction, relation) and reused.
        key = (ev.commit_lsn, ev.commit_time, ev.xid, ev.origin, ev.relation)
        cached = self._source_cache
        if cached[0] != key:
            rel = ev.relation
            commit_lsn = ev.commit_lsn
            middle = b'","commit_lsn":"%X/%X","tx_ordinal":' % (commit_lsn >> 32, commit_lsn & _LOW)
            tail = b"".join(
                (
                    b',"commit_time":',
                    self._time(ev.commit_time),
                    b',"xid":',
                    b"null" if ev.xid is None else str(ev.xid).encode(),
                    b',"origin":',
                    orjson.dumps(ev.origin),
                    b',"schema":',
                    b"null" if rel is None else orjson.dumps(rel.schema),
                    b',"table":',
                    b"null" if rel is None else orjson.dumps(rel.table),
                    b"}",
                )
            )
            cached = self._source_cache = (key, middle, tail)
        lsn = ev.lsn
        return b'{"lsn":"%X/%X%s%d%s' % (lsn >> 32, lsn & _LOW, cached[1], ev.tx_ordinal, cached[2])

    def render(self, ev) -> bytes:
        op = ev.op
        rel = ev.relation
        if op in ("c", "u", "d"):
            before, after = dumps_images(ev)
            parts = [
                b'{"op":"',
                op.encode(),
                b'","before":',
                b"null" if before is None else before,
                b',"after":',
                b"null" if after is None else after,
                b',"unchanged":',
                orjson.dumps(list(ev.unchanged)) if ev.unchanged else b"[]",
            ]
        elif op == "t":
            cascade, restart = ev.detail
            parts = [
                b'{"op":"t","before":null,"after":null,"truncate":',
                orjson.dumps({"cascade": cascade, "restart_identity": restart}),
            ]
        elif op == "m":
            prefix, content, transactional = ev.detail
            message = {
                "prefix": prefix,
                "content": "\\x" + bytes(content).hex(),
                "transactional": transactional,
            }
            parts = [b'{"op":"m","before":null,"after":null,"message":', orjson.dumps(message)]
        else:  # begin / end
            status = b"BEGIN" if op == "begin" else b"END"
            parts = [b'{"status":"', status, b'","id":', orjson.dumps(ev.xid)]
            if op == "end":
                parts += [b',"event_count":', str(ev.detail[0]).encode()]
        if self._columns is not None and rel is not None:
            parts += [b',"columns":', self.columns(rel)]
        if ev.errors:
            parts += [b',"errors":', orjson.dumps([str(e) for e in ev.errors])]
        parts += [b',"source":', self.source(ev), b"}"]
        return b"".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pgcdc changes",
        description="Print the change events of capture files or capture directories as "
        "JSON Lines (Debezium field names), in commit order.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="capture file or directory")
    p.add_argument(
        "--from-lsn",
        metavar="L",
        help="only transactions that commit at or after L (e.g. 16/B374D848)",
    )
    p.add_argument("--until-lsn", metavar="L", help="only transactions that commit at or before L")
    p.add_argument(
        "--table",
        action="append",
        metavar="PATTERN",
        help="only changes of tables matching PATTERN (shell glob on schema.table or table; "
        "repeatable); messages and transaction lines are kept",
    )
    p.add_argument(
        "--transactions", action="store_true", help="add BEGIN/END lines around transactions"
    )
    p.add_argument(
        "--lenient",
        action="store_true",
        help="keep going past values that do not load and unknown relations: the event "
        "carries the raw value and an errors list",
    )
    p.add_argument(
        "--memory-limit",
        type=int,
        default=DEFAULT_MEMORY_LIMIT >> 20,
        metavar="MIB",
        help="buffer open streamed/prepared transactions up to this many MiB, then spill "
        "to disk (default %(default)s)",
    )
    p.add_argument(
        "--columns",
        action="store_true",
        help='describe the table\'s columns on each change line: "columns": [{"name", "type", '
        '"oid", "key"}] (types the stream did not describe are "")',
    )
    p.add_argument("--spill-dir", metavar="DIR", help="directory for spill files (default: TMPDIR)")
    return p


def _table_filter(patterns):
    if not patterns:
        return None
    cache: dict[int, bool] = {}

    def keep(rel) -> bool:
        hit = cache.get(id(rel))
        if hit is None:
            names = (rel.table, f"{rel.schema}.{rel.table}")
            hit = any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)
            cache[id(rel)] = hit
        return hit

    return keep


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        lo = parse_lsn(args.from_lsn) if args.from_lsn else None
        hi = parse_lsn(args.until_lsn) if args.until_lsn else None
    except ValueError as e:
        print(f"pgcdc changes: {e}", file=sys.stderr)
        return 2
    keep_table = _table_filter(args.table)
    reader = EventReader(
        transaction_events=args.transactions,
        lenient=args.lenient,
        memory_limit=args.memory_limit << 20,
        spill_dir=args.spill_dir,
    )
    render = EventRenderer(columns=args.columns).render
    out = sys.stdout.buffer
    write = out.write
    try:
        captures = Captures.open(args.captures)
    except (SourceError, CaptureDirError) as e:
        print(f"pgcdc changes: error: {e}", file=sys.stderr)
        return 2
    for note in captures.notes:
        print(f"pgcdc changes: note: {note}", file=sys.stderr)
    events = transactions = 0
    last_commit = None
    try:
        for ev in reader.read_chunks(captures.chunks()):
            commit_lsn = ev.commit_lsn
            if lo is not None and commit_lsn < lo:
                continue
            if hi is not None and commit_lsn > hi:
                break  # events come in commit order: nothing later qualifies
            if keep_table is not None and ev.relation is not None and not keep_table(ev.relation):
                continue
            write(render(ev))
            write(b"\n")
            events += 1
            if commit_lsn != last_commit:
                transactions += 1
                last_commit = commit_lsn
        out.flush()
    except BrokenPipeError:
        return 0
    except CaptureDirError as e:  # a segment changed while it was read
        out.flush()
        print(f"pgcdc changes: error: {e}", file=sys.stderr)
        return 2
    except (SourceError, ValueError, OSError) as e:
        out.flush()
        print(f"pgcdc changes: {e}", file=sys.stderr)
        return 1
    left = reader.pending()
    if left is not None and hi is None:
        print(f"pgcdc changes: note: {left}", file=sys.stderr)
    print(
        f"pgcdc changes: {events:,} events from {transactions:,} transactions"
        + ("" if last_commit is None else f", the last committed at {format_lsn(last_commit)}"),
        file=sys.stderr,
    )
    return 0
