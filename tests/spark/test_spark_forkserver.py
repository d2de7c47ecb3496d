"""The fork server of a local session (pgcdc.runtime.spark.forkserver): a module the launcher
hands it runs in a child of the server, as ``python -m`` would have run it in the launcher
(arguments, working directory, environment, streams, exit code), signals reach it, and
whatever the server cannot do the launcher does itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgcdc.runtime.spark.forkserver import ENV
from pgcdc.runtime.spark.pyworker import SCRIPT, worker_python
from tests.wait import until  # noqa: E402

PROBE = """\
import os, sys, time
print("out", sys.argv[1:], os.getcwd(), os.environ.get("PROBE_VALUE"), os.getppid(), flush=True)
print("err", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def launcher():
    script = worker_python()
    if not script.endswith(SCRIPT):
        pytest.skip(f"{SCRIPT} is not installed beside {sys.executable}")
    return script


@pytest.fixture
def server(tmp_path):
    """A server that serves modules named probe_* (and has probe_mod imported), started by
    this process: (its process, the environment a launcher needs)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_mod.py").write_text(PROBE)
    (tmp_path / "lib" / "other_mod.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "lib"), PROBE_VALUE="given")
    sock = str(tmp_path / "s")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc.runtime.spark.forkserver", sock, "probe_", "probe_mod"],
        env=env,
    )

    def started():
        assert proc.poll() is None, "the server did not start"
        return os.path.exists(sock)

    until("the fork server's socket", started, 30, 0.01)
    yield proc, dict(env, **{ENV: sock})
    proc.kill()
    proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for this purpose
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1]
    except (FileNotFoundError, ProcessLookupError):  # reaped between the two looks
        return False
    return not state.startswith("Z")


def test_a_module_runs_in_a_child_of_the_server_as_the_launcher_would_run_it(
    launcher, server, tmp_path
):
    proc, env = server
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run([launcher, "-m", "probe_mod", "3", "x"], env=env, cwd=work,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 3, run.stderr
    out = run.stdout.split()
    # its arguments, the launcher's working directory and environment, the server's child
    assert out == ["out", "['3',", "'x']", str(work), "given", str(proc.pid)], run.stdout
    assert run.stderr.strip() == "err"


def test_what_the_server_does_not_serve_runs_in_the_launcher(launcher, server, tmp_path):
    proc, env = server
    run = subprocess.run([launcher, "-m", "other_mod", "0"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] != str(proc.pid)  # not forked there
    # no server at the path the variable names: the same
    gone = dict(env, **{ENV: str(tmp_path / "nothing")})
    run = subprocess.run([launcher, "-m", "probe_mod", "4"], env=gone, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 4 and run.stdout.startswith("out"), run.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_child_ends_with_its_launcher(launcher, server, tmp_path, signum):
    """Spark stops a process with SIGTERM: the child gets it. A launcher killed outright
    leaves its connection to the server, which then kills the child."""
    proc, env = server
    pid_file = tmp_path / "pid"
    run = subprocess.Popen([launcher, "-m", "probe_mod", "sleep", str(pid_file)], env=env,
                           cwd=tmp_path, stdout=subprocess.PIPE, text=True)  # fmt: skip

    def written():
        assert run.poll() is None
        return pid_file.exists() and pid_file.read_text()

    until("the child's pid file", written, 30, 0.01)
    child = int(pid_file.read_text())
    assert child != run.pid and _alive(child)
    run.send_signal(signum)
    code = run.wait(30)
    assert code == (128 + signal.SIGTERM if signum == signal.SIGTERM else -signal.SIGKILL)
    until("the child to end with its launcher", lambda: not _alive(child), 10, 0.02)
    assert proc.poll() is None  # the server goes on


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    starter = (
        "import sys, time\n"
        "from pgcdc.runtime.spark import forkserver\n"
        "path = forkserver.start(preload=())\n"
        "print(forkserver._started['proc'].pid, path, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    pid, path = proc.stdout.readline().split()
    assert _alive(int(pid)) and os.path.exists(path)
    proc.kill()
    proc.wait()
    until("the server to end with its starter", lambda: not _alive(int(pid)), 10, 0.02)


def test_the_directory_of_a_server_killed_outright_is_swept(tmp_path):
    """A server killed with its process group (SIGKILL) leaves its socket's directory: the
    next start removes it, and only it (not a live server's, nor one younger than a minute,
    which may be starting, nor anything else)."""
    import socket

    from pgcdc.runtime.spark import forkserver

    old = time.time() - 3600
    dead = tmp_path / "pgcdc-forkserver-dead"
    dead.mkdir()
    gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    gone.bind(str(dead / "s"))  # bound, never listened on: as a killed server leaves it
    gone.close()
    young = tmp_path / "pgcdc-forkserver-young"
    young.mkdir()
    other = tmp_path / "something-else"
    other.mkdir()
    live = tmp_path / "pgcdc-forkserver-live"
    live.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc.runtime.spark.forkserver", str(live / "s"), "probe_"]
    )
    try:

        def started():
            assert proc.poll() is None
            return (live / "s").exists()

        until("the live server's socket", started, 30, 0.01)
        for d in (dead, other, live):
            os.utime(d, (old, old))
        assert forkserver.sweep(str(tmp_path)) == [str(dead)]
        assert young.exists() and other.exists() and (live / "s").exists()
        assert proc.poll() is None  # the live server took the probe's connection in its stride
    finally:
        proc.kill()
        proc.wait()
