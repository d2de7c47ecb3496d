"""What every command shares: exit codes (and which error is which: :func:`exit_code`), a
parser whose errors are one line, and how an error is printed."""

from __future__ import annotations

import argparse
import functools
import sys
from importlib.util import find_spec

from pgcdc.cli.exits import BAD_DATA, INTERRUPTED, OK, USAGE  # noqa: F401  (every command's)
from pgcdc.errors import DataError, Interrupted, SetupError


def exit_code(error: BaseException, default: int = BAD_DATA) -> int:
    """The exit status of a command ended by ``error``, the one place the library's errors
    become exit statuses: a stop 130, :class:`SetupError` 2, :class:`DataError` 1; else
    ``default``."""
    if isinstance(error, (KeyboardInterrupt, Interrupted)):
        return INTERRUPTED
    if isinstance(error, SetupError):
        return USAGE
    if isinstance(error, DataError):
        return BAD_DATA
    return default


class UsageError(SetupError):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option raises UsageError, which :func:`command` turns into one line
    on stderr naming --help and exit 2 (argparse would print the usage and exit)."""

    def error(self, message):
        raise UsageError(self.prog, message)


def command(main):
    """A command's ``main(argv) -> int``: a UsageError from its parser or its own checks is
    returned as exit 2 with one line, not raised, so callers (and tests) get the code."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UsageError as e:
            return usage_error(e.prog, str(e))

    return run


def require(*modules: str) -> None:
    """Raise ModuleNotFoundError (which pgcdc.cli turns into the extra to install) for the
    first of ``modules`` that is not installed, without importing any of them: a command
    that needs one later need not pay for its import at its start."""
    for name in modules:
        if find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def usage_error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message} (see {prog} --help)", file=sys.stderr)
    return USAGE


def error(prog: str, message: str, code: int = USAGE) -> int:
    """Print ``prog: error: message`` (or ``prog: message`` for bad data) and return code."""
    label = "error: " if code == USAGE else ""
    print(f"{prog}: {label}{message}", file=sys.stderr)
    return code


def note(prog: str, message: str) -> None:
    print(f"{prog}: note: {message}", file=sys.stderr)
