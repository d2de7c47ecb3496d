"""Render every target from the model: one strict Jinja environment, one template per output."""

from __future__ import annotations

from pathlib import Path

from .model import Spec
from .targets import all_targets
from .templating import GENERATOR, TEMPLATES, environment, header, ruff_format, tidy_c

__all__ = ["GENERATOR", "TEMPLATES", "environment", "header", "render_all", "ruff_format", "tidy_c"]


def render_all(spec: Spec, targets: tuple[str, ...] | None = None) -> dict[str, str | bytes]:
    """All generated files as {path relative to the output dir: text or bytes}.

    A target yields (path, template, context) for text, or (path, None, build) for a binary
    output, where build(files) gets the formatted text outputs (e.g. to run the fresh codec).
    """
    env = environment()
    files: dict[str, str | bytes] = {}
    builders = []
    for target in all_targets(targets):
        for rel, template, context in target(spec):
            if template is None:
                builders.append((rel, context))
                continue
            text = env.get_template(template).render(spec=spec, **context)
            if rel.endswith((".c", ".java")):
                text = tidy_c(text)
            files[rel] = header(spec, Path(rel).suffix) + text
    files = ruff_format(files)
    for rel, build in builders:
        files[rel] = build(dict(files))
    return files
