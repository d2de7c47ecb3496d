"""A non-transactional logical message is a place where acking is safe, and the ack is the
message's LSN (where its WAL record ends), not one past it: a transaction left open across
the message commits right after the message's record, and a walsender started one byte
past the message skipped that transaction for good (every supported server)."""

from __future__ import annotations

import time

import pytest

from pgcdc.capture.logical import LogicalStream
from tests.postgres import servers


def _read_all(srv, start: int = 0, seconds: float = 2.0) -> list:
    """The messages the slot sends from ``start``: (tag, LSN, ack LSN or None)."""
    got = []
    with LogicalStream(srv.conninfo(), "s", ["p"], messages=True, auto_idle_ack=False,
                       start_lsn=start) as stream:  # fmt: skip
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            change = stream.read(0.2)
            if change is not None:
                got.append((chr(change.payload[0]), change.lsn, change.context.ack_lsn))
    return got


@pytest.mark.parametrize("key", servers.SERVER_KEYS)
def test_a_restart_at_a_messages_ack_keeps_the_transaction_committing_after_it(pg, key):
    with pg.database(key) as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        with conn.transaction():  # open across the message: its commit record comes next
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("SELECT pg_logical_emit_message(false, 'x', 'between')")
        (wal,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()

        first = _read_all(srv)
        tags = [t for t, _lsn, _ack in first]
        assert tags[0] == "M" and "I" in tags and tags[-1] == "C", first  # the message first
        message_ack = first[0][2]
        assert message_ack is not None

        again = _read_all(srv, start=message_ack)
        tags = [t for t, _lsn, _ack in again]
        # the transaction again, and not the message: it was acked
        assert "M" not in tags and "I" in tags and tags[-1] == "C", (message_ack, again, wal)
