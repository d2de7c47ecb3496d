"""Slots in trouble, made on purpose: what the "runs for months" tests need of a server; and a
slot's events read by a peek, what a reader under test is compared with."""

from __future__ import annotations

import time


def invalidate_slot(conn, slot: str, attempts: int = 40) -> bool:
    """Invalidate ``slot`` as production servers do (``wal_removed``): lower
    max_slot_wal_keep_size, write WAL past it while nothing reads the slot, checkpoint, and
    put the setting back. ``conn`` is an autocommit connection; whether the slot got
    ``wal_status = 'lost'``."""
    conn.execute("CREATE TABLE IF NOT EXISTS _filler (id int PRIMARY KEY, v text)")
    conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.2)
    try:
        for _ in range(attempts):
            for _ in range(3):
                conn.execute("INSERT INTO _filler VALUES (1, 'x') ON CONFLICT (id) "
                             "DO UPDATE SET v = _filler.v || 'y'")  # fmt: skip
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            (status,) = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", [slot]
            ).fetchone()
            if status == "lost":
                return True
        return False
    finally:
        conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        conn.execute("SELECT pg_reload_conf()")


def peeked_events(conn, slot: str, publication: str, major: int, *, messages: bool = False,
                  lenient: bool = False) -> list:  # fmt: skip
    """The events of ``slot`` up to now, peeked (the slot is not consumed) and read by
    :class:`pgcdc.events.reader.EventReader` (``lenient``: values of types it cannot load stay
    raw); logical messages with ``messages``."""
    from pgcdc.events.reader import EventReader
    from pgcdc.lsn import parse_lsn
    from pgoutput_codec import capture

    pv = 4 if major >= 16 else 3
    extra = ", 'messages', 'true'" if messages else ""
    got = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
        f" 'proto_version', %s, 'publication_names', %s{extra})",
        [slot, str(pv), publication],
    ).fetchall()
    records = capture.from_payloads([(parse_lsn(lsn), bytes(d)) for lsn, d in got], pv)
    return [e for e in EventReader(lenient=lenient).read(records) if e.op not in ("begin", "end")]
