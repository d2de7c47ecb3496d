"""Helpers shared by the tests (from capture/test_capture_crash.py)."""

from __future__ import annotations

import subprocess
import time
import psycopg
from tests.postgres import servers


def _relaunch(srv) -> None:
    """Start the stopped server again on the same data directory and port."""
    args = [str(srv.bindir / "postgres"), "-D", str(srv.datadir), "-p", str(srv.port),
            "-k", str(srv.tmpdir)]  # fmt: skip
    for k, v in servers.server_settings(srv.major).items():
        args += ["-c", f"{k}={v}"]
    with open(srv.logfile, "ab") as log:
        srv.proc = subprocess.Popen(servers._as_server_user(args), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=srv.tmpdir,
                                    start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(srv.conninfo(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, srv.log_tail()
            time.sleep(0.1)
