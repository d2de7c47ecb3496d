"""``pgcdc capture`` against real PostgreSQL 15-18.

Per server: two slots created at the same point (one by ``pgcdc capture --create-slot`` over the
walsender, its twin with pg_create_logical_replication_slot), the workload with every message
type, then the capture. The expected messages come from the server itself:
``pg_logical_slot_peek_binary_changes`` on the twin slot with the same options. A third slot is
read in ``--sql`` mode and compared the same way. Also checked: what the server was told is
durable (confirmed_flush_lsn) equals the directory's state, and clean one-line errors.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from pgcdc.capture import files, runner, segments
from pgcdc.cli import capture as cli
from pgcdc.capture.logical import LogicalStream
from pgcdc.lsn import parse_lsn
from tests.postgres import capture, servers, workload
from tests.postgres.capture import Options
from tests.wait import until  # noqa: E402


def _options(major: int) -> tuple[list[str], Options]:
    pv = 4 if major >= 16 else 3
    mode = "parallel" if pv == 4 else "on"
    origin = "any" if major >= 16 else None
    args = ["--binary", "--streaming", mode, "--messages", "--two-phase"]
    args += ["--origin", origin] if origin else []
    decoding = "immediate" if major >= 16 else "buffered"  # the harness's server setting
    return args, Options(pv, True, mode, True, origin=origin, decoding=decoding)


def _run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def _confirmed(conn, slot: str) -> int:
    (lsn,) = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    return parse_lsn(lsn)


@pytest.mark.parametrize("key,loop", [*((k, "c") for k in servers.SERVER_KEYS), ("pg18", "python")])
def test_capture_equals_twin_peek(pg, key, loop, tmp_path, capsys, monkeypatch):
    """The walsender's messages read by the C loop (pgcdc.capture.copyread), and on 18 by the
    Python loop too."""
    from pgcdc.capture import copyread
    from pgcdc.capture import logical as stream_module

    monkeypatch.setattr(copyread, "ENABLED", loop == "c")
    bound = []

    def binding(pgconn):
        bound.append(copyread.c_records(pgconn))
        return bound[-1]

    monkeypatch.setattr(stream_module, "c_records", binding)
    with pg.database(key) as srv, srv.connect() as conn:
        workload.prepare_schema(conn, srv.major)
        flags, opts = _options(srv.major)
        common = ["--dsn", srv.conninfo(), "--publication", workload.PUBLICATION, *flags]
        # the capture's slot, over the walsender; then the twin and the --sql slot
        code, err = _run(capsys, "--slot", "cap", "--out", str(tmp_path / "ws"), "--create-slot",
                         "--idle-exit", "0.5", *common)  # fmt: skip
        assert code == 0, err
        for slot in ("twin", "cap_sql"):
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", [slot]
            )
        workload.run(conn, srv.major)
        code, err = _run(capsys, "--slot", "cap", "--out", str(tmp_path / "ws"),
                         "--idle-exit", "2", *common)  # fmt: skip
        assert code == 0, err
        # Small batches make the SQL mode advance the slot and peek again many times. PG 15 can
        # only stream when logical_decoding_work_mem fills up, and a peek that starts in the
        # middle of a large transaction's WAL may chunk its stream differently (an empty stream
        # block, seen on 15.18): the same changes, not the same messages. 16+ run with
        # debug_logical_replication_streaming = immediate, which streams deterministically.
        batch = "50" if srv.major >= 16 else "100000"
        code, err = _run(capsys, "--slot", "cap_sql", "--out", str(tmp_path / "sql"), "--sql",
                         "--batch-size", batch, "--idle-exit", "2", *common)  # fmt: skip
        assert code == 0, err

        expected = capture.sql_capture(conn, "twin", opts)
        assert capture.message_counts(expected).keys() >= {"Insert", "StreamStart", "Message"}
        for mode in ("ws", "sql"):
            got = list(files.iter_records(tmp_path / mode))
            where = f"{key} {mode}"
            assert len(got) == len(expected), f"{where}: {len(got)} vs {len(expected)} messages"
            lsn_differs = Counter()
            for i, (g, e) in enumerate(zip(got, expected)):
                assert g.data == e.data, f"{where}: message {i} (LSN {e.lsn:X}) differs"
                assert (g.protocol_version, g.in_stream, g.parallel_streaming) == (
                    e.protocol_version,
                    e.in_stream,
                    e.parallel_streaming,
                ), f"{where}: message {i} context"
                if g.lsn != e.lsn:
                    lsn_differs[g.data[:1]] += 1
                    # the walsender sends no LSN (0) with some messages the SQL interface dates
                    assert mode == "ws" and g.lsn == 0, f"{where}: message {i} LSN {g.lsn:X}"
            assert set(lsn_differs) <= {b"R", b"Y", b"B", b"S"}, lsn_differs
            # the server was told exactly what the directory holds
            state = json.loads((tmp_path / mode / "state.json").read_text())
            slot = "cap" if mode == "ws" else "cap_sql"
            assert _confirmed(conn, slot) == parse_lsn(state["lsn"]), where
            assert "password" not in json.dumps(state)
        assert bound and all(f is not None for f in bound) == (loop == "c"), (loop, bound)


@pytest.fixture(scope="module")
def pg18(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        workload.prepare_schema(conn, srv.major)
        conn.execute("SELECT pg_create_logical_replication_slot('busy', 'pgoutput')")
        conn.execute("CREATE ROLE plain LOGIN PASSWORD 'sekrit-pw'")
        yield srv


def _base(srv, tmp_path, **extra) -> list[str]:
    return ["--dsn", srv.conninfo(**extra), "--out", str(tmp_path / "out"), "--idle-exit", "1"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--slot", "nope", "--publication", "pub"], "--create-slot"),
        (["--slot", "busy", "--publication", "missing_pub"], "CREATE PUBLICATION"),
        (["--slot", "busy", "--publication", "pub", "--protocol-version", "9"], "1 to 4"),
        (
            [
                "--slot",
                "busy",
                "--publication",
                "pub",
                "--streaming",
                "parallel",
                "--protocol-version",
                "3",
            ],
            "needs protocol version 4",
        ),  # fmt: skip
        (["--slot", "busy", "--publication", "pub", "--streaming", "sideways"], "invalid choice"),
        (["--slot", "busy", "--publication", "pub", "--start-lsn", "zz"], "not an LSN"),
    ],
)
def test_bad_options_and_server_errors_are_one_line(pg18, tmp_path, capsys, args, needle):
    code, err = _run(capsys, *_base(pg18, tmp_path), *args)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if '"level": "error"' in ln or "error:" in ln]
    assert len(lines) == 1 and needle in lines[0], err


def test_role_without_replication_is_told_the_fix(pg18, tmp_path, capsys):
    dsn_args = _base(pg18, tmp_path, user="plain", password="sekrit-pw")
    code, err = _run(capsys, *dsn_args, "--slot", "busy", "--publication", "pub")
    assert code == 2, err
    assert "REPLICATION" in err and "ALTER ROLE" in err, err
    assert "sekrit-pw" not in err  # the password in the DSN is masked everywhere
    assert "sekrit-pw" not in "".join(p.read_text() for p in (tmp_path / "out").glob("*.json"))


def test_slot_in_use_is_told_the_fix(pg18, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "SLOT_BUSY_PATIENCE", 0.0)
    holder = LogicalStream(pg18.conninfo(), "busy", ["pub"]).open()
    try:
        code, err = _run(capsys, *_base(pg18, tmp_path), "--slot", "busy", "--publication", "pub")
    finally:
        holder.close()
    assert code == 2, err
    assert "active for PID" in err and "pg_stat_replication" in err, err


def test_sigterm_flushes_and_exits_zero(pg18, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('sig', 'pgoutput')")
        conn.execute("INSERT INTO bulk SELECT g, 'x' FROM generate_series(1, 1000) g")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgcdc", "capture", "--dsn", pg18.conninfo(), "--slot", "sig",
             "--publication", "pub", "--out", str(tmp_path / "out"), "--flush-interval", "60"],
            stderr=subprocess.PIPE, text=True, env=os.environ,
        )  # fmt: skip

        def started():
            assert proc.poll() is None, "capture did not start"
            out = tmp_path / "out"
            return out.exists() and list(segments.iter_written(out))

        until("the capture's first segment", started)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        state = json.loads((tmp_path / "out" / "state.json").read_text())
        records = list(files.iter_records(tmp_path / "out"))
        assert sum(r.data[:1] == b"I" for r in records) == 1000, err
        assert _confirmed(conn, "sig") == parse_lsn(state["lsn"])


def test_python_api_yields_and_acks(pg18):
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('api', 'pgoutput')")
        conn.execute("INSERT INTO bulk VALUES (1, 'a'), (2, 'b')")
        done = threading.Event()
        seen = []
        with LogicalStream(pg18.conninfo(), "api", ["pub"], status_interval=0.2) as stream:
            for lsn, payload, ctx in stream:
                seen.append(payload[:1])
                if ctx.ack_lsn is not None:
                    stream.ack(ctx.ack_lsn)
                    acked = ctx.ack_lsn
                    done.set()
                    break
            stream.send_status()
        assert seen[0] == b"B" and seen[-1] == b"C" and seen.count(b"I") == 2, seen
        assert _confirmed(conn, "api") == acked


def test_reads_let_messages_gather_over_tcp_only(pg18):
    """Over TCP a read waits 10 ms for the walsender's messages to pile up (each comes with a
    send() of its own); a Unix socket holds only a few hundred of them, so a wait would leave
    the server blocked (a 200,000-message backlog took 7.6 s instead of 0.6): none there."""
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('gather', 'pgoutput')")
        conn.execute("INSERT INTO bulk SELECT g, 'r' || g FROM generate_series(10001, 13000) g")
    for dsn, wait in ((pg18.conninfo(), 0.01), (pg18.conninfo(host=str(pg18.tmpdir)), 0.0)):
        inserts = 0
        with LogicalStream(dsn, "gather", ["pub"]) as stream:
            assert stream.read_delay == wait, dsn
            for _lsn, payload, ctx in stream:
                inserts += payload[:1] == b"I"
                if ctx.ack_lsn is not None and inserts:
                    break
        assert inserts == 3000, (dsn, inserts)


def test_live_events_replay_to_the_server_state_and_ack(pg18):
    """events.live_events on a LogicalStream: typed events of inserts, updates and deletes,
    replayed, equal the table as the server has it; the ack point it gives is the slot's."""
    from pgcdc.events.reader import live_events

    with pg18.connect() as conn:
        conn.execute("CREATE TABLE live_t (id int PRIMARY KEY, n int8, note text, at timestamptz)")
        conn.execute("CREATE PUBLICATION live_pub FOR TABLE live_t")
        conn.execute("SELECT pg_create_logical_replication_slot('live_ev', 'pgoutput')")
        conn.execute(
            "INSERT INTO live_t SELECT g, g * 1000, 'row ' || g,"
            " timestamptz '2024-05-01 12:00+00' + g * interval '1 minute'"
            " FROM generate_series(1, 3000) g"
        )
        conn.execute("UPDATE live_t SET n = -n, note = note || ' ü' WHERE id % 3 = 0")
        conn.execute("DELETE FROM live_t WHERE id % 7 = 0")
        conn.execute("UPDATE live_t SET id = id + 10000 WHERE id = 1")  # a key change
        truth = {row[0]: row for row in conn.execute("SELECT id, n, note, at FROM live_t")}
        (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        rows, acked = {}, None
        with LogicalStream(pg18.conninfo(), "live_ev", ["live_pub"], auto_idle_ack=False) as stream:
            for events, ack in live_events(stream, timeout=0.5):
                count = 0
                for ev in events:
                    count += 1
                    if ev.op == "d" or (ev.op == "u" and ev.before is not None):
                        rows.pop(ev.before_dict()["id"])
                    if ev.op in ("c", "u"):
                        after = ev.after_dict()
                        rows[after["id"]] = (after["id"], after["n"], after["note"], after["at"])
                if ack is not None:
                    stream.ack(ack)
                    acked = ack
                if not count and acked is not None and acked >= parse_lsn(end) - 1024:
                    break
            stream.send_status()
        assert rows == truth
        assert _confirmed(conn, "live_ev") == acked
