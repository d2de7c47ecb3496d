"""The capture process of a sync: a child in a session of its own, holding the directory's
lock, stopped by SIGTERM or by the end of its stdin (its parent gone).

It is started before sync knows its configuration (sync's own imports and set-up run while it
imports, 0.15 s each) and reads it as the first line of its stdin; SIGTERM or the end of stdin
before that line means it is not needed (sync stopped, or its set-up failed): it exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.status import SYNC_LOG

PROG = "pgcdc sync"


def capture_child() -> int:
    """The capture process: ``python -c "...capture_child()" LOG_FORMAT``, its configuration
    (JSON) the first line of its stdin. Stops (cleanly: what was received up to the last
    boundary is durable) on SIGTERM/SIGINT, and when its stdin ends: the sync that started it
    is gone, killed or not."""

    def not_started(*_):  # stopped before it began: nothing to make durable
        raise SystemExit(0)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, not_started)
    line = _first_line(0)
    if line is None:
        return 0  # never given its configuration: not needed
    config = CaptureConfig(**json.loads(line))

    class CaptureLog(Log):
        def event(self, level, event, message="", **fields):
            if event != "progress":  # sync's line per apply cycle says where the capture is
                super().event(level, event, message, **fields)

        def progress(self, text):
            pass

    cap = Capture(config, CaptureLog(sys.argv[1], prog=f"{PROG} (capture)"))

    def stop(*_):
        cap.stop = True

    def watch_parent():
        try:  # os.read: no buffered reader's lock left held by a daemon thread at exit
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        cap.stop = True

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)
    threading.Thread(target=watch_parent, name="pgcdc-sync-parent", daemon=True).start()
    try:
        code = cap.run()
    except Exception as e:  # one line; its traceback in sync's log file
        return _failed(config, cap.log, e)
    if code == 0:
        cap.log.event("info", "capture_stopped", cap.summary())
    return code


def _failed(config, log, error: Exception) -> int:
    """An error the capture has no answer for: its traceback into ``DIR/_sync.log``, one
    line on stderr; exit 1 (sync starts the capture again)."""
    from pathlib import Path

    from pgcdc.sync.logfile import append, format_error, reason  # lazy: not the child's start

    path = Path(config.out).parent / SYNC_LOG
    append(path, f"capture: unexpected error:\n{format_error(error)}\n".encode())
    log.event("error", "unexpected", f"the capture failed: {reason(error)}; the full error "
              f"is in {path}")  # fmt: skip
    return 1


def _first_line(fd: int) -> str | None:
    """The first line read from ``fd`` (without its newline), or None at its end before one."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data[:-1].decode()


class CaptureProcess:
    """The capture child: spawned ahead, given its configuration, watched, stopped."""

    def __init__(self, log_format: str, lock_fd: int, stderr=None):
        """``stderr``: the child's (default: this process's descriptor 2 at its start; sync
        gives its log's, which Spark's start does not move)."""
        self.log_format, self.lock_fd, self.stderr = log_format, lock_fd, stderr
        self.config: dict | None = None
        self.proc: subprocess.Popen | None = None
        self.waiting = False  # spawned, its configuration not sent yet

    def spawn(self) -> None:
        """Start the child ahead of its configuration: it imports meanwhile."""
        code = "import sys; from pgcdc.sync.child import capture_child; sys.exit(capture_child())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, self.log_format],
            stdin=subprocess.PIPE,  # its end is how the child knows this process is gone
            stderr=self.stderr,
            start_new_session=True,  # a terminal's Ctrl-C reaches sync, which stops it
            pass_fds=(self.lock_fd,),  # DIR stays locked while the child lives
        )
        self.waiting = True

    def start(self, config: dict | None = None) -> None:
        """Run the capture with ``config`` (default: the last one, for a restart), in the
        child spawned ahead when it is still waiting, else in a new one."""
        if config is not None:
            self.config = config
        if not self.waiting or self.proc.poll() is not None:
            self.spawn()
        self.waiting = False
        try:
            self.proc.stdin.write(json.dumps(self.config).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died before: poll() says so, as for any end of the capture

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """A clean stop (SIGTERM); before its configuration, the end of its stdin, which it
        may not have reached yet. Called from sync's signal handler too: ``start`` has
        stopped waiting before it writes, so no write is under way when stdin is closed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.waiting:
            self.waiting = False
            self.proc.stdin.close()
        else:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
