"""A fork server for the Python process a local Spark session starts for each streaming query.

Spark forks a task's Python worker (and a data source's planner) from a daemon that has
pyspark imported, but it starts the process that runs a Python streaming source's offsets
from nothing, anew for each query: an interpreter, pyspark's imports and ours (psycopg alone
takes 0.1 s), about 0.2 s on a 2-core machine before ``initialOffset`` is even asked, a
seventh of an ``AvailableNow`` query over 200,000 changes.

A local session of ``pgcdc`` starts this server beside its JVM (:func:`start`, before the JVM
so that it inherits :data:`ENV`), with those modules imported once. The launcher Spark starts
(``pgcdc-spark-python``, :mod:`.pyworker`) hands the server its command, environment,
working directory, path and standard streams (``SCM_RIGHTS``) and the server forks a child
that runs the module as ``python -m`` would. The launcher then waits for the child's exit
status and passes it on; a signal it gets (Spark stops a process with SIGTERM) goes to the
child, and a launcher that dies takes its child with it. Whatever goes wrong before the fork
(no server, a module it does not serve), the launcher runs the module itself, as before.

The server lives as long as the process that started it: it looks every second, and its
children go with it. (Not Linux's parent-death signal: it follows the thread that started
the server, and sync starts its session in a thread of its own.)

A terminal's Ctrl-C (SIGINT to its whole foreground process group) is ignored by the server,
the launchers and the children, as by the processes Spark starts itself: pyspark starts its
JVM with SIGINT ignored, and they inherit that. The process that started the session decides
what Ctrl-C means (``pgcdc sync``: stop after the running batch); Spark stops its Python
processes with SIGTERM. Before, the server died of it with a traceback on the terminal and
took its children with it while the query was still stopping.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

ENV = "PGCDC_SPARK_FORKSERVER"  # the server's socket, for the launchers Spark starts
_PREFIXES = ("pyspark.sql.streaming.python_streaming_",)  # a source's, a sink's runner
PRELOAD = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "psycopg",
    "pgcdc.streaming.slot",
    "pgcdc.streaming.read",
)
_started: dict = {}  # this process's server: {"proc": Popen, "path": socket}


def stop_on_sigterm() -> None:
    """SIGTERM (Spark's way to stop a query's offsets process) ends the process as an
    exception does, so the runner's ``finally`` calls the reader's ``stop``. Spark sends it
    twice, a few milliseconds apart: the second is ignored, not raised inside ``stop``."""

    def stop(signum, _frame):
        signal.signal(signum, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


_DIR_PREFIX = "pgcdc-forkserver-"
_STALE_SECONDS = 60.0  # a server's directory younger than this may be one still starting


def sweep(root: str) -> list[str]:
    """Remove this user's server directories under ``root`` whose server is gone: one killed
    outright (SIGKILL, as of a whole process group) leaves its socket behind. The ones
    removed."""
    import shutil
    import time

    removed = []
    for name in os.listdir(root):
        directory = os.path.join(root, name)
        if not name.startswith(_DIR_PREFIX):
            continue
        try:
            st = os.stat(directory)
        except OSError:
            continue
        if st.st_uid != os.getuid() or time.time() - st.st_mtime < _STALE_SECONDS:
            continue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(os.path.join(directory, "s"))
            continue  # a server is there
        except (ConnectionRefusedError, FileNotFoundError):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        except OSError:
            continue
        finally:
            sock.close()
    return removed


def serves(module: str, prefixes=_PREFIXES) -> bool:
    """Whether a module is one the server runs (the others the launcher runs itself)."""
    return module.startswith(prefixes)


def start(preload=PRELOAD, prefixes=_PREFIXES) -> str | None:
    """Start this process's server (once) and set :data:`ENV` for the processes started after
    it (Spark's JVM and, through it, the launchers). The socket's path, or None when the
    server did not come up within 10 s (the launchers then run their modules themselves), or
    when :data:`ENV` is ``off``."""
    import subprocess
    import tempfile
    import time

    if os.environ.get(ENV) == "off":
        return None
    if _started and _started["proc"].poll() is None:
        return _started["path"]
    sweep(tempfile.gettempdir())
    directory = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # 0700: only this user
    path = os.path.join(directory, "s")
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, path, ",".join(prefixes), *preload],
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )
    deadline = time.monotonic() + 10
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            return None
        time.sleep(0.005)
    _started.update(proc=proc, path=path)
    os.environ[ENV] = path
    return path


# -- the launcher's side -------------------------------------------------------------------------


def _send(sock: socket.socket, doc: dict, fds=()) -> None:
    data = json.dumps(doc).encode()
    socket.send_fds(sock, [struct.pack("!I", len(data)) + data], list(fds))


def _recv(sock: socket.socket, max_fds: int = 0):
    """One message (and the descriptors that came with it); None at the end of the stream."""
    head, fds, _, _ = socket.recv_fds(sock, 4, max_fds)
    if len(head) < 4:
        for fd in fds:
            os.close(fd)
        return None, []
    (size,) = struct.unpack("!I", head)
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def run_forked(module: str, argv: list[str], path: list[str]) -> int | None:
    """Run ``module`` in a child of the server (:data:`ENV`): its exit code, or None when it
    could not be forked there (run it here then)."""
    where = os.environ.get(ENV)
    if not where or where == "off":
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        sock.connect(where)
        doc = {"module": module, "argv": argv, "path": path, "cwd": os.getcwd(),
               "env": dict(os.environ)}  # fmt: skip
        _send(sock, doc, (0, 1, 2))
        reply, _ = _recv(sock)
    except OSError:
        sock.close()
        return None
    if not reply or "pid" not in reply:
        sock.close()
        return None  # not served there: nothing ran
    child = reply["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's: not Spark's way to stop one
    sock.settimeout(None)
    try:
        status, _ = _recv(sock)  # interrupted by a signal, the call is retried (PEP 475)
    except OSError:
        status = None
    sock.close()
    if not status:  # the server went away (killed: its children live on)
        forward(signal.SIGKILL, None)
        return 1
    code = status["code"]
    return 128 - code if code < 0 else code  # a signal's death as a shell shows it


# -- the server's side ----------------------------------------------------------------------------


def _child(doc: dict, fds: list[int], close) -> None:
    """In the forked child: become the process the launcher would have been, and run."""
    import runpy

    code = 1
    try:
        for fd in close:  # the server's: other launchers must see it go when it goes
            os.close(fd)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the JVM's own Python processes
        stop_on_sigterm()
        signal.set_wakeup_fd(-1)
        os.environ.clear()
        os.environ.update(doc["env"])
        os.chdir(doc["cwd"])
        sys.path[:] = doc["path"]
        sys.argv = [doc["module"], *doc["argv"]]
        sys.modules.pop(doc["module"], None)  # preloaded: run afresh as __main__
        runpy.run_module(doc["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(path: str, prefixes: tuple[str, ...]) -> None:
    import selectors

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # there once it accepts
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # child pid: its launcher's connection
    try:
        while os.getppid() == parent:
            for key, _ in sel.select(timeout=1.0):
                if key.data == "wake":
                    os.read(wake_r, 512)
                elif key.data == "accept":
                    conn, _ = listener.accept()
                    conn.settimeout(5)
                    try:
                        doc, fds = _recv(conn, 3)
                    except OSError:
                        conn.close()
                        continue
                    if not doc or len(fds) != 3 or not serves(doc["module"], prefixes):
                        for fd in fds:
                            os.close(fd)
                        conn.close()  # the launcher runs it itself
                        continue
                    pid = os.fork()
                    if pid == 0:
                        sel.close()
                        ours = [listener, conn, *children.values()]
                        _child(doc, fds, [s.fileno() for s in ours] + [wake_r, wake_w])
                    for fd in fds:
                        os.close(fd)
                    try:
                        _send(conn, {"pid": pid})
                    except OSError:
                        _kill(pid)
                    conn.setblocking(False)
                    children[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
                else:  # a launcher's connection: readable only when it is gone
                    _kill(key.data)
                    sel.unregister(key.fileobj)
            _reap(children, sel)
    finally:
        for pid in children:
            _kill(pid)
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap(children: dict, sel) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.setblocking(True)
            _send(conn, {"code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass
        conn.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for its parent
    path, prefixes, *preload = sys.argv[1:]
    import importlib

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing here is imported by the child
            pass
    serve(path, tuple(p for p in prefixes.split(",") if p))


if __name__ == "__main__":
    main()
