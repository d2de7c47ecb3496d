"""``pgcdc status``: where a pipeline stands (see :mod:`pgcdc.status`); reads, never writes.

pgcdc status cap/ --state tables/ --dsn "host=db dbname=app user=cdc" [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from pgcdc.status import StatusError, pipeline_status, render_text, sync_layout
from pgcdc.cli._common import Parser, command, error, usage_error

PROG = "pgcdc status"


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Show where a pipeline stands: a capture directory's durable position, "
        "an apply state's applied position and tables, and with --dsn the slot on the server "
        "(confirmed position, retained WAL, wal_status, safe_wal_size) and each stage's lag.",
    )
    p.add_argument(
        "capture",
        nargs="?",
        metavar="DIR",
        help="a capture directory, or a pgcdc sync directory (its capture and its tables)",
    )
    p.add_argument("--state", metavar="DIR", help="apply state directory (pgcdc apply --out)")
    p.add_argument("--dsn", help="connect to the server to show the slot and the lag")
    p.add_argument("--slot", help="the slot (default: the one the capture directory records)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.capture is None and args.state is None and args.dsn is None:
        return usage_error(PROG, "give a capture directory, --state DIR or --dsn")
    layout = sync_layout(args.capture) if args.capture and args.state is None else None
    if layout is not None:
        args.capture, args.state = layout
    try:
        doc = pipeline_status(args.capture, args.state, args.dsn, args.slot)
    except StatusError as e:
        return error(PROG, str(e))
    except Exception as e:  # psycopg's errors: a server that cannot be reached
        if type(e).__module__.startswith("psycopg"):
            return error(PROG, f"cannot read the slot: {' '.join(str(e).split())}")
        raise
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print(render_text(doc))
    for w in doc["warnings"]:
        if args.json:
            print(f"{PROG}: warning: {w}", file=sys.stderr)
    return 0
