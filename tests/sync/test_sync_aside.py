"""``pgcdc sync`` (PostgreSQL 18, real Spark): one table's fault is that table's.

Table ``t2``'s Delta table is broken on purpose (a log entry that is not JSON: delta-rs cannot
open the table, as after a write cut short by another tool): sync sets it aside
(``table_set_aside``: the table, the reason, the remedy) while ``t`` goes on being applied,
``pgcdc status`` and the metrics show it, and stderr holds no traceback (the whole error is in
``DIR/_sync.log``). Then the cause is removed and ``pgcdc resnapshot`` asks for its snapshot:
the running sync takes it at its next tables check, while ``t`` goes on, and ``t2`` equals
the server's again. With each engine. And a rerun after SIGKILL keeps the table set aside; a
snapshot asked for while no sync runs is taken by the next run.

Without a server: the search for the tables at fault (halves, then halves of halves), and
the ends of it (nobody's fault), the resnapshot command's refusals, and an unexpected error
as one line with its traceback in the log file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest

from tests.support.sync import QUICK_CHECKS, Sync  # noqa: E402
from tests.support.sync_added import _converge  # noqa: E402
from tests.wait import until  # noqa: E402

BOGUS = "00000000000000009999.json"  # no version of the table: only its name matters


def _break(out) -> object:
    """A log entry delta-rs cannot read in t2's Delta table: opening it fails. Returns the
    entry (removing it is the fix)."""
    log = out / "public.t2" / "_delta_log"
    newest = max(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    bad = log / f"{newest + 1:020d}.json"
    bad.write_text("not a Delta log entry\n")
    return bad


def _stderr(sync: Sync) -> str:
    return "".join(sync.other) + "\n".join(json.dumps(e) for e in sync.events)


def _pgcdc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", *args], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _status(out) -> dict:
    done = _pgcdc("status", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _metrics(sync: Sync) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    address = sync.wait_for("metrics")["address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, s.labels.get("table")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.labels.get("component") == "sync"
    }


def _writes(conn, start: int, n: int = 50) -> None:
    conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(%s::int, %s::int) g",
                 [start, start + n - 1])  # fmt: skip
    conn.execute("UPDATE t2 SET v = %s WHERE id %% 5 = 0", [f"u{start}"])
    conn.execute("INSERT INTO t2 VALUES (%s, 'new')", [start])


def _drop_slot(conn, slot: str) -> None:
    until(f"slot {slot} inactive",
          lambda: conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                               [slot]).fetchone() != (True,))  # fmt: skip
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                 " WHERE slot_name = %s", [slot])  # fmt: skip


@pytest.fixture(scope="module")
def server(pg):
    pytest.importorskip("pyspark")
    pytest.importorskip("deltalake")
    with pg.database("pg18") as srv, srv.connect() as conn:
        for table, n in (("t", 300), ("t2", 100)):
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {table} SELECT g, 'a' || g FROM generate_series(1, {n}) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t, t2")
        yield srv, conn


@pytest.mark.parametrize("engine", ["streaming", "loop"])
def test_a_table_that_cannot_be_applied_is_set_aside_and_taken_up_again(server, tmp_path, engine):
    srv, conn = server
    out = tmp_path / "sync"
    slot = f"aside_{engine}"
    base = {"streaming": 100_000, "loop": 200_000}[engine]
    sync = Sync(srv, out, *QUICK_CHECKS, "--metrics", "0", "--engine", engine, slot=slot)
    try:
        sync.wait_for("ready")
        _converge(conn, out, sync, "t2")
        bad = _break(out)
        _writes(conn, base)
        said = sync.wait_for("table_set_aside")
        assert said["table"] == "public.t2" and said["level"] == "error", sync.log()
        assert "Json" in said["reason"], said
        assert f"pgcdc resnapshot --out {out} public.t2" in said["message"], said
        assert str(out / "_sync.log") in said["message"], said
        # t goes on, its applied position with it, through more changes of both
        _converge(conn, out, sync, "t")
        _writes(conn, base + 1000)
        _converge(conn, out, sync, "t")
        assert len(sync.named("table_set_aside")) == 1, sync.log()

        doc = _status(out)
        aside = doc["apply"]["set_aside"]["public.t2"]
        assert "Json" in aside["reason"] and not aside["requested"], doc
        assert doc["apply"]["tables"]["public.t2"]["set_aside"], doc
        assert any("public.t2 is set aside" in w for w in doc["warnings"]), doc
        text = _pgcdc("status", str(out)).stdout
        assert "set aside" in text, text
        got = _metrics(sync)
        assert got[("pgcdc_table_set_aside", "public.t2")] == 1, got
        assert got[("pgcdc_tables_set_aside", None)] == 1, got
        assert "Json" in (out / "_sync.log").read_text()
        assert "Traceback" not in _stderr(sync), _stderr(sync)

        # fixed; its snapshot asked for while sync runs, and t written meanwhile
        bad.unlink()
        asked = _pgcdc("resnapshot", "--out", str(out), "public.t2")
        assert asked.returncode == 0, asked.stderr
        assert "running sync takes it" in asked.stderr, asked.stderr
        stop = threading.Event()

        def workload():
            with srv.connect() as c:
                i = base + 2000
                while not stop.is_set():
                    c.execute("INSERT INTO t VALUES (%s, 'during')", [i])
                    i += 1
                    time.sleep(0.05)

        writer = threading.Thread(target=workload)
        writer.start()
        try:
            sync.wait_for("table_taken_up", 120)
        finally:
            stop.set()
            writer.join()
        _writes(conn, base + 5000)
        _converge(conn, out, sync, "t2")
        _converge(conn, out, sync, "t")
        names = [e["event"] for e in sync.events]
        first, back = names.index("table_set_aside"), names.index("table_taken_up")
        applied_t = [i for i, e in enumerate(sync.events)
                     if e["event"] == "apply" and "public.t" in e["tables"]]  # fmt: skip
        assert any(first < i < back for i in applied_t), sync.log()  # t never stopped
        assert "set_aside" not in _status(out)["apply"], _status(out)
        got = _metrics(sync)
        assert ("pgcdc_table_set_aside", "public.t2") not in got, got
        assert got[("pgcdc_tables_set_aside", None)] == 0, got
        assert not list((out / "_resnapshot").iterdir())
        assert sync.stop() == 0, sync.log()
        assert "Traceback" not in _stderr(sync), _stderr(sync)
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        _drop_slot(conn, slot)


def test_a_rerun_keeps_a_table_set_aside_and_takes_a_snapshot_asked_for_meanwhile(server, tmp_path):
    srv, conn = server
    out = tmp_path / "sync"
    sync = Sync(srv, out, *QUICK_CHECKS, slot="aside_kill")
    try:
        sync.wait_for("ready")
        _converge(conn, out, sync, "t2")
        bad = _break(out)
        _writes(conn, 300_000)
        sync.wait_for("table_set_aside")
        assert sync.stop(signal.SIGKILL) == -signal.SIGKILL
        assert "public.t2" in _status(out)["apply"]["set_aside"]  # recorded, whatever came
        _writes(conn, 301_000)

        # fixed and asked for while no sync runs: the next run says it is set aside, does
        # not try it again, and takes the snapshot asked for
        bad.unlink()
        asked = _pgcdc("resnapshot", "--out", str(out), "public.t2")
        assert asked.returncode == 0 and "the next run takes it" in asked.stderr, asked.stderr
        assert _status(out)["apply"]["set_aside"]["public.t2"]["requested"]
        sync = Sync(srv, out, *QUICK_CHECKS, slot="aside_kill")
        said = sync.wait_for("table_set_aside")  # said at the start: still aside
        assert said["table"] == "public.t2" and "since" in said["message"], sync.log()
        _writes(conn, 302_000)
        sync.wait_for("table_taken_up", 120)
        _converge(conn, out, sync, "t2")
        _converge(conn, out, sync, "t")
        assert not sync.named("apply_search"), sync.log()  # t2 was not tried meanwhile
        assert sync.stop() == 0, sync.log()
        assert "set_aside" not in _status(out)["apply"]
        assert "Traceback" not in _stderr(sync), _stderr(sync)
    finally:
        if sync.proc.poll() is None:
            sync.stop(signal.SIGKILL)
        _drop_slot(conn, "aside_kill")


# --- without a server ----------------------------------------------------------------------------


def _searched(tables: list[str], at_fault, stop=None):
    """aside._culprits over ``tables`` with a run that fails while any table of
    ``at_fault(applied)`` is applied; (what it found, the parts it ran)."""
    from pgcdc.sync import aside

    runs = []

    def run(aside, hold=False):
        assert hold  # the parts never move the summary's applied position
        applied = [t for t in tables if t not in aside]
        runs.append(applied)
        if at_fault(applied):
            raise RuntimeError(f"{at_fault(applied)} failed")

    sync = SimpleNamespace(aside=SimpleNamespace(names=frozenset()),
                           stopper=SimpleNamespace(requested=False))  # fmt: skip
    return aside._culprits(sync, run, tables), runs


def test_the_tables_at_fault_are_found_by_halves():
    tables = [f"public.t{i:02d}" for i in range(64)]
    bad = {"public.t03", "public.t41"}
    found, runs = _searched(tables, lambda applied: sorted(bad & set(applied)))
    assert sorted(found) == sorted(bad)
    assert runs[0] == []  # first the captures alone, every table passed over
    assert runs[1] == tables  # then all, then halves: a path of 5 pairs down to each culprit
    assert len(runs) == 2 + 2 + 2 * 2 * 5, runs


def test_a_failure_that_is_no_tables_own_sets_none_aside():
    tables = [f"public.t{i}" for i in range(4)]
    # the captures fail to read whatever is applied: nobody's table
    found, runs = _searched(tables, lambda applied: ["reading"])
    assert found is None and len(runs) == 1
    # every table fails alone (a place that takes no write): not one table's fault
    found, _ = _searched(tables, lambda applied: applied)
    assert found is None
    # one table of one, failing alone: its own
    found, _ = _searched(tables[:1], lambda applied: applied)
    assert list(found) == ["public.t0"]


def test_a_table_passed_over_has_no_value_loaded():
    """A run that applies some tables only loads none of the others' values
    (``RelationCache(passed_over=...)``): one of theirs that does not load stops nothing."""
    import pgoutput_codec as pgc

    from pgcdc.events.relations import RelationCache
    from pgcdc.values import ValueLoadError

    enum = 70_001  # not built in, and no catalog says what it is: its values do not load
    cache = RelationCache(passed_over=frozenset({"public.b"}))
    column = pgc.RelationColumn(flags=1, name="mood", type_oid=enum, type_modifier=-1)
    a, b = (cache.on_relation(pgc.Relation(xid=None, relation_oid=oid, namespace="public",
                                           relation_name=name, replica_identity=ord("d"),
                                           columns=[column]))
            for oid, name in ((1, "a"), (2, "b")))  # fmt: skip
    value = [pgc.TupleColumn(kind="t", value=b"happy")]
    with pytest.raises(ValueLoadError, match="not built in"):
        a.loader.load(value)
    assert b.loader.load(value) == (None,)
    assert b.loader.load_lenient(value) == ((None,), [])


def test_resnapshot_asks_only_for_tables_a_sync_directory_holds(tmp_path):
    not_sync = _pgcdc("resnapshot", "--out", str(tmp_path), "public.t")
    assert not_sync.returncode == 2 and "not a pgcdc sync directory" in not_sync.stderr
    (tmp_path / "_capture").mkdir()
    (tmp_path / "_pgcdc_state.json").write_text(json.dumps({"tables": {"public.t": {}}}))
    (tmp_path / "_set_aside.json").write_text(json.dumps({"public.u": {"reason": "broken"}}))
    unknown = _pgcdc("resnapshot", "--out", str(tmp_path), "public.nope")
    assert unknown.returncode == 2, unknown.stderr
    assert "public.nope" in unknown.stderr and "public.t, public.u" in unknown.stderr
    ok = _pgcdc("resnapshot", "--out", str(tmp_path), "public.u", "public.t")
    assert ok.returncode == 0, ok.stderr
    assert "(set aside: broken)" in ok.stderr and "the next run takes it" in ok.stderr
    from pgcdc.status import resnapshot_requests, set_aside

    assert sorted(resnapshot_requests(tmp_path)) == ["public.t", "public.u"]
    assert set_aside(tmp_path)["public.u"]["requested"] is True


def test_an_unexpected_error_is_one_line_and_its_traceback_is_in_the_log_file(
    tmp_path, monkeypatch, capfd
):
    import logging

    pytest.importorskip("pyspark")
    from pgcdc.cli import sync as cli
    from pgcdc.sync import pipeline

    # what the command sets for the process, restored for the tests after this one
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.setattr(logging.getLogger(), "handlers", list(logging.getLogger().handlers))

    def broken(self):
        raise KeyError("something nobody foresaw")

    monkeypatch.setattr(pipeline.Sync, "run", broken)
    code = cli.main(["--publication", "p", "--slot", "s", "--out", str(tmp_path),
                     "--log-format", "text"])  # fmt: skip
    err = capfd.readouterr().err
    assert code == 1
    (line,) = err.strip().splitlines()
    assert "unexpected error" in line and "something nobody foresaw" in line, line
    assert str(tmp_path / "_sync.log") in line and "Traceback" not in err
    logged = (tmp_path / "_sync.log").read_text()
    assert "Traceback (most recent call last)" in logged and "def broken" not in logged
    assert "in broken" in logged
