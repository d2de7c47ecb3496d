"""Test tiers. ``make test`` runs everything and fails when a tool is missing; ``make
test-fast`` (PGCDC_TEST_TIER=fast) runs the modules below, which need no Java, PostgreSQL
server or npm, and skips what in them would call one.

Left out on purpose: what compiles C or renders specs many times (test_hostile_specs,
test_toy_spec, test_speedups) and test_tiers itself. A module belongs to the fast tier when it
is listed here; ``tests/package/test_tiers.py`` checks that
every listed module exists.
"""

from __future__ import annotations

import os

FAST_MODULES = frozenset(
    {
        "test_architecture",
        "test_changes_directory",
        "test_generator",
        "test_hostile_codec",
        "test_moved_modules",
        "test_postgres_replay",
        "test_replication_codec",
        "test_roundtrip",
        "test_spec_order",
        "test_spec_validation",
        "test_tablekey",
        "test_transactions",
        "test_transactions_property",
        "test_values",
        "test_vectors",
    }
)

# Tests of fast modules left to `make test`: each renders every spec again in a subprocess.
FAST_EXCLUDED_TESTS = frozenset(
    {
        "test_output_does_not_depend_on_hash_seed",
        "test_protocol_v5_is_a_spec_edit_only",
        "test_check_reports_drift_and_the_fix",
    }
)

# Property tests run on this many examples at most in the fast tier.
FAST_MAX_EXAMPLES = 10


def fast_tier() -> bool:
    return os.environ.get("PGCDC_TEST_TIER") == "fast"


if __name__ == "__main__":
    # `make test-fast` collects only these files (importing the others costs seconds).
    from pathlib import Path

    tests = Path(__file__).parent
    print(
        " ".join(
            str(next(tests.rglob(f"{name}.py")).relative_to(tests.parent))
            for name in sorted(FAST_MODULES)
        )
    )
