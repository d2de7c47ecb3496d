"""A capture with a confirm limit (sync's: what its tables hold) stopped once idle confirms
the server's WAL end when its limit covers everything it received: the slot's restart_lsn
then passes the running-transactions record a checkpoint logged after the last burst, and
the next walsender does not decode the burst again. With a limit short of what it received,
nothing past the limit is confirmed (PostgreSQL 18, no Spark)."""

from __future__ import annotations

import io
import threading

import pytest

from pgcdc.capture import segments
from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.lsn import format_lsn, parse_lsn
from tests.postgres import servers
from tests.wait import until


def _wal(conn) -> int:
    return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _slot(conn, slot: str) -> tuple[int, int]:
    restart, confirmed = conn.execute(
        "SELECT restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots"
        " WHERE slot_name = %s",
        [slot],
    ).fetchone()
    return parse_lsn(restart), parse_lsn(confirmed)


@pytest.mark.parametrize("behind", [False, True], ids=["applied", "behind"])
def test_a_stop_while_idle_confirms_the_wal_end_only_when_everything_is_applied(tmp_path, behind):
    cap, limit_file = tmp_path / "cap", tmp_path / "applied.lsn"
    # a server of its own: the slot's restart_lsn is checked against a quiet server's WAL
    with servers.running_server("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        created_restart, _ = _slot(conn, "s")
        config = CaptureConfig(dsn=srv.conninfo(), slot="s", publications=["pub"], out=str(cap),
                               flush_interval=0.1, status_interval=0.2, fsync=False,
                               confirm_limit=str(limit_file))  # fmt: skip
        capture = Capture(config, Log("json", stream=io.StringIO()))
        th = threading.Thread(target=capture.run, daemon=True)
        th.start()
        try:
            for i in range(0, 2000, 100):  # a burst of transactions
                conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(%s::int, %s::int) g",
                             [i, i + 99])  # fmt: skip
            burst_end = _wal(conn)
            state = until(
                "durable", lambda: (s := segments.read_state(cap)) and s.lsn >= burst_end and s
            )
            # downstream holds everything received, or not the last transaction
            applied = state.lsn if not behind else burst_end - 1
            limit_file.write_text(format_lsn(applied) + "\n")
            conn.execute("CHECKPOINT")  # logs a running-transactions record after the burst
            after_checkpoint = _wal(conn)
            # the capture idle at the server's WAL end (its keepalives), durable there
            until("idle", lambda: segments.read_state(cap).lsn >= after_checkpoint)
        finally:
            capture.stop = True
            th.join(30)
        assert not th.is_alive()
        restart, confirmed = _slot(conn, "s")
    if behind:
        assert confirmed <= applied  # never past what downstream holds
        assert restart <= burst_end
    else:
        assert confirmed >= after_checkpoint
        # the walsender's next start decodes from past the burst, not from before it
        assert restart > burst_end > created_restart
