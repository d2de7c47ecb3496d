"""Shared pytest set-up: the coverage table of the real-server tests, and the codec
implementation switch (the C accelerator and pure Python must behave the same)."""

import os

import pytest

import pgoutput_codec as pgc

from hypothesis import settings

from tests.tiers import FAST_MAX_EXAMPLES, SLOW_FIXTURES, fast_tier

pytest_plugins = (
    "tests.postgres.plugin",
    "tests.fix_pg",
    "tests.fix_spark",
    "tests.support.catalog",
)


def pytest_collection_modifyitems(config, items):
    # A test is fast when its module says so (pytestmark) and it is not marked slow itself;
    # every other test is slow. `make test-fast` selects -m "fast and not slow" (tests/tiers.py).
    for item in items:
        fast = item.get_closest_marker("fast") and not item.get_closest_marker("slow")
        if not fast:
            item.add_marker(pytest.mark.slow)
            continue
        needs = SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if needs:
            raise pytest.UsageError(
                f"{item.nodeid} is marked fast but uses {sorted(needs)} (a server or Spark): "
                "mark it slow"
            )
    if fast_tier():
        for item in items:
            _fewer_examples(getattr(item, "obj", None))


def _fewer_examples(test, limit: int = FAST_MAX_EXAMPLES) -> None:
    """The fast tier runs each property test on a few examples, and keeps no example database;
    `make test` runs all of them. (A test's own @settings would override a profile, so the
    cap goes on the test.)"""
    inner = getattr(test, "hypothesis", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if inner is None or current is None:
        return
    limit = min(current.max_examples, limit)
    test._hypothesis_internal_use_settings = settings(current, max_examples=limit, database=None)


IMPLEMENTATIONS = ("c", "python")


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def codec_impl(request):
    """Run a module's tests once through the C accelerator and once in pure Python."""
    if request.param == "c" and pgc._decoder.DISPATCH.speedups is None:
        if os.environ.get("PGOUTPUT_CODEC_PURE"):
            pytest.skip("PGOUTPUT_CODEC_PURE is set: the accelerator is not loaded")
        pytest.fail("the C accelerator is not built (pip install -e . or make generate)")
    pgc.use_speedups(request.param == "c")
    yield request.param
    pgc.use_speedups(True)
