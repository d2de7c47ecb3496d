"""The capture process of a sync: a child in a session of its own, holding the directory's
lock, stopped by SIGTERM or by the end of its stdin (its parent gone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading


PROG = "pgcdc sync"


def capture_child() -> int:
    """The capture process: ``python -c "...capture_child()" CONFIG_JSON LOG_FORMAT``. Stops
    (cleanly: what was received up to the last boundary is durable) on SIGTERM/SIGINT, and
    when its stdin ends: the sync that started it is gone, killed or not."""
    from ..capture.runner import Capture, CaptureConfig, Log

    config = CaptureConfig(**json.loads(sys.argv[1]))

    class CaptureLog(Log):
        def event(self, level, event, message="", **fields):
            if event != "progress":  # sync's line per apply cycle says where the capture is
                super().event(level, event, message, **fields)

        def progress(self, text):
            pass

    cap = Capture(config, CaptureLog(sys.argv[2], prog=f"{PROG} (capture)"))

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
    code = cap.run()
    if code == 0:
        cap.log.event("info", "capture_stopped", cap.summary())
    return code


class CaptureProcess:
    """The capture child: started, watched, stopped."""

    def __init__(self, config: dict, log_format: str, lock_fd: int):
        self.config, self.log_format, self.lock_fd = config, log_format, lock_fd
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        code = "import sys; from pgcdc.sync.child import capture_child; sys.exit(capture_child())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(self.config), self.log_format],
            stdin=subprocess.PIPE,  # its end is how the child knows this process is gone
            start_new_session=True,  # a terminal's Ctrl-C reaches sync, which stops it
            pass_fds=(self.lock_fd,),  # DIR stays locked while the child lives
        )

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
