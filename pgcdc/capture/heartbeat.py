"""Heartbeats: a logical decoding message written to the source database at an interval, so
that a slot whose published tables are quiet still has something to decode in its own
database, and its consumer a position to confirm past.

    from pgcdc.capture.heartbeat import Heartbeat
    hb = Heartbeat(dsn, interval=10)
    ...
    hb.maybe_beat()   # from the consumer's loop: writes one when one is due
    hb.close()

Each beat is ``pg_logical_emit_message(false, 'pgcdc.heartbeat', '<json>')``: a
non-transactional message. It takes no transaction ID (nothing for wraparound over months of
beats), writes no commit record and no row (no table to create, grant or publish), and is
decoded at once, outside any transaction: a position a consumer may confirm by itself. A
small transaction to a heartbeat table would need all of that, and the table in the
publication to be seen at all.

pgoutput sends messages only to a consumer that asked for them (``messages``); one that did
sees heartbeats as messages with the prefix :data:`HEARTBEAT_PREFIX` (``pgcdc capture`` does
not write them to its segments, see :func:`is_heartbeat`); one that did not sees nothing, and
confirms the server's WAL position from its keepalives past the heartbeat.
"""

from __future__ import annotations

import json
import time

import pgoutput_codec as pgc

from pgcdc.capture.walsender import _one_line, mask_dsn

HEARTBEAT_PREFIX = "pgcdc.heartbeat"
_PREFIX_BYTES = HEARTBEAT_PREFIX.encode() + b"\0"
# a Message outside a stream block: tag, flags u8, lsn u64, then the prefix (a C string)
_MESSAGE = ord(pgc.Message.TAG)
_PREFIX_AT = 10


def is_heartbeat(payload) -> bool:
    """A pgoutput Message (outside a stream block) that is a pgcdc heartbeat."""
    return payload[0] == _MESSAGE and payload[_PREFIX_AT : _PREFIX_AT + len(_PREFIX_BYTES)] == (
        _PREFIX_BYTES
    )


class Heartbeat:
    """Writes a heartbeat every ``interval`` seconds on its own connection (opened on first
    use, reopened after a failure). A failed beat is counted and reported by ``on_error``
    (once per failure streak), never raised: a heartbeat must not stop what it serves."""

    def __init__(
        self, dsn: str, interval: float, *, on_error=None, application_name="pgcdc heartbeat"
    ):
        if interval <= 0:
            raise ValueError("the heartbeat interval must be positive")
        self.dsn = dsn
        self.interval = interval
        self.on_error = on_error  # on_error(message: str)
        self.application_name = application_name
        self.sent = 0
        self.failed = 0
        self.last_lsn: str | None = None  # where the last beat was written
        self.last_at: float | None = None  # time.time() of the last beat
        self._conn = None
        self._next = 0.0  # monotonic time of the next beat (0: at once)
        self._failing = False

    def maybe_beat(self, now: float | None = None) -> bool:
        """Beat if one is due; True when one was written."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return False
        self._next = now + self.interval
        return self.beat()

    def beat(self) -> bool:
        """Write one heartbeat now; True when it was written."""
        import psycopg

        body = json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=self.application_name,
                )
            (lsn,) = self._conn.execute(
                "SELECT pg_logical_emit_message(false, %s, %s)::text", [HEARTBEAT_PREFIX, body]
            ).fetchone()
        except psycopg.Error as e:
            self.failed += 1
            self._drop()
            if not self._failing and self.on_error is not None:
                self.on_error(
                    f"heartbeat failed ({mask_dsn(self.dsn)}): {_one_line(str(e))} (fix: the "
                    "role needs EXECUTE on pg_logical_emit_message, e.g. a REPLICATION role; "
                    "retrying every interval)"
                )
            self._failing = True
            return False
        self._failing = False
        self.sent += 1
        self.last_lsn, self.last_at = lsn, time.time()
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self._conn = None

    def close(self) -> None:
        self._drop()
