"""A capture directory belongs to one server and one slot (PostgreSQL 18, two real servers).

Before this, ``pgcdc capture --out DIR`` resumed from DIR's LSN against whatever server it
reached: a second server with a slot and publication of the same names (or the same server
after a re-initdb) had its slot confirmed at another WAL's position and its pending changes
skipped for good; a slot dropped and re-created under the same name likewise. Now state.json
records the source (system identifier, timeline, database, slot) and ``capture`` refuses such a
resume before it streams anything, and ``apply`` refuses to mix sources.
"""

from __future__ import annotations

import json
import time

import pytest

from pgcdc.capture import segments
from pgcdc.cli import capture as cli
from pgcdc.capture.checks import SourceIdentity, check_resume
from pgcdc.capture.walsender import WalsenderConnection
from pgcdc.lsn import parse_lsn
from tests.postgres import servers


def _prepare(srv, rows: int, first: int = 1) -> None:
    with srv.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v text)")
        if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = 'pub'").fetchall():
            conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        if not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 's'").fetchall():
            conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute(
            f"INSERT INTO t SELECT g, 'v' || g FROM generate_series({first}, {first + rows - 1}) g"
        )


def _confirmed(srv, slot: str = "s") -> int | None:
    with srv.connect() as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            [slot],
        ).fetchone()
    return parse_lsn(row[0]) if row and row[0] else None


def _capture(capsys, srv, out, *extra: str) -> tuple[int, str]:
    code = cli.main(["--dsn", srv.conninfo(), "--slot", "s", "--publication", "pub",
                     "--out", str(out), "--idle-exit", "0.5", "--log-format", "text",
                     *extra])  # fmt: skip
    return code, capsys.readouterr().err


def _inserted_ids(directory) -> list[int]:
    from pgcdc.events.reader import read_captures

    return sorted(e.after[0] for e in read_captures([directory]) if e.op == "c")


@pytest.fixture(scope="module")
def two_servers():
    # servers of their own: two clusters (two system identifiers, so b is initdb'd afresh, not
    # copied from the cached cluster a is) are the point
    with servers.running_server("pg18") as a, servers.running_server("pg18", fresh=True) as b:
        yield a, b


@pytest.mark.parametrize("interface", ["walsender", "sql"])
def test_a_directory_does_not_resume_against_another_server(two_servers, tmp_path, capsys,
                                                            interface):  # fmt: skip
    a, b = two_servers
    extra = ["--sql"] if interface == "sql" else []
    first = 1 if interface == "walsender" else 1001
    _prepare(a, 10, first)
    out = tmp_path / "cap"
    code, err = _capture(capsys, a, out, *extra)
    assert code == 0, err
    source = segments.read_state(out).source
    with a.connect() as conn:
        (sysid,) = conn.execute(
            "SELECT system_identifier::text FROM pg_control_system()"
        ).fetchone()
    assert source["system_id"] == sysid and source["slot"] == "s"
    assert source["database"] == "postgres"
    # the second server: same slot and publication names, changes pending
    _prepare(b, 25, first)
    before = _confirmed(b)
    state_before = (out / segments.STATE_FILE).read_text()
    code, err = _capture(capsys, b, out, *extra)
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert code == 2, err
    assert len(lines) == 1 and f"system {sysid}" in lines[0] and "new --out" in lines[0], err
    assert _confirmed(b) == before  # the foreign slot did not move
    assert (out / segments.STATE_FILE).read_text() == state_before
    # and nothing of b's is lost: a new directory gets every pending change
    code, err = _capture(capsys, b, tmp_path / "b", *extra)
    assert code == 0, err
    assert _inserted_ids(tmp_path / "b") == list(range(first, first + 25))


