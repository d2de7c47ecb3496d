"""``pgcdc prune``: delete the capture segments every change of which is applied (see
:mod:`pgcdc.capture.prune`); never the segment a capture writes, never state.json,
catalog.jsonl or relations.jsonl.

pgcdc prune cap/ --applied-state tables/ [--dry-run] [--json]
"""

from __future__ import annotations

import argparse
import json

from pgcdc.capture.runner import human_bytes
from pgcdc.capture.segments import CaptureDirError
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.prune import PruneError, applied_position, prune
from pgcdc.cli._common import Parser, command, error, usage_error

PROG = "pgcdc prune"


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Delete the segments of a capture directory that are durable and fully "
        "applied: below both the capture's durable position and the applied position. The "
        "segment being written, state.json, catalog.jsonl and relations.jsonl stay. Run it "
        "between apply runs.",
    )
    p.add_argument("capture", metavar="CAPTURE_DIR", help="capture directory")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--applied-state", metavar="DIR",
                       help="apply state directory (pgcdc apply --out): its applied position")  # fmt: skip
    where.add_argument("--applied-lsn", metavar="LSN",
                       help="the commit LSN everything is applied up to (another applier's)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.applied_lsn is not None:
            try:
                applied = parse_lsn(args.applied_lsn)
            except ValueError as e:
                return usage_error(PROG, f"--applied-lsn: {e}")
        else:
            applied = applied_position(args.applied_state, args.capture)
        plan = prune(args.capture, applied, dry_run=args.dry_run)
    except (PruneError, CaptureDirError) as e:
        return error(PROG, str(e))
    if args.json:
        print(json.dumps(plan.to_json(), indent=1, sort_keys=True))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    for seg in plan.delete:
        print(f"{verb} {seg.path.name} ({human_bytes(seg.size)})")
    applied_text = "nothing" if applied is None else format_lsn(applied)
    print(
        f"{verb} {len(plan.delete)} segment(s), {human_bytes(plan.bytes)}; kept "
        f"{len(plan.keep)} (applied up to {applied_text}"
        + (f"; {plan.stopped_at}" if plan.stopped_at else "")
        + ")"
    )
    return 0
