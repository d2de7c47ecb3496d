"""apply into Delta Lake tables (PostgreSQL 18, the two-phase workload of test_apply_runs),
read back by readers that are not pgcdc's: delta-rs and DuckDB's delta extension.

- readers: after two incremental runs every table, read by delta-rs and by DuckDB, equals
  the server's; time travel to the previous version gives phase 1's state; each table's
  commit carries the applied commit LSN (application transaction and commit metadata);
- a run that dies between two tables' commits (the commit of the second table raises)
  leaves the first table at its new version and the others at their old ones, each
  consistent; a re-run skips the first (no new version) and completes the others;
- ``pgcdc apply`` SIGKILLed while it commits: every table reads as phase 1 or phase 2,
  never a mix, and a re-run converges;
- only the files that hold a changed key are rewritten (one keyed table in key-range
  files); SCD2 appends new history;
- the snapshot's helper (:func:`pgcdc.apply.delta.commit_parquet_dir`) turns Parquet files
  Spark wrote into a Delta table that apply starts from.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deltalake")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from deltalake import DeltaTable  # noqa: E402

from pgcdc.lsn import format_lsn, parse_lsn  # noqa: E402
from pgcdc.apply import delta  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from tests.support.delta import duckdb_connect, duckdb_table, read_table  # noqa: E402
from tests.support.apply_model import NAMES, TABLE, reference, write_capture  # noqa: E402
from tests.support.apply_runs import REPO, TABLES  # noqa: E402
from tests.support.truth import _rows_of  # noqa: E402
from tests.wait import until  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _state_is(out: Path, truth: dict, label: str, tables=TABLES) -> None:
    for t in tables:
        expected, rows = truth[t]
        assert _rows_of(DeltaTable(str(out / f"public.{t}")).to_pyarrow_table(), rows) == (
            expected
        ), f"{label}: {t} (delta-rs)"


def test_readers_and_time_travel(runs, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out, split_records=200)
    first = {t: DeltaTable(str(out / f"public.{t}")).version() for t in TABLES}
    apply_changes(spark, [str(runs["cap"])], out, split_records=200)
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    con = duckdb_connect()
    for t in TABLES:
        path = out / f"public.{t}"
        expected, rows = runs["truth2"][t]
        dt = DeltaTable(str(path))
        assert _rows_of(dt.to_pyarrow_table(), rows) == expected, f"{t}: delta-rs"
        assert _rows_of(duckdb_table(path, con), rows) == expected, f"{t}: DuckDB delta_scan"
        # the commit carries the applied position
        assert dt.transaction_version(delta.APP_ID) == parse_lsn(doc["applied_lsn"])
        info = dt.history(1)[0]
        assert info["pgcdc.commit_lsn"] == doc["applied_lsn"]
        assert isinstance(info["pgcdc.tx_ordinal"], int) and info["pgcdc.tx_ordinal"] >= 1
        # time travel: the version before this run is phase 1's state
        assert dt.version() > first[t]
        old = DeltaTable(str(path), version=first[t]).to_pyarrow_table()
        expected1, rows1 = runs["truth1"][t]
        assert _rows_of(old, rows1) == expected1, f"{t}: version {first[t]}"
        assert doc["tables"][f"public.{t}"]["version"] == dt.version()


class _Died(BaseException):
    """Stands for the process dying (not an Exception: nothing may catch it)."""


def test_run_dying_between_two_tables_commits(runs, spark, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out)
    state1 = (out / "_pgcdc_state.json").read_text()
    v1 = {t: DeltaTable(str(out / f"public.{t}")).version() for t in TABLES}
    real = delta.commit
    done = []

    def commit_then_die(uri, *a, **kw):
        if done:  # the second table's commit: the process dies before it
            raise _Died()
        done.append(uri)
        return real(uri, *a, **kw)

    monkeypatch.setattr(delta, "commit", commit_then_die)
    with pytest.raises(_Died):
        apply_changes(spark, [str(runs["cap"])], out)
    monkeypatch.setattr(delta, "commit", real)
    # tables commit in name order: acct moved on, bag and note did not; each is consistent
    assert done == [str(out / "public.acct")]
    assert (out / "_pgcdc_state.json").read_text() == state1  # written after every table
    v_mid = {t: DeltaTable(str(out / f"public.{t}")).version() for t in TABLES}
    assert v_mid == {**v1, "acct": v1["acct"] + 1}
    _state_is(out, runs["truth2"], "dead run", ["acct"])
    _state_is(out, runs["truth1"], "dead run", ["bag", "note"])
    acct = DeltaTable(str(out / "public.acct"))
    behind = DeltaTable(str(out / "public.bag")).transaction_version(delta.APP_ID)
    assert acct.transaction_version(delta.APP_ID) > behind
    # the re-run: acct is skipped (ahead), the others get what they miss
    report = apply_changes(spark, [str(runs["cap"])], out)
    assert set(report) == {"public.bag", "public.note"}
    assert DeltaTable(str(out / "public.acct")).version() == v_mid["acct"]
    _state_is(out, runs["truth2"], "after the re-run")
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    for t in TABLES:
        dt = DeltaTable(str(out / f"public.{t}"))
        assert dt.transaction_version(delta.APP_ID) == parse_lsn(doc["applied_lsn"])
    assert apply_changes(spark, [str(runs["cap"])], out) == {}


def test_sigkilled_apply_leaves_consistent_tables(runs, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    apply_changes(spark, [str(runs["cap1"])], out)
    logs = [out / f"public.{t}" / "_delta_log" for t in TABLES]
    before = {p: len(list(p.glob("*.json"))) for p in logs}
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc", "apply", str(runs["cap"]), "--out", str(out),
         "--master", "local[2]"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:

        def new_version():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            return any(len(list(p.glob("*.json"))) > before[p] for p in logs)

        until("a new Delta version", new_version, 240, 0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-run
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    for t in TABLES:  # each table is at phase 1 or at phase 2, never between
        expected2, rows2 = runs["truth2"][t]
        expected1, rows1 = runs["truth1"][t]
        got = _rows_of(DeltaTable(str(out / f"public.{t}")).to_pyarrow_table(), rows2)
        assert got in (expected1, expected2), t
    apply_changes(spark, [str(runs["cap"])], out)
    _state_is(out, runs["truth2"], "after the re-run")


def _add_remove(path: Path, version: int) -> tuple[list, list]:
    lines = (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    actions = [json.loads(x) for x in lines]
    return [a["add"] for a in actions if "add" in a], [
        a["remove"] for a in actions if "remove" in a
    ]


def test_only_files_holding_changed_keys_are_rewritten(spark, tmp_path, monkeypatch):  # noqa: F811
    """A table's first write from the captures is the window's hash partitions; the first run
    that rewrites them writes key ranges (100 rows a file here), and from then on a run that
    changes some keys removes only the files holding them."""
    from pgcdc.apply import run as apply_mod

    monkeypatch.setattr(apply_mod, "TARGET_FILE_ROWS", 100)
    out = tmp_path / "out"
    path = out / TABLE
    load = [[("I", k, f"a{k}", f"b{k}", k) for k in range(400)]]
    again = [[("U", k, "x", "y", k) for k in range(0, 400, 50)]]
    change = [[("U", 7, "A", "B", -7), ("D", 11), ("I", 1000, "new", None, 0)]]
    steps = [load, load + again, load + again + change]
    for n, txns in enumerate(steps):
        write_capture(tmp_path / f"c{n}.pgcap", txns)
    apply_changes(spark, [str(tmp_path / "c0.pgcap")], out)
    apply_changes(spark, [str(tmp_path / "c1.pgcap")], out)
    files = DeltaTable(str(path)).file_uris()
    assert len(files) >= 3  # key ranges: about one file per 100 rows
    apply_changes(spark, [str(tmp_path / "c2.pgcap")], out)
    adds, removes = _add_remove(path, 2)
    assert len(removes) == 1 and len(adds) >= 1  # the file holding keys 7 and 11, only
    kept = set(files) - {str(path / removes[0]["path"])}
    assert len(kept) == len(files) - 1 and kept <= set(DeltaTable(str(path)).file_uris())
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    want = {k: row for k, (row, _c, _o) in reference(steps[-1]).items()}
    assert {r["id"]: {n: r[n] for n in NAMES} for r in rows} == want
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    entry = doc["tables"][TABLE]
    assert entry["files_removed"] == 1 and entry["bytes_removed"] < sum(
        os.path.getsize(f) for f in files
    )
    # the same run with rewrite="table" replaces every file
    out2 = tmp_path / "out2"
    apply_changes(spark, [str(tmp_path / "c1.pgcap")], out2)
    before = len(DeltaTable(str(out2 / TABLE)).file_uris())
    apply_changes(spark, [str(tmp_path / "c2.pgcap")], out2, rewrite="table")
    _adds, removes2 = _add_remove(out2 / TABLE, 1)
    assert len(removes2) == before


def test_scd2_appends_history(spark, tmp_path, monkeypatch):  # noqa: F811
    """SCD2: a run adds the new versions and rewrites only the files holding the current
    rows it closes."""
    from pgcdc.apply import run as apply_mod

    monkeypatch.setattr(apply_mod, "TARGET_FILE_ROWS", 100)
    out = tmp_path / "out"
    load = [[("I", k, f"a{k}", None, k) for k in range(300)]]
    again = [[("U", k, "x", None, k) for k in range(0, 300, 50)]]
    change = [[("U", 5, "A", "B", 1)], [("D", 6)]]
    for n, txns in enumerate([load, load + again, load + again + change]):
        write_capture(tmp_path / f"c{n}.pgcap", txns)
        apply_changes(spark, [str(tmp_path / f"c{n}.pgcap")], out, scd=2)
    rows = DeltaTable(str(out / TABLE)).to_pyarrow_table().to_pylist()
    assert len(rows) == 300 + 6 + 1  # first versions, the 6 updated keys', key 5's second
    five = sorted((r for r in rows if r["id"] == 5), key=lambda r: r["_valid_from_lsn"])
    assert [r["_is_current"] for r in five] == [False, True]
    assert five[0]["_valid_to_lsn"] == five[1]["_valid_from_lsn"]
    six = [r for r in rows if r["id"] == 6]
    assert len(six) == 1 and not six[0]["_is_current"] and six[0]["_valid_to_lsn"] is not None
    files = DeltaTable(str(out / TABLE), version=1).file_uris()
    _adds, removes = _add_remove(out / TABLE, 2)
    assert len(files) >= 3 and 1 <= len(removes) < len(files)


def _snapshot_of_50(session, tmp_path):
    """A snapshot of TABLE (ids 0-49) at 0x20000, committed as Delta, and a capture after it:
    id 3 updated and 100 inserted in one transaction, id 4 deleted in the next."""
    from pyspark.sql import functions as F

    snap = tmp_path / "snapshot"
    table = snap / TABLE
    point = 0x20000  # before the capture's first commit
    df = session.range(0, 50).select(
        F.col("id").cast("int").alias("id"),
        F.concat(F.lit("s"), F.col("id").cast("string")).alias("a"),
        F.lit(None).cast("string").alias("b"),
        F.col("id").cast("int").alias("c"),
        F.lit(None).cast("map<string,string>").alias("_pg_text"),
        F.lit(point).cast("long").alias("_commit_lsn"),
        F.lit(0).cast("long").alias("_tx_ordinal"),
    )
    df.write.parquet(str(table / "snapshot-1"))
    assert delta.commit_parquet_dir(str(table), "snapshot-1") == 0
    assert not list((table / "snapshot-1").glob("*.crc"))
    (snap / "_snapshot.json").write_text(
        json.dumps({"consistent_point": format_lsn(point), "keys": {TABLE: ["id"]}})
    )
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 50
    assert duckdb_table(table).num_rows == 50
    txns = [[("U", 3, "x", "y", 3), ("I", 100, "n", "m", 1)], [("D", 4)]]
    cap = tmp_path / "c.pgcap"
    write_capture(cap, txns)
    return snap, cap


def test_snapshot_committed_as_delta_then_applied(spark, tmp_path):  # noqa: F811
    """The snapshot's side of the contract: Spark writes a table's Parquet files into a
    directory inside the table, commit_parquet_dir makes them a Delta version; apply starts
    from that table and applies only the changes after the snapshot's point."""
    snap, cap = _snapshot_of_50(spark, tmp_path)
    out = tmp_path / "out"
    report = apply_changes(spark, [str(cap)], out, snapshot=str(snap))
    assert report == {TABLE: 50}
    rows = {r["id"]: r for r in DeltaTable(str(out / TABLE)).to_pyarrow_table().to_pylist()}
    assert rows[3]["a"] == "x" and 4 not in rows and rows[100]["b"] == "m" and rows[0]["a"] == "s0"


