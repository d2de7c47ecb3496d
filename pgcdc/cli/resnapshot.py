"""``pgcdc resnapshot``: ask ``pgcdc sync`` for a new snapshot of tables, taken while the
other tables go on: how a table set aside (:mod:`pgcdc.sync.aside`) is taken up again once
the cause is fixed.

    pgcdc resnapshot --out DIR TABLE...
"""

from __future__ import annotations

import argparse
import sys

from pgcdc.cli._common import Parser, command, error
from pgcdc.status import sync_layout
from pgcdc.sync.aside import SetAside, is_running, known_tables, request
from pgcdc.tablekey import split_key

PROG = "pgcdc resnapshot"


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Ask the pgcdc sync of DIR for a new snapshot of each TABLE (schema.table), "
        "taken while the other tables go on and swapped into its Delta table with the changes "
        "after it in one commit: how a table set aside (pgcdc status shows them) is taken up "
        "again once the cause is fixed. A running sync takes it at its next tables check "
        "(--tables-check); if none runs, the next run does.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the pgcdc sync directory")
    p.add_argument("tables", nargs="+", metavar="TABLE", help="schema.table as PostgreSQL "
                   "spells it, or its key as pgcdc status names it")  # fmt: skip
    return p


def _named(arg: str, known) -> list[str]:
    """The keys of the tables ``arg`` names: a key, or schema.table spelled out (which two
    tables may share: public."a.b" and "public.a".b)."""
    if arg in known:
        return [arg]
    return sorted(k for k in known if (n := split_key(k)) and f"{n[0]}.{n[1]}" == arg)


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    if sync_layout(args.out) is None:
        return error(PROG, f"{args.out} is not a pgcdc sync directory (no _capture/ in it)")
    known = known_tables(args.out)
    tables, unknown = [], []
    for arg in args.tables:
        hits = _named(arg, known)
        if len(hits) > 1:
            return error(PROG, f"{arg} names {len(hits)} tables: say which by its key "
                         f"({', '.join(hits)})")  # fmt: skip
        (tables if hits else unknown).extend(hits or [arg])
    if unknown:
        have = ", ".join(sorted(known)) or "none yet"
        return error(PROG, f"{args.out} syncs no table {', '.join(unknown)} (its tables: {have})")
    args.tables = tables
    request(args.out, args.tables)
    aside = SetAside(args.out).tables
    when = ("the running sync takes it at its next tables check" if is_running(args.out)
            else "no sync runs on it now: the next run takes it")  # fmt: skip
    for name in args.tables:
        was = f" (set aside: {aside[name]['reason']})" if name in aside else ""
        print(f"{PROG}: a snapshot of {name}{was} is asked for: {when}, and its log says "
              "when it is loaded", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
