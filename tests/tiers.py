"""Test tiers. ``make test`` runs everything and fails when a tool is missing; ``make
test-fast`` (PGCDC_TEST_TIER=fast, ``-m "fast and not slow"``) runs the tests marked ``fast``:
they need no Java, PostgreSQL server or npm. A module joins the fast tier with
``pytestmark = pytest.mark.fast``; a test in it that is slow anyway (it renders every spec
again in a subprocess, say) carries ``@pytest.mark.slow`` too. Every other test is ``slow``
(tests/conftest.py marks it so). tests/package/test_tiers.py checks that a fast module keeps
to that.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TESTS = Path(__file__).parent

# Property tests run on this many examples at most in the fast tier (`make test`: all).
FAST_MAX_EXAMPLES = 5

#: what marks a module fast: a module-level ``pytestmark`` that holds ``pytest.mark.fast``
FAST_MARK = re.compile(r"^pytestmark = .*\bpytest\.mark\.fast\b", re.M)

#: the fixtures that start a PostgreSQL server or a JVM: never in a fast test
SLOW_FIXTURES = frozenset({"pg", "fresh_db", "spark", "runs", "captured"})


def fast_tier() -> bool:
    return os.environ.get("PGCDC_TEST_TIER") == "fast"


def fast_files() -> list[Path]:
    """The test modules marked fast."""
    return sorted(p for p in TESTS.rglob("test_*.py") if FAST_MARK.search(p.read_text()))


if __name__ == "__main__":
    # `make test-fast` collects only these files (importing the others costs seconds).
    print(" ".join(str(p.relative_to(TESTS.parent)) for p in fast_files()))
