"""Spec errors point into the spec: file, line, column and YAML path, with a hint."""

from __future__ import annotations

from pgcdc.runtime.codec_errors import format_path

DEFAULT_HINT = (
    "the spec's keys are described in codegen/spec.schema.json and at the top of spec/*.yaml"
)


class SpecError(Exception):
    """Something in a spec (or its sample session) that the generator refuses.

    Printed as `file:line:column: path: message`, then a hint on how to fix it; the codegen
    command exits 2 with it, never with a traceback."""

    def __init__(
        self,
        file: str,
        line: int,
        path: tuple,
        message: str,
        *,
        column: int = 1,
        hint: str | None = None,
    ):
        self.file, self.line, self.path, self.message = file, line, tuple(path), message
        self.column = column
        self.hint = hint or DEFAULT_HINT
        super().__init__(str(self))

    def __str__(self) -> str:
        return (
            f"{self.file}:{self.line}:{self.column}: {format_path(self.path, root='<root>')}: "
            f"{self.message}\n  hint: {self.hint}"
        )
