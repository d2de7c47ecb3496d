"""``pgcdc sync``'s log: its lines on stderr (:class:`pgcdc.capture.log.Log`: text on a
terminal, JSON lines otherwise), and ``DIR/_sync.log`` (:data:`pgcdc.status.SYNC_LOG`), a
text file that gets its warnings and errors too, with what stderr never does: the full
traceback of an error, and the JVM's own log (Spark's errors, with their Java and Python
stack traces). An error is one line on stderr, naming the table where it is known and that
file; no traceback reaches stderr.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from pathlib import Path

from pgcdc.apply.delta import redact
from pgcdc.apply.state import table_of
from pgcdc.capture.log import Log
from pgcdc.status import SYNC_LOG

LOG_LIMIT = 16 << 20  # bytes: past this, DIR/_sync.log becomes DIR/_sync.log.1 (one kept)
REASON_CHARS = 400  # a reason is cut to this many characters (the file has it all)


class SyncLog(Log):
    """:class:`Log` on a copy of stderr's descriptor, made before Spark starts (the JVM's
    start points descriptor 2 at a pipe a while: :func:`pgcdc.runtime.spark.quiet.quiet_jvm_start`,
    whose lines go to the file here), and ``DIR/_sync.log``."""

    def __init__(self, fmt: str, out, prog: str):
        try:
            stream = os.fdopen(os.dup(2), "w", buffering=1)
        except OSError:  # no stderr to copy: the interpreter's
            stream = None
        super().__init__(fmt, stream=stream, prog=prog, text_fields=False)
        self.path = Path(out) / SYNC_LOG
        self._lock = threading.Lock()

    def event(self, level: str, event: str, message: str = "", **fields) -> None:
        super().event(level, event, message, **fields)
        if level in ("warning", "error"):
            self.detail(f"{level} {event}: {message}")

    def detail(self, text: str) -> bool:
        """Append ``text`` (a line, or a traceback) to the file, stamped; False when it
        cannot be written."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self.write(f"{stamp} {text.rstrip()}\n".encode())

    def write(self, data: bytes) -> bool:
        """Append ``data`` to the file as it is (the JVM's lines come here)."""
        with self._lock:
            try:
                if self.path.stat().st_size > LOG_LIMIT:
                    os.replace(self.path, self.path.with_name(SYNC_LOG + ".1"))
            except OSError:
                pass  # (none yet)
            return append(self.path, data)

    def where(self) -> str:
        return f"the full error is in {self.path}"

    def unexpected(self, error: BaseException, what: str = "") -> None:
        """An error sync has no answer for: its traceback into the file, one line here
        (``what`` it was doing, the table where known, the error's own line, the file)."""
        table = table_of(error)
        doing = f" {what}" if what else ""
        if table is not None:
            doing += f" (table {table})"
        self.detail(f"unexpected error{doing}:\n{format_error(error)}")
        self.event("error", "unexpected", f"unexpected error{doing}: {reason(error)}; "
                   f"{self.where()}", table=table)  # fmt: skip

    def catch_the_rest(self) -> None:
        """Errors no caller sees: a thread's (one line, its traceback in the file), and the
        log records of the libraries (py4j's, at the JVM's end) go to the file rather than
        stderr."""
        threading.excepthook = lambda a: self.unexpected(a.exc_value, f"in {a.thread.name}")
        logging.getLogger().addHandler(_ToFile(self))

    def jvm_sink(self, data: bytes) -> None:
        """Where the JVM's stderr goes (Spark's log)."""
        self.write(data)


class _ToFile(logging.Handler):
    """Log records (warnings and up, with their tracebacks) into the file; the snapshot's
    notes are the log's own events already (pgcdc.sync.pipeline)."""

    def __init__(self, log: SyncLog):
        super().__init__(logging.WARNING)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("pgcdc.snapshot.server"):
            return
        try:
            self.log.detail(f"{record.levelname.lower()} {record.name}: {self.format(record)}")
        except Exception:  # noqa: BLE001 - logging must not raise
            pass


def say_failure(log, error: BaseException) -> None:
    """A cycle's error in one line (its first, redacted) on ``log``, the whole of it in the
    log file (a :class:`SyncLog`'s ``detail``)."""
    text = redact(str(error)).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    detail = getattr(log, "detail", None)
    if detail is not None:
        detail(f"apply failed:\n{format_error(error)}")
        if line != text:
            line += f"; {log.where()}"
    log.event("error", "apply", line)


def append(path: Path, data: bytes) -> bool:
    """``data`` appended to ``path`` (created, with its directory) in one write; False when
    it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def format_error(error: BaseException) -> str:
    """The whole of an error: its traceback, and what a Spark or py4j error holds besides
    (the Python worker's traceback, the JVM's stack trace)."""
    return "".join(traceback.format_exception(error)).rstrip()


_PY_TRACE = "Traceback (most recent call last)"


def reason(error: BaseException) -> str:
    """An error in one line, for a person: the line that says what went wrong (a Spark
    task's Python error: its traceback's last line; the JVM's: its exception's first),
    secrets redacted, at most REASON_CHARS."""
    text = str(error)
    java = getattr(error, "java_exception", None)
    if java is not None:  # py4j's Py4JJavaError: its str() is the whole stack trace
        try:
            text = str(java.toString())
        except Exception:  # noqa: BLE001 - the JVM may be gone
            pass
    if _PY_TRACE in text:  # a Python worker's traceback inside Spark's message
        lines = [x for x in text.split(_PY_TRACE, 1)[1].splitlines() if x.strip()]
        tail = [x for x in lines if not x.startswith((" ", "\t"))]
        text = (tail or lines or [type(error).__name__])[-1]
    else:
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        text = lines[0] if lines else ""
    text = redact(text.strip())
    if not text:
        text = type(error).__name__
    elif type(error).__name__ not in text and not re.match(r"[\w.]+(Error|Exception)\b", text):
        text = f"{type(error).__name__}: {text}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def column_of(error: BaseException) -> str | None:
    """The column an error names (a value that does not load, a TOAST column apply cannot
    fill), or None."""
    text = str(error)
    m = re.search(r"column '([^']+)'", text) or re.search(r"column\(s\) \['([^']+)'", text)
    return m.group(1) if m else None
