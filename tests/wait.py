"""The one way a test waits: ``until(what, check)`` polls ``check`` until it returns something
truthy, returns that, and fails after ``timeout`` seconds saying what it waited for and the
last value it saw (a wait for a server, a process, a file, a table to converge)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``until`` gave up: the thing waited for did not happen in time."""


def until(
    what: str,
    check: Callable[[], T],
    timeout: float = 30,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """``check()``'s first truthy value; polled every ``interval`` seconds for ``timeout``
    seconds, then an AssertionError naming ``what`` and the last value seen. An exception
    of a type in ``ignore`` counts as "not yet" (and is the last value seen); any other
    ends the wait."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = check()
        except ignore as e:  # not there yet
            last = e
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        time.sleep(interval)