def test_scd2_starts_from_a_snapshot(spark, tmp_path):  # noqa: F811
    """SCD2 from a snapshot: its rows are the first versions, current from its point; a
    change after it closes the version it replaces (failed before 2026-11-28: the snapshot's
    rows were read as a history, `_is_current` cannot be resolved)."""
    snap, cap = _snapshot_of_50(spark, tmp_path)
    out = tmp_path / "out"
    report = apply_changes(spark, [str(cap)], out, snapshot=str(snap), scd=2)
    assert set(report) == {TABLE}
    t = read_table(out / TABLE)
    versions: dict = {}
    for r in t.to_pylist():
        versions.setdefault(r["id"], []).append(r)
    assert len(versions) == 51  # the 50 of the snapshot and 100
    current = {i: [r for r in vs if r["_is_current"]] for i, vs in versions.items()}
    assert [r["a"] for r in current[3]] == ["x"] and current[4] == []
    assert [r["b"] for r in current[100]] == ["m"] and [r["a"] for r in current[0]] == ["s0"]
    (old3,) = [r for r in versions[3] if not r["_is_current"]]
    assert old3["a"] == "s3" and old3["_valid_from_lsn"] == 0x20000
    assert old3["_valid_to_lsn"] == current[3][0]["_valid_from_lsn"] > 0x20000
    (old4,) = versions[4]
    assert old4["a"] == "s4" and old4["_valid_to_lsn"] > old3["_valid_to_lsn"]


