"""Shared pytest set-up: the coverage table of the real-server tests, and the codec
implementation switch (the C accelerator and pure Python must behave the same)."""

import os

import pytest

import pgoutput_codec as pgc

from hypothesis import settings

from tests.tiers import FAST_EXCLUDED_TESTS, FAST_MAX_EXAMPLES, FAST_MODULES, fast_tier

pytest_plugins = (
    "tests.postgres.plugin",
    "tests.fix_pg",
    "tests.fix_spark",
    "tests.support.catalog",
)


def pytest_collection_modifyitems(config, items):
    # `make test-fast` selects these with -m fast (see tests/tiers.py).
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else None
        if module in FAST_MODULES and item.originalname not in FAST_EXCLUDED_TESTS:
            item.add_marker(pytest.mark.fast)
    if fast_tier():
        for item in items:
            _fewer_examples(getattr(item, "obj", None))


def _fewer_examples(test, limit: int = FAST_MAX_EXAMPLES) -> None:
    """The fast tier runs each property test on a few examples; `make test` on all of them.
    (A test's own @settings would override a profile, so the cap goes on the test.)"""
    inner = getattr(test, "hypothesis", None)
    current = getattr(test, "_hypothesis_internal_use_settings", None)
    if inner is None or current is None or current.max_examples <= limit:
        return
    test._hypothesis_internal_use_settings = settings(current, max_examples=limit)


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
