"""What a capture that runs for months needs, against real servers (PostgreSQL 15 and 18): a slot
the server invalidated ends the capture with one line that says so (not the wal_level hint it
used to get), heartbeats keep an idle slot's position moving while another database of the
cluster writes, the metrics scrape, and failover slots."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
import urllib.request

import psycopg
import pytest

from pgcdc.capture import segments
from pgcdc.capture.checks import slot_health
from pgcdc.capture.heartbeat import HEARTBEAT_PREFIX, Heartbeat
from pgcdc.capture.runner import Capture, CaptureConfig, Log
from pgcdc.capture.logical import LogicalStream
from pgcdc.cli import capture as cli
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.metrics import parse_address
from tests.postgres import servers
from tests.postgres.slots import invalidate_slot
from tests.wait import until, WaitTimeout  # noqa: E402


@pytest.fixture(scope="module")
def pg18():
    # a server of its own: slots are invalidated with ALTER SYSTEM max_slot_wal_keep_size
    with servers.running_server("pg18") as srv:
        _setup(srv)
        yield srv


@pytest.fixture(scope="module")
def pg15():
    # a server of its own: slots are invalidated with ALTER SYSTEM max_slot_wal_keep_size
    with servers.running_server("pg15") as srv:
        _setup(srv)
        yield srv


def _setup(srv) -> None:
    with srv.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("CREATE DATABASE busy")
    with psycopg.connect(srv.conninfo(dbname="busy"), autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int, pad text)")


def _capture(capsys, srv, out, slot, *extra: str) -> tuple[int, str]:
    code = cli.main(["--dsn", srv.conninfo(), "--slot", slot, "--publication", "pub",
                     "--out", str(out), "--idle-exit", "0.5", "--log-format", "text",
                     "--no-fsync", *extra])  # fmt: skip
    return code, capsys.readouterr().err


def _insert(srv, first: int, n: int) -> None:
    with srv.connect() as conn:
        conn.execute(
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
            [first, first + n - 1],
        )


def _slot_row(srv, slot: str) -> dict:
    with srv.connect() as conn:
        (doc,) = conn.execute(
            "SELECT to_jsonb(s)::text FROM pg_replication_slots s WHERE slot_name = %s", [slot]
        ).fetchone()
    return json.loads(doc)


# --- an invalidated slot ------------------------------------------------------------------------


def _invalidate(srv, slot: str) -> None:
    with srv.connect() as conn:
        assert invalidate_slot(conn, slot), f"slot {slot} was not invalidated"


@pytest.mark.parametrize("key", ["pg15", "pg18"])
@pytest.mark.parametrize("interface", ["walsender", "sql"])
def test_an_invalidated_slot_says_what_happened(request, key, interface, tmp_path, capsys):
    srv = request.getfixturevalue(key)
    slot = f"inv_{interface}"
    extra = ["--sql"] if interface == "sql" else []
    out = tmp_path / "cap"
    with srv.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    _insert(srv, 100 + 10 * len(extra) + srv.major * 100, 5)
    code, err = _capture(capsys, srv, out, slot, *extra)
    assert code == 0, err
    durable = segments.read_state(out).lsn
    _invalidate(srv, slot)
    with srv.connect() as conn:
        health = slot_health(lambda q: conn.execute(q).fetchall(), slot)
    assert health.exists and health.invalidated and health.wal_status == "lost"
    assert health.reason == "wal_removed"  # 18: the server's invalidation_reason; 15: inferred
    assert health.invalidation_reason == ("wal_removed" if srv.major >= 17 else None)
    state_before = (out / segments.STATE_FILE).read_text()
    code, err = _capture(capsys, srv, out, slot, *extra)
    lines = [ln for ln in err.splitlines() if ": error:" in ln]
    assert code == 2, err
    assert len(lines) == 1, err
    line = lines[0]
    assert "wal_level" not in line, line
    assert "invalidated" in line and "wal_removed" in line and "max_slot_wal_keep_size" in line
    assert "re-snapshot" in line and f"durable position {format_lsn(durable)}" in line
    assert (out / segments.STATE_FILE).read_text() == state_before
    # a new directory on the same slot: the same answer, before anything is streamed
    code, err = _capture(capsys, srv, tmp_path / "new", slot, *extra)
    assert code == 2 and "invalidated" in err and "wal_level" not in err, err
    with srv.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def test_slot_health_of_a_healthy_and_a_missing_slot(pg18):
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('healthy', 'pgoutput')")
        execute = lambda q: conn.execute(q).fetchall()  # noqa: E731
        ok = slot_health(execute, "healthy")
        gone = slot_health(execute, "no_such_slot")
        conn.execute("SELECT pg_drop_replication_slot('healthy')")
    assert ok.exists and not ok.invalidated and ok.reason is None
    assert ok.wal_status == "reserved" and ok.safe_wal_size is None and ok.failover is False
    assert ok.retained_bytes >= 0 and ok.plugin == "pgoutput"
    assert json.loads(json.dumps(ok.to_json()))["invalidated"] is False
    assert not gone.exists and not gone.invalidated


# --- heartbeats -----------------------------------------------------------------------------


def _retained(conn, slot: str) -> int:
    (n,) = conn.execute(
        "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        [slot],
    ).fetchone()
    return n


def _busy_writer(srv, stop: threading.Event) -> threading.Thread:
    """Another database of the cluster writing WAL (about 4 MB a tick); a checkpoint every
    few seconds stands in for the running-xacts records a server logs every 15 s anyway."""

    def run():
        with psycopg.connect(srv.conninfo(dbname="busy"), autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                conn.execute(
                    "INSERT INTO w SELECT g, repeat('x', 200) FROM generate_series(1, 10000) g"
                )
                conn.execute("TRUNCATE w") if n % 20 == 19 else None
                n += 1
                if n % 10 == 0:
                    conn.execute("CHECKPOINT")
                time.sleep(0.1)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _watch(srv, slots: list[str], seconds: float, step: float = 0.5) -> tuple[dict, int]:
    """Retained WAL samples of each slot over ``seconds`` while the busy database writes; and
    the WAL written meanwhile."""
    stop = threading.Event()
    with srv.connect() as conn:
        (start,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        th = _busy_writer(srv, stop)
        samples = {slot: [] for slot in slots}
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < seconds:
                time.sleep(step)
                for slot in slots:
                    samples[slot].append(_retained(conn, slot))
        finally:
            stop.set()
            th.join()
        (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    return samples, parse_lsn(end) - parse_lsn(start)


def _run_capture(config: CaptureConfig) -> tuple[Capture, threading.Thread]:
    cap = Capture(config, Log("json", stream=io.StringIO()))
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    with contextlib.suppress(WaitTimeout):
        until("the capture connected", lambda: cap.connected or not th.is_alive())
    assert cap.connected, cap.log.stream.getvalue()
    return cap, th


PHASE = 24.0  # seconds of busy WAL over which the four consumers are measured


def test_heartbeats_keep_an_idle_slot_moving(pg18, tmp_path):
    """The published table is idle, another database writes. A capture confirms the server's
    WAL end from its keepalives whether or not it beats (it acks positions past what it did not
    receive); a consumer that confirms only what it receives (as a stream-processing source
    does) holds back ever more WAL without heartbeats, and little with them.

    The four consumers run at once over the same writes. Those without heartbeats read a
    database of their own (``quiet``): a heartbeat is a message in its database's WAL, which
    a receive-only consumer there would see and confirm."""
    srv = pg18
    with srv.connect() as conn:
        conn.execute("CREATE DATABASE quiet")
    with psycopg.connect(srv.conninfo(dbname="quiet"), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    dsn = {"beat": srv.conninfo(), "quiet": srv.conninfo(dbname="quiet")}
    consumers = {  # name: (database, heartbeat interval)
        "capture+heartbeat": ("beat", 1.0), "capture": ("quiet", None),
        "receiver+heartbeat": ("beat", 1.0), "receiver": ("quiet", None),
    }  # fmt: skip
    slots = {name: "hb_" + name.replace("+", "_") for name in consumers}
    for name, (db, _beat) in consumers.items():
        with psycopg.connect(dsn[db], autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slots[name]])
    captures = {}
    with contextlib.ExitStack() as stack:
        for name, (db, beat) in consumers.items():
            if name.startswith("capture"):
                config = CaptureConfig(dsn=dsn[db], slot=slots[name], publications=["pub"],
                                       out=str(tmp_path / slots[name]), status_interval=1.0,
                                       heartbeat=beat, fsync=False)  # fmt: skip
                captures[name] = stack.enter_context(_capturing(config))
            else:
                stack.enter_context(_receiving_only(dsn[db], slots[name], beat))
        samples, written = _watch(srv, list(slots.values()), PHASE)
    for name, cap in captures.items():
        if consumers[name][1]:
            assert cap.heartbeat.sent >= PHASE / consumers[name][1] / 2
            assert cap.heartbeat.failed == 0
    report = {
        k: {"max_retained_mb": round(max(samples[s]) / 2**20, 1),
            "last_retained_mb": round(samples[s][-1] / 2**20, 1)}
        for k, s in slots.items()
    }  # fmt: skip
    print("\nretained WAL over", PHASE, "s of another database's writes",
          f"({written / 2**20:.1f} MB):", json.dumps(report))  # fmt: skip
    for name in ("capture+heartbeat", "capture", "receiver+heartbeat"):
        # bounded: at the end, less than half of what was written (the checkpoint cadence)
        assert samples[slots[name]][-1] < written / 2, (name, report)
    assert samples[slots["receiver"]][-1] > written * 0.9, report  # all of it held back


@contextlib.contextmanager
def _capturing(config: CaptureConfig):
    cap, th = _run_capture(config)
    try:
        yield cap
    finally:
        cap.stop = True
        th.join(30)


@contextlib.contextmanager
def _receiving_only(dsn: str, slot: str, beat: float | None):
    """A consumer that confirms only what it receives (messages on): heartbeats are all it
    gets from an idle database."""
    stop = threading.Event()
    hb = Heartbeat(dsn, beat) if beat else None

    def consume():
        with LogicalStream(dsn, slot, ["pub"], messages=True, auto_idle_ack=False,
                           status_interval=1.0) as stream:  # fmt: skip
            while not stop.is_set():
                if hb is not None:
                    hb.maybe_beat()
                change = stream.read(0.2)
                if change is not None and change.context.ack_lsn is not None:
                    stream.ack(change.context.ack_lsn)

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(30)
        if hb is not None:
            hb.close()


@pytest.mark.parametrize("interface", ["walsender", "sql"])
def test_heartbeats_are_not_captured_as_messages(pg18, tmp_path, interface):
    """With --messages, a heartbeat moves the position but is not written to the segments;
    the user's own messages are."""
    from pgcdc.events.reader import read_captures

    slot = f"hb_msgs_{interface}"
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    out = tmp_path / "cap"
    config = CaptureConfig(dsn=pg18.conninfo(), slot=slot, publications=["pub"],
                           out=str(out), messages=True, heartbeat=0.2, status_interval=0.5,
                           sql=interface == "sql", fsync=False)  # fmt: skip
    cap, th = _run_capture(config)
    try:
        with pg18.connect() as conn:
            conn.execute("SELECT pg_logical_emit_message(false, 'mine', 'hello')")
            first = 5000 if interface == "walsender" else 6000
            _insert(pg18, first, 3)
            time.sleep(2.0)
            conn.execute("SELECT pg_logical_emit_message(true, 'mine', 'again')")
            (after_again,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            time.sleep(1.5)
    finally:
        cap.stop = True
        th.join(30)
    assert cap.heartbeat.sent >= 5
    events = list(read_captures([out]))
    prefixes = [e.detail[0] for e in events if e.op == "m"]
    assert prefixes == ["mine", "mine"], prefixes
    assert sorted(e.after[0] for e in events if e.op == "c") == [first, first + 1, first + 2]
    assert HEARTBEAT_PREFIX.encode() not in b"".join(p.read_bytes() for p in out.glob("*.pgcap"))
    # the position moved on past the last change, with the beats that followed it
    assert segments.read_state(out).lsn > parse_lsn(after_again)


# --- metrics --------------------------------------------------------------------------------


def _scrape(address) -> dict[str, float]:
    host, port = address
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r'(pgcdc_\w+)\{component="capture",slot="(\w+)"\} (\S+)', line)
        if m:
            values[m.group(1)] = float(m.group(3))
    return values


