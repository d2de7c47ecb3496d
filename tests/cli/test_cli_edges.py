"""The command line's edges, as a new user meets them: first connections that fail, passwords,
--version and --help, a closed pipe, a failed demo start, Ctrl-C during a Spark run, and the
line every command ends with. Real servers and real processes throughout."""

from __future__ import annotations

import contextlib
import argparse
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pgoutput_codec as pgc
from pgcdc.cli import COMMANDS
from tests.postgres import servers
from tests.wait import until, WaitTimeout  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = sorted((ROOT / "tests" / "captures" / "pg18").glob("proto1-text*walsender*"))[0]


def _pgcdc(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the test connects


def _capture_args(dsn: str, tmp_path) -> list[str]:
    return ["capture", "--dsn", dsn, "--slot", "s", "--publication", "p",
            "--out", str(tmp_path / "cap"), "--log-format", "text"]  # fmt: skip


@pytest.mark.parametrize("extra", [[], ["--sql"]])
def test_a_refused_first_connection_gives_up(tmp_path, extra):
    start = time.monotonic()
    run = _pgcdc(*_capture_args(f"host=127.0.0.1 port={_closed_port()} user=x", tmp_path),
                 "--idle-exit", "1", *extra, timeout=60)  # fmt: skip
    took = time.monotonic() - start
    errors = [ln for ln in run.stderr.splitlines() if ": error:" in ln]
    assert run.returncode == 2, run.stderr
    assert len(errors) == 1 and "refused" in errors[0] and "3 attempts" in errors[0], run.stderr
    assert took < 30 and "Traceback" not in run.stderr


def test_an_unknown_host_fails_at_once(tmp_path):
    run = _pgcdc(*_capture_args("host=nonexistent.invalid user=x connect_timeout=5", tmp_path))
    errors = [ln for ln in run.stderr.splitlines() if ": error:" in ln]
    assert run.returncode == 2 and len(errors) == 1, run.stderr
    assert "nonexistent.invalid" in errors[0] and "Traceback" not in run.stderr


def _processes_with(marker: str) -> list[str]:
    """The command lines of the processes whose environment holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue
    return [c.decode(errors="replace") for c in found]


def test_sync_refused_at_its_set_up_leaves_no_capture_process(tmp_path):
    """sync starts its capture process before it asks the server anything (it imports
    meanwhile): when the set-up then fails, that process ends with it."""
    marker = f"PGCDC_TEST_MARK={os.getpid()}_{time.monotonic_ns()}"
    name, value = marker.split("=")
    run = _pgcdc("sync", "--dsn", "host=nonexistent.invalid user=x connect_timeout=5",
                 "--publication", "p", "--slot", "s", "--out", str(tmp_path / "out"),
                 "--log-format", "text", env={**os.environ, name: value})  # fmt: skip
    errors = [ln for ln in run.stderr.splitlines() if ": error:" in ln]
    assert run.returncode == 2 and len(errors) == 1, run.stderr
    assert "nonexistent.invalid" in errors[0] and "Traceback" not in run.stderr
    assert _processes_with(marker) == []


@pytest.fixture(scope="module")
def password_server():
    """A server where role ``pw`` must give a password (scram) over TCP."""
    # a server of its own: its pg_hba.conf is rewritten (password logins)
    with servers.running_server("pg18") as srv:
        with srv.connect() as conn:
            conn.execute("CREATE ROLE pw LOGIN REPLICATION PASSWORD 'right'")
        hba = srv.datadir / "pg_hba.conf"
        hba.write_text("host all pw 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        with srv.connect() as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield srv


def _dsn(srv, **extra) -> str:
    parts = {"host": "127.0.0.1", "port": str(srv.port), "user": "pw", "dbname": "postgres"}
    parts.update(extra)
    return " ".join(f"{k}={v}" for k, v in parts.items())


def test_wrong_and_missing_passwords_have_their_own_hints(password_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "PGPASSFILE")}
    env["PGPASSFILE"] = str(tmp_path / "none")
    wrong = _pgcdc(*_capture_args(_dsn(password_server, password="wrong"), tmp_path), env=env)
    missing = _pgcdc(*_capture_args(_dsn(password_server), tmp_path), env=env)
    assert wrong.returncode == missing.returncode == 2
    assert "password is wrong" in wrong.stderr and "none was given" not in wrong.stderr
    assert "none was given" in missing.stderr and "password is wrong" not in missing.stderr
    assert "wrong" not in wrong.stderr.split("password is wrong")[0].split("(")[1]  # masked
    for run in (wrong, missing):
        assert len([ln for ln in run.stderr.splitlines() if ": error:" in ln]) == 1


def test_version():
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        run = _pgcdc(flag)
        assert run.returncode == 0 and run.stdout == f"pgcdc {version('pgcdc')}\n"


def _parsers():
    """Every subcommand's argparse parser, found by running its main with --help captured."""
    found = {}
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        found[self.prog] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = grab
    try:
        for name, (module, _) in COMMANDS.items():
            try:
                importlib.import_module(module).main(["--help"])
            except SystemExit:
                pass
    finally:
        argparse.ArgumentParser.parse_args = real
    return found


def test_every_option_has_help_and_no_markup():
    parsers = _parsers()
    assert set(parsers) == {f"pgcdc {name}" for name in COMMANDS}
    bare = []
    for prog, p in parsers.items():
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if not (action.help or "").strip():
                bare.append(f"{prog} {'/'.join(action.option_strings) or action.dest}")
        text = p.format_help()
        assert "``" not in text, f"{prog} --help shows rst markup"
    assert not bare, f"options without help: {bare}"
    assert "stop (stop the server" in parsers["pgcdc demo"].format_help()


def test_sync_durations_are_read_with_their_units_and_must_be_positive(tmp_path):
    from pgcdc.cli.sync import build_parser

    base = ["--publication", "p", "--slot", "s", "--out", str(tmp_path)]
    args = build_parser().parse_args(base)
    assert (args.trigger, args.tables_check) == (5.0, 30.0)  # the defaults --help gives
    args = build_parser().parse_args([*base, "--trigger", "500ms", "--tables-check", "2m"])
    assert (args.trigger, args.tables_check) == (0.5, 120.0)
    for bad in ("0", "0ms", "soon"):
        done = _pgcdc("sync", *base, "--tables-check", bad)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()  # one line, naming the option
        assert "--tables-check" in line and repr(bad) in line, line


def test_a_closed_pipe_is_quiet():
    for cmd in (f"{sys.executable} -m pgcdc -h | head -1",
                f"{sys.executable} -m pgcdc changes {CAPTURE} | head -1"):  # fmt: skip
        run = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
        assert run.stdout.count("\n") == 1
        assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr


def test_changes_ends_with_a_summary():
    run = _pgcdc("changes", str(CAPTURE))
    events = run.stdout.count("\n")
    assert run.returncode == 0
    assert f"pgcdc changes: {events:,} events from" in run.stderr.splitlines()[-1]


def test_a_failed_demo_start_cleans_up(tmp_path, monkeypatch):
    from pgcdc import demo

    def broken(*a, **k):
        raise demo.DemoError("the workload failed (on purpose)")

    monkeypatch.setattr(demo, "workload", broken)
    with pytest.raises(demo.DemoError):
        demo.start(tmp_path / "d")
    assert not (tmp_path / "d" / "demo.json").exists()
    monkeypatch.undo()
    started = demo.start(tmp_path / "d")  # the next start works
    try:
        assert (tmp_path / "d" / "demo.json").exists()
    finally:
        demo.stop(tmp_path / "d")
    assert not Path(started.home).exists()


def _big_capture(path: Path, txns: int = 600, rows: int = 2000) -> None:
    """A capture of ``txns`` transactions of ``rows`` inserts each, encoded by the codec."""
    col = pgc.RelationColumn
    rel = pgc.Relation(relation_oid=16384, namespace="public", relation_name="big",
                       replica_identity=ord("d"), columns=(col(flags=1, name="id", type_oid=23,
                       type_modifier=-1), col(flags=0, name="v", type_oid=25,
                       type_modifier=-1)))  # fmt: skip
    pairs = []
    lsn = 0x10000000  # past the small capture's LSNs
    enc = pgc.encode
    for t in range(txns):
        pairs.append((lsn, enc(pgc.Begin(final_lsn=lsn + rows + 1, commit_time=0, xid=1000 + t),
                               protocol_version=1)))  # fmt: skip
        if t == 0:
            pairs.append((0, enc(rel, protocol_version=1)))
        for r in range(rows):
            i = t * rows + r
            tup = pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=str(i).encode()),
                                         pgc.TupleColumn(kind="t", value=b"x" * 20)))  # fmt: skip
            pairs.append((lsn + r + 1, enc(pgc.Insert(relation_oid=16384, new_tuple=tup),
                                           protocol_version=1)))  # fmt: skip
        pairs.append((lsn + rows + 1, enc(pgc.Commit(flags=0, commit_lsn=lsn + rows + 1,
                     end_lsn=lsn + rows + 2, commit_time=0), protocol_version=1)))  # fmt: skip
        lsn += rows + 10
    pgc.capture.write(path, pgc.capture.from_payloads(pairs, protocol_version=1))


