"""A small walsender (replication protocol) client over psycopg 3's low-level ``pq`` layer.

psycopg 3 has no replication API, but its ``pq.PGconn`` gives what the protocol needs: a
connection with ``replication=database``, simple-protocol commands (``IDENTIFY_SYSTEM``,
``CREATE_REPLICATION_SLOT``, ``START_REPLICATION``) and raw CopyData both ways. This module
only moves bytes; ``replication_codec`` gives them meaning.

Errors become :class:`CaptureError` with one line that says what failed and how to fix it.
Connection strings are masked (:func:`mask_dsn`) wherever they are shown; everything else libpq
reads by itself (PGPASSWORD, .pgpass, service files, sslmode, ...) passes through untouched.
"""

from __future__ import annotations

import select
import time
from dataclasses import dataclass

from psycopg import conninfo as _conninfo
from psycopg import pq

from pgcdc.errors import SetupError
from pgcdc.lsn import format_lsn, parse_lsn

# Session settings that text-mode values depend on: the walsender formats them with its own
# session's datestyle etc., so a user's or server's defaults must not leak into captures.
PINNED_GUCS = {
    "datestyle": "ISO",
    "intervalstyle": "postgres",
    "extra_float_digits": "3",
    "timezone": "UTC",
}

# SQLSTATE -> how to fix it (the message itself comes from the server)
_HINTS = {
    "42704": None,  # undefined object: slot or publication; the hint depends on which
    "55000": None,  # object not in prerequisite state: the hint depends on what (_hint_for)
    "42501": "grant it: ALTER ROLE <role> REPLICATION (or use a superuser)",
    "55006": "stop the other consumer of this slot (see pg_stat_replication) or use another slot",
    "42710": "the slot exists already: drop --create-slot to reuse it, or pick another --slot",
    "53400": "raise max_replication_slots / max_wal_senders on the server, or drop unused slots",
    "28000": "check pg_hba.conf on the server: it must allow this role and database",
    "28P01": "the password is wrong for this role: check PGPASSWORD, ~/.pgpass or the DSN's "
    "password",
}
# The server or the network went away; worth reconnecting (with backoff).
TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "08000", "08003", "08006", "08001"})


class CaptureError(SetupError):
    """A failure with one clear line of text: what happened, where, and how to fix it."""

    def __init__(self, message: str, *, sqlstate: str | None = None, transient: bool = False):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.transient = transient


def mask_dsn(dsn: str) -> str:
    """The connection string with any password replaced by ``***`` (for logs and errors)."""
    try:
        params = _conninfo.conninfo_to_dict(dsn)
    except Exception:  # unparsable: show nothing of it rather than risk a secret
        return "<unparsable connection string>"
    if "password" in params:
        params["password"] = "***"
    return _conninfo.make_conninfo(**params) if params else "(libpq defaults)"


def _hint_for(sqlstate: str | None, text: str) -> str | None:
    if sqlstate == "42704":
        if "publication" in text:
            return (
                "create it on the server: CREATE PUBLICATION <name> FOR ...; or fix --publication"
            )
        if "slot" in text:
            return "create it with --create-slot, or check --slot"
        return None
    if sqlstate == "55000":  # wal_level, but also an invalidated slot (checked by its caller)
        if "wal_level" in text:
            return "set wal_level = logical in postgresql.conf (or ALTER SYSTEM) and restart the server"
        return None
    if sqlstate == "42501" and "replication" not in text and "WAL sender" not in text:
        return "grant the needed privileges to the capture role"
    return _HINTS.get(sqlstate or "")


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # libpq prefixes "ERROR:  " / "FATAL:  "; keep DETAIL/HINT lines, joined
    return " ".join(ln.split(":  ", 1)[1] if ln[:6] in ("ERROR:", "FATAL:") else ln for ln in lines)


def _result_error(res, what: str) -> CaptureError:
    sqlstate = res.error_field(pq.DiagnosticField.SQLSTATE)
    state = sqlstate.decode() if sqlstate else None
    text = _one_line(res.error_message.decode("utf-8", "replace")) or "no error message"
    hint = _hint_for(state, text)
    msg = f"{what}: {text}" + (f" (fix: {hint})" if hint else "")
    return CaptureError(msg, sqlstate=state, transient=state in TRANSIENT_SQLSTATES)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class SystemInfo:
    """IDENTIFY_SYSTEM's answer."""

    system_id: str
    timeline: int
    xlogpos: int
    dbname: str | None