def test_metrics_scrape_during_a_capture(pg18, tmp_path):
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('met', 'pgoutput')")
    config = CaptureConfig(dsn=pg18.conninfo(), slot="met", publications=["pub"],
                           out=str(tmp_path / "cap"), heartbeat=0.3, metrics="127.0.0.1:0",
                           flush_interval=0.2, status_interval=0.5, fsync=False)  # fmt: skip
    cap, th = _run_capture(config)
    try:
        address = cap.metrics_server.address
        assert address[0] == "127.0.0.1"
        _insert(pg18, 10_000, 500)
        seen = [None]

        def scraped():
            seen[0] = got = _scrape(address)
            return got.get("pgcdc_messages_received_total", 0) >= 502 and got.get(
                "pgcdc_durable_lsn", 0
            ) >= got.get("pgcdc_received_lsn", 1)

        until("502 messages received and durable (the scrape)", scraped, 20, 0.1)
        got = seen[0]
        time.sleep(1.0)
        got = _scrape(address)
        with pg18.connect() as conn:
            (wal,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    finally:
        cap.stop = True
        th.join(30)
    assert got["pgcdc_up"] == 1
    assert got["pgcdc_messages_received_total"] >= 502  # Begin, 500 Inserts, Commit (+Relation)
    assert got["pgcdc_bytes_received_total"] > 500 * 10
    assert 0 < got["pgcdc_durable_lsn"] <= parse_lsn(wal)
    assert got["pgcdc_confirmed_lsn"] <= got["pgcdc_durable_lsn"]
    assert got["pgcdc_server_wal_lsn"] >= got["pgcdc_received_lsn"] > 0
    assert got["pgcdc_lag_bytes"] < 1 << 20
    assert abs(got["pgcdc_last_message_timestamp_seconds"] - time.time()) < 60
    assert got["pgcdc_heartbeats_total"] >= 2 and got["pgcdc_heartbeat_failures_total"] == 0
    assert got["pgcdc_reconnects_total"] == 0
    assert cap.metrics_server is None  # closed with the capture
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=2)


