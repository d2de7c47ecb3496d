"""Vacuum under an hour (``pgcdc.apply.vacuum``) and sync's upkeep of the tables' old files.

The files a vacuum may delete are read from the Delta log here, by the protocol's own rule
(a ``remove`` whose ``deletionTimestamp`` is older than the retention), not from the code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")


def _log(table: Path) -> list[dict]:
    """Every action of the table's JSON commits, with its commit's version."""
    actions = []
    for f in sorted((table / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if line.strip():
                actions.append({"version": int(f.stem), **json.loads(line)})
    return actions


def _on_disk(table: Path) -> set[str]:
    return {
        str(p.relative_to(table)) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def _rows(table: Path, version: int) -> int:
    return deltalake.DeltaTable(str(table), version=version).to_pyarrow_table().num_rows


def test_vacuum_under_an_hour_deletes_what_the_delta_rule_allows(tmp_path):
    from pgcdc.apply.vacuum import vacuum

    t = tmp_path / "t"

    def write(v, mode):
        deltalake.write_deltalake(str(t), pa.table({"v": [v] * 5}), mode=mode)

    write(0, "overwrite")  # version 0
    write(1, "append")  # 1
    write(2, "overwrite")  # 2: removes 0 and 1's files; current at the cut-off
    time.sleep(1.2)
    cut = time.time()
    time.sleep(0.3)
    write(3, "append")  # 3: added after the cut-off...
    write(4, "overwrite")  # 4: ...and removed after it, with 2's file
    write(5, "overwrite")  # 5
    now = time.time()
    actions = _log(t)
    removed = {
        a["remove"]["path"]: a["remove"]["deletionTimestamp"] for a in actions if "remove" in a
    }
    may_go = {p for p, ts in removed.items() if ts < cut * 1000}
    assert len(may_go) == 2 and len(removed) == 5  # the test's own premise
    before = _on_disk(t)

    gone = vacuum(str(t), now - cut, now=now)

    assert set(gone) == may_go
    assert _on_disk(t) == before - may_go
    for version in (2, 3, 4, 5):  # every version of the retention still reads whole
        assert _rows(t, version) == {2: 5, 3: 10, 4: 5, 5: 5}[version]
    assert vacuum(str(t), now - cut, now=now) == []  # nothing more to delete
    assert vacuum(str(t), 3600) == []  # an hour: delta-rs's, every removal is younger


def test_the_log_before_the_retention_goes_from_its_last_checkpoint_on(tmp_path):
    """Of the log, what the version current at the cut-off needs stays: the last checkpoint
    at or before it and every commit after; the rest goes, and every version from that
    checkpoint on reads as before, by delta-rs and by DuckDB."""
    from tests.support.delta import duckdb_table

    from pgcdc.apply import delta
    from pgcdc.apply.vacuum import clean_log

    t = tmp_path / "t"
    for v in range(10):  # versions 0-9, a checkpoint at 5
        _pgcdc_version(t, v + 1, app_version=v)
        if v == 5:
            deltalake.DeltaTable(str(t)).create_checkpoint()
    time.sleep(1.2)
    cut = time.time()
    time.sleep(0.3)
    for v in range(10, 15):  # 10-14, a checkpoint at 12
        _pgcdc_version(t, v + 1, app_version=v)
        if v == 12:
            deltalake.DeltaTable(str(t)).create_checkpoint()
    log = t / "_delta_log"
    stamps = {}  # each commit's time, as its commitInfo says
    for a in _log(t):
        if "commitInfo" in a:
            stamps[a["version"]] = a["commitInfo"]["timestamp"]
    current_at_cut = max(v for v, ms in stamps.items() if ms <= cut * 1000)
    assert current_at_cut == 9  # the test's own premise
    before = {v: _rows(t, v) for v in range(5, 15)}
    names = {p.name for p in log.iterdir()}

    now = time.time()
    deleted = clean_log(str(t), now - cut, now=now)

    left = {p.name for p in log.iterdir()}
    assert names - left == {f"{v:020d}.json" for v in range(5)} and deleted == 5
    assert {f"{5:020d}.checkpoint.parquet", f"{12:020d}.checkpoint.parquet"} <= left
    assert {v: _rows(t, v) for v in range(5, 15)} == before
    with pytest.raises(Exception):
        _rows(t, 4)
    dt = deltalake.DeltaTable(str(t))
    assert dt.version() == 14 and dt.transaction_version(delta.APP_ID) == 14
    assert duckdb_table(t).num_rows == 15
    assert clean_log(str(t), now - cut, now=now) == 0
    assert clean_log(str(t), 3600) == 0  # an hour: every commit is younger


class Events:
    def __init__(self):
        self.seen = []

    def event(self, level, event, message="", **fields):
        self.seen.append((level, event, message, fields))

    def named(self, name):
        return [s for s in self.seen if s[1] == name]


def _pgcdc_version(table: Path, rows: int, app_version: int | None = None, **commit) -> None:
    """A version as sync's cycles make them: every file replaced by one in a directory of its
    own (pgcdc.apply.delta.commit)."""
    from pgcdc.apply import delta

    sub = delta.attempt_dir("test")
    (table / sub).mkdir(parents=True)
    data = pa.table({"id": pa.array(range(rows), pa.int64())})
    pq.write_table(data, table / sub / "part-0.parquet")
    size = (table / sub / "part-0.parquet").stat().st_size
    f = delta.DataFile(f"{sub}/part-0.parquet", size, rows, json.dumps({"numRecords": rows}))
    delta.commit(str(table), [f], data.schema, overwrite=True, app_version=app_version, **commit)


def _sync(out: Path, retain: float):
    from pgcdc.sync import SyncConfig, pipeline

    config = SyncConfig(out=str(out), publication="pub", slot="s", stop_timeout=30.0,
                        retain=retain, keep_segments=True)  # fmt: skip
    return pipeline.Sync(config, log=Events())


def test_sync_vacuums_within_the_hour_and_drops_the_emptied_directories(tmp_path, monkeypatch):
    from pgcdc.sync import upkeep

    out = tmp_path / "out"
    table = out / "public.t"
    for rows in (10, 20, 30):
        _pgcdc_version(table, rows)
    state = {"tables": {"public.t": {"version": 2, "rows": 30, "bytes_removed": 321}}}
    (out / "_pgcdc_state.json").write_text(json.dumps(state))
    time.sleep(1.5)
    sync = _sync(out, retain=1 / 3600)  # a second (the CLI takes 0.1 h at least)
    assert upkeep.vacuum_every(sync.config.retain) == 60  # a minute at least
    sync.upkeep.next_vacuum = 0
    dirs = {p.name for p in table.iterdir() if p.is_dir() and p.name != "_delta_log"}
    assert len(dirs) == 3

    sync.upkeep.maintain({"public.t": 30})  # the cycle's report: its tables' rows

    assert [(t, n) for _m, t, n in sync.upkeep.rewrites] == [("public.t", 321)]  # its commit's
    (vac,) = sync.log.named("vacuum")
    assert vac[3]["files"] == 2, sync.log.seen
    left = {p.name for p in table.iterdir() if p.is_dir() and p.name != "_delta_log"}
    assert len(left) == 1 and left < dirs  # the removed versions' directories are gone
    assert _rows(table, 2) == 30
    assert sync.upkeep.next_vacuum > time.monotonic() + 50


def _commits(table: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in (table / "_delta_log").glob("*.json"))


def test_sync_commits_leave_the_log_to_sync(tmp_path):
    """delta-rs cleans the log after each commit by default (reading all of it: 0.45 s a
    commit at 86,400 commits); sync's commits turn that off (``log_cleanup=False``), and the
    default still cleans. A log retention of nothing makes the difference show at once."""
    table = tmp_path / "public.t"
    _pgcdc_version(table, 1)
    deltalake.DeltaTable(str(table)).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds"}
    )
    for rows in (2, 3, 4):
        _pgcdc_version(table, rows, log_cleanup=False)
    deltalake.DeltaTable(str(table)).create_checkpoint()  # at version 4
    time.sleep(1.1)
    _pgcdc_version(table, 5, log_cleanup=False)
    assert _commits(table) == [0, 1, 2, 3, 4, 5]
    _pgcdc_version(table, 6)  # apply's default: delta-rs's cleanup up to the checkpoint
    assert _commits(table) == [4, 5, 6]
    assert _rows(table, 6) == 6


def test_under_retain_0_sync_cleans_the_log_hourly_at_the_delta_default(tmp_path, monkeypatch):
    """No vacuum under --retain 0, but the log is cleaned (hourly) as delta-rs's cleanup did,
    at Delta's default log retention (30 days, here a second): data files stay."""
    from pgcdc.sync import upkeep

    out = tmp_path / "out"
    table = out / "public.t"
    for rows in (10, 20, 30):
        _pgcdc_version(table, rows, log_cleanup=False)
    deltalake.DeltaTable(str(table)).create_checkpoint()  # at version 2
    (out / "_pgcdc_state.json").write_text(json.dumps({"tables": {"public.t": {"version": 2}}}))
    time.sleep(1.5)
    _pgcdc_version(table, 40, log_cleanup=False)
    files = sorted(p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts)
    assert upkeep.LOG_RETENTION == 30 * 86400
    monkeypatch.setattr(upkeep, "LOG_RETENTION", 1.0)
    sync = _sync(out, retain=0)
    assert upkeep.vacuum_every(0) == 3600
    sync.upkeep.next_vacuum = 0

    sync.upkeep.maintain({"public.t": 40})

    assert _commits(table) == [2, 3]  # from the last checkpoint at or before the cut-off
    assert sorted(p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts) == files
    (line,) = sync.log.named("vacuum")
    assert (line[3]["files"], line[3]["log_files"]) == (0, 2)
    assert sync.upkeep.next_vacuum > time.monotonic() + 3500
    assert _rows(table, 3) == 40