@dataclass(frozen=True)
class SlotInfo:
    """CREATE_REPLICATION_SLOT's answer. ``snapshot_name`` is set with ``snapshot="export"``
    and stays valid until the next command on this connection (or its end)."""

    slot_name: str
    consistent_point: int
    snapshot_name: str | None
    output_plugin: str | None


class WalsenderConnection:
    """One ``replication=database`` connection. Use :meth:`connect`; close with :meth:`close`
    (or ``with``)."""

    def __init__(self, pgconn: pq.PGconn, dsn: str):
        self.pgconn = pgconn
        self.dsn_masked = mask_dsn(dsn)
        self.server_version = pgconn.server_version // 10000  # major
        self.copying = False

    @classmethod
    def connect(cls, dsn: str = "", *, application_name: str = "pgcdc") -> WalsenderConnection:
        params = _conninfo.conninfo_to_dict(dsn) if dsn else {}
        params["replication"] = "database"
        params.setdefault("application_name", application_name)
        pgconn = pq.PGconn.connect(_conninfo.make_conninfo(**params).encode())
        if pgconn.status != pq.ConnStatus.OK:
            text = _one_line(pgconn.error_message.decode("utf-8", "replace"))
            pgconn.finish()
            raise _connect_error(text, mask_dsn(dsn))
        conn = cls(pgconn, dsn)
        if conn.server_version < 15:
            conn.close()
            raise CaptureError(
                f"server version {conn.server_version} is not supported (PostgreSQL 15 or later)"
            )
        for name, value in PINNED_GUCS.items():
            conn.execute(f"SET {name} = {quote_literal(value)}")
        return conn

    def close(self) -> None:
        self.pgconn.finish()  # idempotent

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- commands ---------------------------------------------------------------------------

    def execute(self, command: str) -> list[tuple[str | None, ...]]:
        """Run one command with the simple query protocol (the only one a walsender speaks);
        the rows as text."""
        res = self.pgconn.exec_(command.encode())
        if res.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise self._error(res, command.split(None, 1)[0])
        rows = [
            tuple(
                None if (v := res.get_value(r, c)) is None else v.decode()
                for c in range(res.nfields)
            )
            for r in range(res.ntuples)
        ]
        return rows

    def _error(self, res, what: str) -> CaptureError:
        if self.pgconn.status == pq.ConnStatus.BAD:
            text = _one_line(self.pgconn.error_message.decode("utf-8", "replace"))
            return CaptureError(f"{what}: connection lost: {text}", transient=True)
        return _result_error(res, what)

    def identify_system(self) -> SystemInfo:
        ((system_id, timeline, xlogpos, dbname),) = self.execute("IDENTIFY_SYSTEM")
        return SystemInfo(system_id, int(timeline), parse_lsn(xlogpos), dbname)

    def create_slot(
        self,
        name: str,
        *,
        temporary: bool = False,
        two_phase: bool = False,
        snapshot: str = "nothing",
        failover: bool = False,
    ) -> SlotInfo:
        """CREATE_REPLICATION_SLOT ... LOGICAL pgoutput. ``snapshot``: "nothing", "export" (a
        snapshot name another session can SET TRANSACTION SNAPSHOT to, e.g. a Spark initial
        load) or "use" (this connection must be in a REPEATABLE READ transaction)."""
        if snapshot not in ("nothing", "export", "use"):
            raise ValueError(f"snapshot must be nothing, export or use, got {snapshot!r}")
        opts = [f"SNAPSHOT {quote_literal(snapshot)}"]
        if two_phase:
            opts.append("TWO_PHASE true")
        if failover:  # PostgreSQL 17+: synchronized to standbys (sync_replication_slots)
            opts.append("FAILOVER true")
        cmd = (
            f"CREATE_REPLICATION_SLOT {quote_ident(name)}"
            + (" TEMPORARY" if temporary else "")
            + f" LOGICAL pgoutput ({', '.join(opts)})"
        )
        ((slot, point, snap, plugin),) = self.execute(cmd)
        return SlotInfo(slot, parse_lsn(point), snap, plugin)

    def alter_slot_failover(self, name: str, failover: bool = True) -> None:
        """ALTER_REPLICATION_SLOT name (FAILOVER ...) (PostgreSQL 17+)."""
        self.execute(
            f"ALTER_REPLICATION_SLOT {quote_ident(name)} (FAILOVER {'true' if failover else 'false'})"
        )

    def start_replication(self, slot: str, lsn: int, options: list[tuple[str, str]]) -> None:
        """START_REPLICATION SLOT ... LOGICAL lsn (options); the connection is then in COPY."""
        optstr = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options)
        cmd = f"START_REPLICATION SLOT {quote_ident(slot)} LOGICAL {format_lsn(lsn)} ({optstr})"
        self.pgconn.send_query(cmd.encode())
        res = self.pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            err = self._error(res, "START_REPLICATION") if res is not None else None
            while self.pgconn.get_result() is not None:
                pass
            raise err or CaptureError("START_REPLICATION: no answer from the server")
        self.copying = True

    # -- CopyData ---------------------------------------------------------------------------

    def read(self, timeout: float) -> bytes | memoryview | None:
        """The next CopyData message, or None when none arrived within ``timeout`` seconds.
        Raises CaptureError when the server ends the stream or the connection drops."""
        pgconn = self.pgconn
        try:
            n, buf = pgconn.get_copy_data(1)
            if n > 0:
                return buf
            if n == 0:
                if timeout > 0:
                    ready, _, _ = select.select([pgconn.socket], [], [], timeout)
                    if not ready:
                        return None
                pgconn.consume_input()
                n, buf = pgconn.get_copy_data(1)
                if n > 0:
                    return buf
                if n == 0:
                    return None
        except Exception as exc:  # psycopg's OperationalError: the connection broke
            raise self._stream_error(str(exc)) from None
        raise self._stream_error(None)

    def _stream_error(self, detail: str | None) -> CaptureError:
        self.copying = False
        res = self.pgconn.get_result() if self.pgconn.status == pq.ConnStatus.OK else None
        if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
            err = _result_error(res, "replication stream")
        elif self.pgconn.status == pq.ConnStatus.BAD or detail:
            text = _one_line(detail or self.pgconn.error_message.decode("utf-8", "replace"))
            err = CaptureError(f"replication stream: connection lost: {text}", transient=True)
        else:
            err = CaptureError("replication stream: the server ended the stream", transient=True)
        return err

    def send(self, data: bytes) -> None:
        """Send one CopyData message now."""
        try:
            self.pgconn.put_copy_data(data)
            self.pgconn.flush()
        except Exception as exc:
            raise self._stream_error(str(exc)) from None

    def end_copy(self, timeout: float) -> bool:
        """End the replication stream from our side (CopyDone) and wait up to ``timeout``
        seconds for the server to end it too; what the server sent meanwhile is dropped. The
        server handles our messages in order, so once it has ended the stream it has taken in
        every status update sent before. True when it did so in time."""
        pgconn = self.pgconn
        deadline = time.monotonic() + timeout
        try:
            pgconn.put_copy_end()
            pgconn.flush()
            while True:
                n, _ = pgconn.get_copy_data(1)
                if n > 0:
                    continue
                if n < 0:
                    break
                if not self._wait_readable(deadline):
                    return False
            self.copying = False
            while True:  # CommandComplete / ReadyForQuery of START_REPLICATION
                while pgconn.is_busy():
                    if not self._wait_readable(deadline):
                        return False
                if pgconn.get_result() is None:
                    return True
        except Exception:  # the connection broke: nothing more to wait for
            return False

    def _wait_readable(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.pgconn.socket], [], [], left)[0]:
            return False
        self.pgconn.consume_input()
        return True

    @property
    def fileno(self) -> int:
        return self.pgconn.socket


def _connect_error(text: str, masked_dsn: str) -> CaptureError:
    low = text.lower()
    transient = any(
        s in low
        for s in (
            "connection refused",
            "the database system is starting up",
            "the database system is shutting down",
            "the database system is in recovery mode",
            "server closed the connection",
            "timeout expired",
            "could not connect",
        )
    )
    hint = None
    if "permission denied to start wal sender" in low or "must be superuser or replication" in low:
        hint = "ALTER ROLE <role> REPLICATION on the server (or connect as a superuser)"
        transient = False
    elif "pg_hba.conf" in low:
        hint = "add a host line for this role and database to pg_hba.conf and reload"
    elif "password authentication failed" in low:
        hint = (
            "the password is wrong for this role: check PGPASSWORD, ~/.pgpass or the DSN's password"
        )
    elif "no password supplied" in low:
        hint = (
            "the server asks for a password and none was given: set PGPASSWORD, add a line "
            "to ~/.pgpass, or put password=... in --dsn"
        )
    elif "does not exist" in low and "database" in low:
        hint = "check dbname in --dsn"
    return CaptureError(
        f"cannot connect ({masked_dsn}): {text}" + (f" (fix: {hint})" if hint else ""),
        transient=transient,
    )
