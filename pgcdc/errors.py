"""pgcdc's exceptions: one hierarchy, two branches.

- :class:`SetupError`: the input, the options, the directory or the server's set-up do not
  allow the work (a slot of another directory, a capture directory that cannot be read, a
  server that refuses): retrying as it is will not help; the fix is named in the message.
- :class:`DataError`: the input was read, and something in it cannot be processed (a value
  that does not load, a stream out of order, a table's commit refused).

Every error pgcdc raises on purpose is one of them, and keeps the builtin base it had
(``class ApplyError(DataError, ValueError)``), so ``except ValueError`` still catches it.
The library only raises; the exit statuses are :mod:`pgcdc.cli`'s (SetupError 2, DataError
1, :class:`Interrupted` 130, as psycopg's ``errors`` leave the exit to the application).

This module imports nothing of pgcdc: the ground layer (:mod:`pgcdc.runtime`) may import it.
"""

from __future__ import annotations

__all__ = ["DataError", "Interrupted", "PgcdcError", "SetupError"]


class PgcdcError(Exception):
    """The base of every error pgcdc raises on purpose."""


class SetupError(PgcdcError):
    """Bad input or set-up: an option, a directory, a slot or a server that does not go with
    the rest (one line naming the fix)."""


class DataError(PgcdcError):
    """Bad data: something read cannot be processed."""


class Interrupted(PgcdcError):
    """A stop (SIGINT/SIGTERM) cut off work that a rerun must do again, as KeyboardInterrupt
    does (``pgcdc sync`` stopped during its initial snapshot)."""
