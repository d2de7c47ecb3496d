"""The ``pgcdc`` command: one module per subcommand (argument parsing and the call into the
library, nothing more), imported only when it runs. ``python -m pgcdc`` comes here too.
The library raises (:mod:`pgcdc.errors`); the commands alone turn that into exit statuses
(:mod:`pgcdc.cli.exits`, :func:`pgcdc.cli._common.exit_code`)."""

from __future__ import annotations

import importlib
import os
import sys

from pgcdc.cli.exits import INTERRUPTED, OK, USAGE
from pgcdc.extras import EXTRA_OF, missing

# subcommand -> (module with main(argv) -> int, one-line help)
COMMANDS = {
    "capture": ("pgcdc.cli.capture", "read a replication slot into a capture directory"),
    "changes": ("pgcdc.cli.changes", "print the change events of captures as JSON Lines"),
    "snapshot": ("pgcdc.cli.snapshot", "create a slot and write its tables at its snapshot"),
    "apply": ("pgcdc.cli.apply", "apply captures to Delta tables with Spark"),
    "status": ("pgcdc.cli.status", "show a pipeline's positions, the slot and the lag"),
    "prune": ("pgcdc.cli.prune", "delete capture segments that are durable and applied"),
    "sync": ("pgcdc.cli.sync", "snapshot, capture and apply: keep Delta tables current"),
    "resnapshot": ("pgcdc.cli.resnapshot", "ask pgcdc sync for a new snapshot of tables"),
    "demo": ("pgcdc.cli.demo", "start a throwaway PostgreSQL with changes to capture"),
    "kaitai": ("pgcdc.cli.kaitai", "write the Kaitai Struct files for the Kaitai Web IDE"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pgcdc")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`pgcdc ... | head`): not an error of ours; point stdout at
        # devnull so the interpreter's final flush does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE
    except KeyboardInterrupt:
        print("pgcdc: interrupted", file=sys.stderr)
        return INTERRUPTED


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-V", "--version"):
        print(f"pgcdc {_version()}")
        return OK
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: pgcdc COMMAND [options]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\nRun 'pgcdc COMMAND --help' for a command's options; 'pgcdc --version' for the")
        print("version. Exit status: 0 done, 1 bad data, 2 bad input or set-up, 130 interrupted.")
        return OK if argv else USAGE
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"pgcdc: unknown command {name!r} (one of: {', '.join(COMMANDS)})", file=sys.stderr)
        return USAGE
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return module.main(rest)
    except ModuleNotFoundError as exc:
        # An optional dependency: say which extra brings it, not a traceback.
        top = (exc.name or "").split(".")[0]
        if top not in EXTRA_OF or _installed(top):
            raise  # not a missing extra: a module of an installed one, its traceback says why
        print(f"pgcdc {name}: {missing(top, 'this command').args[0]}", file=sys.stderr)
        return USAGE


def _installed(top: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(top) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