def test_a_slot_recreated_under_the_same_name_is_refused(two_servers, tmp_path, capsys):
    a, _ = two_servers
    _prepare(a, 5, 2001)
    out = tmp_path / "cap"
    code, err = _capture(capsys, a, out)
    assert code == 0, err
    with a.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot('s')")
        conn.execute("INSERT INTO t VALUES (3000, 'lost')")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    recreated = _confirmed(a)
    code, err = _capture(capsys, a, out)
    assert code == 2 and "confirmed up to" in err and "consumed elsewhere" in err, err
    assert _confirmed(a) == recreated
    # a slot dropped and not re-created: --create-slot must not paper over the gap
    with a.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot('s')")
    code, err = _capture(capsys, a, out, "--create-slot")
    assert code == 2 and "does not exist any more" in err, err
    with a.connect() as conn:
        assert not conn.execute("SELECT 1 FROM pg_replication_slots").fetchall()
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")


def test_a_resume_point_ahead_of_the_server_is_refused(two_servers, tmp_path, capsys):
    """An old directory with no recorded source (made before pgcdc recorded one) is still
    checked by position: a resume point past the server's WAL end."""
    a, _ = two_servers
    _prepare(a, 3, 4001)
    out = tmp_path / "cap"
    code, err = _capture(capsys, a, out)
    assert code == 0, err
    doc = json.loads((out / segments.STATE_FILE).read_text())
    doc["source"] = None
    doc["lsn"] = "FF/0"
    (out / segments.STATE_FILE).write_text(json.dumps(doc))
    before = _confirmed(a)
    code, err = _capture(capsys, a, out)
    assert code == 2 and "ahead of this server's WAL end" in err, err
    assert _confirmed(a) == before


def test_the_checks_cost_little(two_servers, capsys):
    """The checks a resume makes (one query beyond IDENTIFY_SYSTEM), timed."""
    a, _ = two_servers
    _prepare(a, 1, 5001)
    resume = _confirmed(a)
    with WalsenderConnection.connect(a.conninfo()) as conn:
        start = time.perf_counter()
        n = 20
        for _ in range(n):
            info = conn.identify_system()
            here = SourceIdentity(info.system_id, info.timeline, info.dbname, "s")
            check_resume(conn.execute, "DIR", here, here, resume, info.xlogpos)
        ms = (time.perf_counter() - start) / n * 1000
    print(f"resume checks: {ms:.2f} ms per resume (with a confirmed_flush_lsn query)")
    assert ms < 1000


def test_apply_refuses_captures_of_two_sources(two_servers, tmp_path, capsys):
    a, b = two_servers
    _prepare(a, 2, 6001)
    _prepare(b, 2, 6001)
    code, err = _capture(capsys, a, tmp_path / "a")
    assert code == 0, err
    code, err = _capture(capsys, b, tmp_path / "b")
    assert code == 0, err
    from pgcdc.apply.state import SourceMismatch, one_source

    # one run given both
    with pytest.raises(SourceMismatch, match="one source per --out"):
        one_source([str(tmp_path / "a"), str(tmp_path / "b")], None, tmp_path / "out")
    # two runs: the state remembers its source
    recorded = one_source([str(tmp_path / "a")], None, tmp_path / "out")
    with pytest.raises(SourceMismatch, match="the applied state"):
        one_source([str(tmp_path / "b")], recorded, tmp_path / "out")
    assert one_source([str(tmp_path / "a")], recorded, tmp_path / "out") == recorded


def test_pgcdc_apply_exits_2_on_two_sources(two_servers, tmp_path, capsys):
    import subprocess
    import sys

    pytest.importorskip("pyspark")
    a, b = two_servers
    _prepare(a, 2, 7001)
    _prepare(b, 2, 7001)
    for name, srv in (("a", a), ("b", b)):
        code, err = _capture(capsys, srv, tmp_path / name)
        assert code == 0, err
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "pgcdc", "apply", str(tmp_path / "a"), "--out",
                          str(out), "--master", "local[1]"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    state = json.loads((out / "_pgcdc_state.json").read_text())
    assert state["source"]["slot"] == "s"
    run = subprocess.run([sys.executable, "-m", "pgcdc", "apply", str(tmp_path / "b"), "--out",
                          str(out), "--master", "local[1]"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "one source per --out" in run.stderr
    assert json.loads((out / "_pgcdc_state.json").read_text()) == state