def test_a_retention_the_disk_cannot_hold_is_warned_about_once_an_hour(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    free = [10 << 30]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, free[0]))
    sync = _sync(tmp_path, retain=24)
    now = time.monotonic()
    # a table of 100 MB rewritten every second for two minutes: 8.6 TB a day
    for i in range(120):
        sync.upkeep.rewrites.append((now - 120 + i, "public.big", 100 << 20))
    sync.upkeep.rewrites.append((now, "public.small", 1 << 10))
    sync.upkeep.check_disk()
    (warning,) = sync.log.named("disk")
    level, _e, text, fields = warning
    assert level == "warning"
    assert fields["table"] == "public.big" and "--retain" in text and "--trigger" in text
    assert fields["kept_bytes"] > 24 * 3600 * (100 << 20) * 0.9
    sync.upkeep.check_disk()
    assert len(sync.log.named("disk")) == 1  # once an hour at most

    quiet = _sync(tmp_path, retain=0.1)
    for i in range(120):  # a MB a second kept 6 minutes (and a quarter): 450 MB, 10 GB free
        quiet.upkeep.rewrites.append((now - 120 + i, "public.t", 1 << 20))
    quiet.upkeep.check_disk()
    assert quiet.log.named("disk") == []
    free[0] = 500 << 20  # the same on a nearly full disk
    quiet.upkeep.check_disk()
    assert len(quiet.log.named("disk")) == 1

    never = _sync(tmp_path, retain=0)  # never vacuumed: a day of it, 86 GB
    free[0] = 100 << 30
    for i in range(120):
        never.upkeep.rewrites.append((now - 120 + i, "public.t", 1 << 20))
    never.upkeep.check_disk()
    (warning,) = never.log.named("disk")
    assert "never vacuums" in warning[2] and "give a --retain" in warning[2], warning


def test_the_cli_takes_fractions_of_an_hour_from_a_tenth(capsys):
    from pgcdc.cli import sync

    base = ["--dsn", "host=/nonexistent", "--publication", "p", "--slot", "s", "--out", "x"]
    assert sync.main([*base, "--retain", "0.05"]) == 2
    assert "--retain" in capsys.readouterr().err
    assert sync.build_parser().parse_args([*base, "--retain", "0.25"]).retain == 0.25
