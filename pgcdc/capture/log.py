"""The log of capture and sync: text with a progress line on a TTY, JSON lines otherwise.

A module of its own, importing nothing heavy: ``pgcdc sync`` makes its log before it starts
its capture process, and that start should not wait for psycopg's import.
"""

from __future__ import annotations

import json
import sys
import time


class Log:
    """Text with a progress line on a TTY, JSON lines otherwise (both on stderr)."""

    def __init__(
        self, fmt: str = "auto", stream=None, prog: str = "pgcdc capture", text_fields=True
    ):
        self.prog = prog
        self.text_fields = text_fields  # text lines end with the event's fields
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.json = fmt == "json" or (fmt == "auto" and not self.tty)
        self._progress_shown = False

    def event(self, level: str, event: str, message: str = "", **fields) -> None:
        if self.json:
            doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": level}
            doc.update(event=event, message=message, **fields)
            line = json.dumps(doc)
        else:
            extra = " ".join(f"{k}={v}" for k, v in fields.items()) if self.text_fields else ""
            line = f"{self.prog}: {level}: {message}" + (f" ({extra})" if extra else "")
        if self._progress_shown:
            self.stream.write("\r\x1b[K")
            self._progress_shown = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def progress(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._progress_shown = True

    def end_progress(self) -> None:
        if self._progress_shown:
            self.stream.write("\n")
            self._progress_shown = False
