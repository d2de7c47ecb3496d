"""tests/wait.py: ``until`` returns the check's truthy value, and on timeout fails naming what
it waited for and the last value it saw."""

from __future__ import annotations

import itertools

import pytest

from tests.wait import until

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm


def test_returns_the_first_truthy_value():
    counter = itertools.count()
    assert until("the third poll", lambda: max(next(counter) - 2, 0), interval=0) == 1


def test_a_timeout_names_what_and_the_last_value():
    with pytest.raises(AssertionError, match=r"waiting for rows in t; last: \[\]"):
        until("rows in t", lambda: [], timeout=0.05, interval=0.01)


def test_ignored_exceptions_are_not_yet_others_end_the_wait():
    calls = itertools.count()

    def flaky():
        if next(calls) < 2:
            raise FileNotFoundError("state.json")
        return "ok"

    assert until("state.json", flaky, interval=0, ignore=(OSError,)) == "ok"
    with pytest.raises(FileNotFoundError):
        until("state.json", lambda: open("/nonexistent/state.json"), timeout=1)
    with pytest.raises(AssertionError, match="FileNotFoundError"):
        until("state.json", lambda: open("/nonexistent/x"), timeout=0.05, ignore=(OSError,))
