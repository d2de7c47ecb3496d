"""A stopped test server started again on its port and data directory
(tests/capture/test_capture_crash.py, tests/sync/test_sync_restart.py)."""

from __future__ import annotations

import subprocess
import psycopg
from tests.postgres import servers
from tests.wait import until, WaitTimeout  # noqa: E402


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

    def accepts():
        with psycopg.connect(srv.conninfo(), connect_timeout=2):
            return True

    try:
        until("the server to accept connections", accepts, ignore=(psycopg.OperationalError,))
    except WaitTimeout as e:
        raise AssertionError(f"{e}\n{srv.log_tail()}") from None
