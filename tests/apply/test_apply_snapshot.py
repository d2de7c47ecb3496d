"""Snapshot plus captures, applied in two incremental runs, equals the server's tables
(PostgreSQL 18, through the public APIs only: ``pgcdc.snapshot.job.take_snapshot``,
``pgcdc capture``, ``apply_changes(..., snapshot=DIR)``).

A writer keeps changing every published table while the slot is created with its exported
snapshot (the workload of tests/snapshot/test_snapshot_postgres.py). The slot is captured from its
consistent point in two stretches into one directory; the first apply starts from the
snapshot and the first stretch (its state equals the server's tables at that point), the
second applies only what the directory gained and equals the final tables. The truth is the
server's ``to_jsonb`` (``server_state``).
"""

from __future__ import annotations

import json

import pytest

from tests.support.delta import read_table

pytest.importorskip("pyarrow")

from pgcdc.cli import capture as capture_cli  # noqa: E402
from pgcdc.lsn import parse_lsn  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.snapshot.job import take_snapshot  # noqa: E402
from tests.support.snapshot import PUB, SLOT, TRUTH, Writer, canonical, server_state, setup_schema  # noqa: E402
from tests.support.snapshot import _states_equal, parquet_rows  # noqa: E402


def _capture(srv, capdir, until: str) -> None:
    code = capture_cli.main(
        ["--dsn", srv.conninfo(), "--slot", SLOT, "--publication", PUB, "--out", str(capdir),
         "--until-lsn", until, "--log-format", "json", "--no-fsync"]
    )  # fmt: skip
    assert code == 0


def _applied(state) -> dict[str, list[str]]:
    """The applied tables read by delta-rs (each written to one Parquet file for the snapshot
    test's reader of Parquet rows)."""
    import tempfile

    import pyarrow.parquet as pq

    out = {}
    for name in TRUTH:
        with tempfile.TemporaryDirectory() as tmp:
            pq.write_table(read_table(state / name), f"{tmp}/rows.parquet")
            rows, _ = parquet_rows(tmp)
        out[name] = sorted(canonical(r) for r in rows)
    return out


def _quiet_state(conn) -> tuple[str, dict]:
    """The WAL position and the tables, read while nothing writes."""
    lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    return lsn, server_state(conn)


def test_snapshot_plus_incremental_captures_equal_the_server(pg, tmp_path, spark):  # noqa: F811
    snap, capdir, state = tmp_path / "snapshot", tmp_path / "capture", tmp_path / "state"
    with pg.database("pg18") as srv, srv.connect() as conn:
        setup_schema(conn)
        writer = Writer(srv.conninfo(), seed=7)
        writer.start()
        try:
            writer.wait_for(20)
            result = take_snapshot(
                spark, srv.conninfo(), SLOT, [PUB], snap, blocks_per_range=64, batch_rows=500,
                on_exported=lambda _exported: writer.wait_for(20),
            )  # fmt: skip
            writer.wait_for(30)
        finally:
            writer.finish()
        lsn1, mid = _quiet_state(conn)
        _capture(srv, capdir, lsn1)
        first = apply_changes(spark, [str(capdir)], state, snapshot=str(snap))
        assert first
        _states_equal(_applied(state), mid)

        writer = Writer(srv.conninfo(), seed=8)
        writer.next_id = 500_000  # new rows do not collide with the first writer's
        writer.start()
        try:
            writer.wait_for(40)
        finally:
            writer.finish()
        lsn2, final = _quiet_state(conn)
        _capture(srv, capdir, lsn2)
    second = apply_changes(spark, [str(capdir)], state, snapshot=str(snap))
    assert second and second.run["units_read"] >= 1
    doc = json.loads((state / "_pgcdc_state.json").read_text())
    assert {k: v for k, v in doc["last_run"].items() if k != "finished_at"} == second.run
    assert result.consistent_point < parse_lsn(doc["applied_lsn"])
    _states_equal(_applied(state), final)
    assert _applied(state) != {n: [] for n in TRUTH}
