"""``pgcdc changes``: print the change events of captures as JSON Lines (the format is
:mod:`pgcdc.events.jsonlines`'s). ``--transactions`` adds BEGIN/END lines around each transaction;
``--columns`` describes each change's table; ``--lenient`` keeps going past values that do
not load or unknown relations: the event carries the value as sent and an ``errors`` list.
"""

from __future__ import annotations

import argparse
import sys

from pgcdc.capture.segments import CaptureDirError
from pgcdc.events.reader import captures_reader
from pgcdc.events.jsonlines import EventRenderer, table_filter
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.files import Captures, SourceError
from pgcdc.events.spill import DEFAULT_MEMORY_LIMIT
from pgcdc.cli._common import Parser, command


def _parser() -> argparse.ArgumentParser:
    p = Parser(
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


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        lo = parse_lsn(args.from_lsn) if args.from_lsn else None
        hi = parse_lsn(args.until_lsn) if args.until_lsn else None
    except ValueError as e:
        print(f"pgcdc changes: {e}", file=sys.stderr)
        return 2
    keep_table = table_filter(args.table)
    try:
        captures = Captures.open(args.captures)
        catalog = captures.catalog  # what the capture recorded of types not built in
    except (SourceError, CaptureDirError) as e:
        print(f"pgcdc changes: error: {e}", file=sys.stderr)
        return 2
    reader = captures_reader(
        captures,
        transaction_events=args.transactions,
        lenient=args.lenient,
        memory_limit=args.memory_limit << 20,
        spill_dir=args.spill_dir,
    )
    render = EventRenderer(columns=args.columns, catalog=catalog).render
    out = sys.stdout.buffer
    write = out.write
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