def test_ctrl_c_during_apply_is_one_line_and_130(tmp_path):
    pytest.importorskip("pyspark")
    cap = tmp_path / "big.pgcap"
    _big_capture(cap)
    out = tmp_path / "out"
    # a first run over a small capture: the state a Ctrl-C must leave as it is
    first = _pgcdc("apply", str(CAPTURE), "--out", str(out), "--master", "local[2]", timeout=300)
    assert first.returncode == 0, first.stderr
    assert "pgcdc apply:" in first.stderr.splitlines()[-1]
    state = (out / "_pgcdc_state.json").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "pgcdc", "apply", str(cap), "--out", str(out),
                             "--master", "local[2]", "--split-records", "20000"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    started = out / "public.big"  # the Delta table's directory: made once its writes start
    with contextlib.suppress(WaitTimeout):
        until("the Delta table's directory", lambda: started.exists() or proc.poll() is not None,
              180, 0.05)  # fmt: skip
    time.sleep(1)  # its tasks under way (they take several seconds more)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "py4j" not in err.lower(), err
    assert err.strip().splitlines()[-1].startswith("pgcdc apply: interrupted"), err
    assert (out / "_pgcdc_state.json").read_text() == state
    assert json.loads(state)["applied_lsn"]


def test_apply_without_captures_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    run = _pgcdc("apply", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert run.returncode == 2 and "no capture records" in run.stderr, run.stderr


def _on_a_tty(argv: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run ``argv`` with its stderr on a pseudo-terminal; its return code and what it showed."""
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    shown = bytearray()

    def read():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the other side closed
                return
            if not data:
                return
            shown.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = proc.wait(timeout=timeout)
    reader.join(5)
    os.close(master)
    return code, shown.decode(errors="replace")


def test_apply_shows_progress_on_a_tty(tmp_path):
    pytest.importorskip("pyspark")
    cap = tmp_path / "big.pgcap"
    _big_capture(cap, txns=300)
    code, shown = _on_a_tty([sys.executable, "-m", "pgcdc", "apply", str(cap), "--out",
                             str(tmp_path / "out"), "--master", "local[2]",
                             "--split-records", "20000"])  # fmt: skip
    assert code == 0, shown
    lines = [ln for ln in shown.split("\r") if "units done" in ln]
    assert lines, shown
    assert any("rows written" in ln and "rows/s" in ln for ln in lines), lines
    # the last line, once Spark is through, counts every row the write stage wrote: the
    # tasks that ended after the last look at a running stage count too
    final = [ln for ln in shown.split("\r") if "all units done" in ln]
    assert final and "600,000 rows written" in final[-1], lines
    assert "pgcdc apply: 1 table(s) written, 600,000 rows" in shown


def test_ctrl_c_during_snapshot_is_one_line_and_130(pg, tmp_path):
    pytest.importorskip("pyspark")
    with pg.database("pg18") as srv:
        with srv.connect() as conn:
            conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO big SELECT g, repeat('x', 40) FROM "
                         "generate_series(1, 3000000) g")  # fmt: skip
            conn.execute("CREATE PUBLICATION pub FOR TABLE big")
        out = tmp_path / "snap"
        proc = subprocess.Popen([sys.executable, "-m", "pgcdc", "snapshot", "--dsn",
                                 srv.conninfo(), "--slot", "s", "--publication", "pub",
                                 "--out", str(out), "--blocks-per-range", "256"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        with contextlib.suppress(WaitTimeout):  # until Spark's tasks write their first files
            until("the snapshot's first files", lambda: proc.poll() is not None
                  or (out.exists() and any(p.is_file() for p in out.rglob("*"))), 180, 0.05)  # fmt: skip
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        stdout, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "py4j" not in err.lower(), err
        assert err.strip().splitlines()[-1].startswith("pgcdc snapshot: interrupted"), err
        assert not (out / "_snapshot.json").exists() and stdout == ""