def test_metrics_address_and_bad_options(pg18, tmp_path, capsys):
    assert parse_address("9187") == ("127.0.0.1", 9187)
    assert parse_address("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_address("[::1]:9187") == ("::1", 9187)
    with pytest.raises(ValueError):
        parse_address("host:port")
    code, err = _capture(capsys, pg18, tmp_path / "a", "x", "--metrics", "nope:x")
    assert code == 2 and "--metrics" in err, err
    code, err = _capture(capsys, pg18, tmp_path / "b", "x", "--heartbeat", "0")
    assert code == 2 and "--heartbeat" in err, err


# --- failover slots -------------------------------------------------------------------------


def test_failover_slot_on_18(pg18, tmp_path, capsys):
    code, err = _capture(capsys, pg18, tmp_path / "a", "fo", "--create-slot", "--failover")
    assert code == 0, err
    assert _slot_row(pg18, "fo")["failover"] is True
    # an existing slot made without it: turned on
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('fo2', 'pgoutput')")
    assert _slot_row(pg18, "fo2")["failover"] is False
    code, err = _capture(capsys, pg18, tmp_path / "b", "fo2", "--failover")
    assert code == 0, err
    assert _slot_row(pg18, "fo2")["failover"] is True
    # the SQL interface creates one too
    code, err = _capture(
        capsys, pg18, tmp_path / "c", "fo3", "--create-slot", "--failover", "--sql"
    )
    assert code == 0, err
    assert _slot_row(pg18, "fo3")["failover"] is True
    code, err = _capture(capsys, pg18, tmp_path / "d", "fo4", "--create-slot", "--failover",
                         "--temporary")  # fmt: skip
    assert code == 2 and "--temporary" in err, err
    with pg18.connect() as conn:
        for s in ("fo", "fo2", "fo3"):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [s])


