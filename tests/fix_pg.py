"""pytest plugin (tests/conftest.py registers it): PostgreSQL servers shared by the tests.

* ``pg`` (session): ``pg.server(key)`` is the server of major ``key`` ("pg15" ... "pg18"),
  started on first use in this test process (each xdist worker has its own) and stopped at
  the end; ``with pg.database(key) as db`` gives a block (a test, a module fixture) a
  database of its own on it (``CREATE DATABASE ... TEMPLATE template0``) with the server's
  interface (``conninfo``, ``connect``, ``connect_replication``, ``major``, ...), dropped
  after the block, its replication slots (and the walsenders holding them) first;
* ``fresh_db(key)`` (per test): ``pg.database(key)`` for the whole test.

A test that needs a server of its own (it restarts or kills it, changes its configuration,
watches its WAL stay quiet, or wants a server not in the session set) keeps
``servers.running_server`` and says why.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass

import pytest

from tests.postgres import servers

_names = itertools.count()


@dataclass
class Database:
    """One database on a shared server; otherwise the server's interface."""

    server: servers.PostgresServer
    dbname: str

    def __getattr__(self, name):
        return getattr(self.server, name)

    def conninfo(self, **extra: str) -> str:
        return self.server.conninfo(**{"dbname": self.dbname, **extra})

    def connect(self, **kwargs):
        import psycopg

        return psycopg.connect(self.conninfo(), autocommit=True, **kwargs)

    def connect_replication(self):
        import psycopg

        return psycopg.connect(self.conninfo(replication="database"), autocommit=True)


class SharedServers:
    """The servers of a test process, one per major, each started on first use."""

    def __init__(self, stack: contextlib.ExitStack):
        self._stack = stack
        self._started: dict[str, servers.PostgresServer] = {}

    def server(self, key: str = "pg18") -> servers.PostgresServer:
        if key not in self._started:
            self._started[key] = self._stack.enter_context(servers.running_server(key))
        return self._started[key]

    @contextlib.contextmanager
    def database(self, key: str = "pg18"):
        """A new database on server ``key`` for the block (its slots and it dropped after)."""
        server = self.server(key)
        dbname = f"t{os.getpid()}_{next(_names)}"
        with server.connect() as conn:
            conn.execute(f'CREATE DATABASE "{dbname}" TEMPLATE template0')
        try:
            yield Database(server, dbname)
        finally:
            if server.proc is not None and server.proc.poll() is None:
                drop_database(server, dbname)


@pytest.fixture(scope="session")
def pg():
    """The session's servers: ``pg.database("pg18")`` (a context manager) gives a database of
    its own on the PostgreSQL 18 server, started on first use."""
    with contextlib.ExitStack() as stack:
        yield SharedServers(stack)


def drop_database(server: servers.PostgresServer, dbname: str) -> None:
    """Drop ``dbname`` and its replication slots (ending the walsenders that hold them), and
    what the test made for the whole server: replication origins and roles."""
    with server.connect() as conn:
        for _ in range(100):
            slots = conn.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                (dbname,),
            ).fetchall()
            if not slots:
                break
            for name, pid in slots:
                if pid is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    continue
                with contextlib.suppress(Exception):
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
            time.sleep(0.05)
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        # what a test makes outside its database: replication origins and roles
        for (origin,) in conn.execute("SELECT roname FROM pg_replication_origin").fetchall():
            conn.execute("SELECT pg_replication_origin_drop(%s)", (origin,))
        for (role,) in conn.execute(
            "SELECT rolname FROM pg_roles WHERE oid >= 16384 AND rolname <> 'postgres'"
        ).fetchall():
            with contextlib.suppress(Exception):  # one that owns things elsewhere stays
                conn.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def fresh_db(pg):
    """``fresh_db(key="pg18")``: a new database on the session server ``key``, dropped after
    the test."""
    with contextlib.ExitStack() as stack:
        yield lambda key="pg18": stack.enter_context(pg.database(key))
