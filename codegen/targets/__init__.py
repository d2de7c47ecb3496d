"""One module per target. Each has `outputs(spec)` yielding (path, template, context) triples."""

from __future__ import annotations

import importlib

# Render order does not matter; each target owns its own output paths.
TARGETS = ("python", "docs", "kaitai", "spark", "jvm")


def all_targets(names: tuple[str, ...] | None = None):
    return [importlib.import_module(f"{__name__}.{name}").outputs for name in names or TARGETS]
