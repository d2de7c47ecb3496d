"""Spec errors point into the spec: file, line and YAML path."""

from __future__ import annotations


def format_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


class SpecError(Exception):
    def __init__(self, file: str, line: int, path: tuple, message: str):
        self.file, self.line, self.path, self.message = file, line, tuple(path), message
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {format_path(self.path)}: {self.message}"