def test_failover_is_refused_before_17(pg15, tmp_path, capsys):
    for extra in ([], ["--sql"]):
        code, err = _capture(capsys, pg15, tmp_path / f"a{len(extra)}", "fo", "--create-slot",
                             "--failover", *extra)  # fmt: skip
        lines = [ln for ln in err.splitlines() if ": error:" in ln]
        assert code == 2 and len(lines) == 1 and "PostgreSQL 17" in lines[0], err
    with pg15.connect() as conn:
        assert not conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'fo'"
        ).fetchall()


def test_a_slot_near_invalidation_is_warned_of(pg18, tmp_path, capsys):
    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('near', 'pgoutput')")
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.3)
    try:
        code, err = _capture(capsys, pg18, tmp_path / "cap", "near")
    finally:
        with pg18.connect() as conn:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_drop_replication_slot('near')")
    assert code == 0, err
    warned = [ln for ln in err.splitlines() if "from being invalidated" in ln]
    assert len(warned) == 1 and "max_slot_wal_keep_size" in warned[0], err


def test_a_slot_invalidated_while_capturing_ends_the_capture(pg18, tmp_path):
    """The capture is stopped (SIGSTOP) with its walsender holding the slot; the server
    invalidates the slot, ending that walsender; the capture, continued, reconnects once and
    exits 2 with the line, rather than retrying forever."""
    import signal
    import subprocess
    import sys

    with pg18.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('live', 'pgoutput')")
    out = tmp_path / "cap"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc", "capture", "--dsn", pg18.conninfo(), "--slot", "live",
         "--publication", "pub", "--out", str(out), "--log-format", "json", "--no-fsync"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _insert(pg18, 90_000, 10)

        def streaming():
            assert proc.poll() is None
            return _slot_row(pg18, "live")["active_pid"] is not None and segments.read_state(out)

        until("the capture streaming from slot live", streaming)
        proc.send_signal(signal.SIGSTOP)
        _invalidate(pg18, "live")
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    errors = [e for e in events if e["level"] == "error"]
    assert proc.returncode == 2, err
    assert [e["event"] for e in errors] == ["slot_invalidated"], err
    assert errors[0]["reason"] == "wal_removed" and "re-snapshot" in errors[0]["message"]
    assert sum(1 for e in events if e["event"] == "reconnect") <= 1, err
    with pg18.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot('live')")