def test_a_column_added_between_runs_rewrites_the_table(spark, tmp_path):  # noqa: F811
    """ALTER TABLE ADD COLUMN between two runs: the second version has the new schema (the
    column null in older rows), the first keeps the old one (time travel)."""
    import pgoutput_codec as pgc
    from pgoutput_codec import capture as capfmt

    def relation(cols):
        return pgc.Relation(
            relation_oid=16900, namespace="public", relation_name="grow",
            replica_identity=ord("d"),
            columns=tuple(
                pgc.RelationColumn(flags=int(n == "id"), name=n, type_oid=23, type_modifier=-1)
                for n in cols
            ),
        )  # fmt: skip

    def tup(*values):
        return pgc.TupleData(
            columns=tuple(pgc.TupleColumn(kind="t", value=str(v).encode()) for v in values)
        )

    def txn(begin, final, rel, changes):
        return [
            (begin, pgc.Begin(final_lsn=final, commit_time=0, xid=begin)),
            (0, rel),
            *[(begin + 8 * (i + 1), m) for i, m in enumerate(changes)],
            (final, pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=0)),
        ]

    first = txn(0x1000, 0x1100, relation(["id", "a"]),
                [pgc.Insert(relation_oid=16900, new_tuple=tup(i, i * 10)) for i in (1, 2, 3)])  # fmt: skip
    second = txn(0x2000, 0x2100, relation(["id", "a", "b"]),
                 [pgc.Update(relation_oid=16900, new_tuple=tup(1, 11, 7)),
                  pgc.Insert(relation_oid=16900, new_tuple=tup(4, 40, 8))])  # fmt: skip
    out = tmp_path / "out"
    for n, pairs in enumerate([first, first + second]):
        cap = tmp_path / f"g{n}.pgcap"
        encoded = [(lsn, pgc.encode(m, protocol_version=1)) for lsn, m in pairs]
        capfmt.write(cap, capfmt.from_payloads(encoded, 1))
        apply_changes(spark, [str(cap)], out)
    dt = DeltaTable(str(out / "public.grow"))
    rows = sorted(dt.to_pyarrow_table().select(["id", "a", "b"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [
        {"id": 1, "a": 11, "b": 7},
        {"id": 2, "a": 20, "b": None},
        {"id": 3, "a": 30, "b": None},
        {"id": 4, "a": 40, "b": 8},
    ]
    assert (
        "b" not in DeltaTable(str(out / "public.grow"), version=0).to_pyarrow_table().column_names
    )
    assert sorted(r["id"] for r in duckdb_table(out / "public.grow").to_pylist()) == [1, 2, 3, 4]
