"""The streaming workload ``bench.source_bench`` and ``bench.sync_bench`` both run.

``bench_t`` (int8 key, numeric(12,2), text, timestamptz, float8) published as ``bench_pub``,
filled in transactions of 1,000 rows (:data:`FILL`), and the one-process peer both compare
against (:func:`peer_path`): a slot peeked up to NULL and typed by
``pgcdc.events.reader.EventReader`` in this process.
"""

from __future__ import annotations

import time

from pgoutput_codec import capture

from pgcdc.events.reader import EventReader

PUB = "bench_pub"
TABLE = (
    "CREATE TABLE bench_t (id int8 PRIMARY KEY, n numeric(12,2), s text, ts timestamptz, f float8)"
)
FILL = (
    "INSERT INTO bench_t SELECT g, g * 0.01, 'row ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 second', g / 7.0 FROM generate_series({lo}, {hi}) g"
)


def drop_slot(conn, slot: str) -> None:
    """Drop ``slot`` once no process holds it (waits up to 30 s); nothing when it is gone."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        if row is None:
            return
        if not row[0]:
            conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            return
        time.sleep(0.2)


def peer_path(conn, slot: str, major: int) -> tuple[int, float, float]:
    """The issue's one-process peer: ``slot`` peeked up to NULL and typed by ``EventReader``
    in this process: (events, seconds, seconds)."""
    pv = 4 if major >= 16 else 3
    t0 = time.perf_counter()
    with conn.transaction(), conn.cursor(name="peer") as cur:
        cur.itersize = 10_000
        cur.execute(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_binary_changes"
            "(%s, NULL, NULL, 'proto_version', %s, 'publication_names', %s)",
            [slot, str(pv), PUB],
        )
        records = capture.from_payloads(((lsn, bytes(d)) for lsn, d in cur), pv)
        n = sum(1 for _ in EventReader().read(records))
    seconds = time.perf_counter() - t0
    return n, seconds, seconds
