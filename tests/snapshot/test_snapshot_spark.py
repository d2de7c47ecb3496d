"""The initial snapshot through Spark tasks against real PostgreSQL 15 to 18.

The same workload as tests/snapshot/test_snapshot_postgres.py (a writer keeps changing every published
table while the slot is created): ``take_snapshot`` writes typed Parquet that pyarrow reads
back equal to what a verifying session sees at the exported snapshot (the server's
``to_jsonb``), every row carrying the consistent point; and the slot's changes, captured from
there by ``pgcdc capture``, replayed on the Parquet rows give the server's final tables, and
so does ``apply_changes`` of the capture onto the snapshot (pgcdc.apply.run).
"""

from __future__ import annotations

import json

import pytest


from pgcdc.lsn import parse_lsn  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.snapshot.job import take_snapshot  # noqa: E402
from pgcdc.snapshot.server import open_snapshot_connection  # noqa: E402
from tests.postgres import servers  # noqa: E402
from tests.support.snapshot import (
    PUB,
    SLOT,
    TRUTH,
    Writer,
    canonical,
    changes_since,
    replay,
    server_state,
    setup_schema,
)  # noqa: E402
from tests.support.snapshot import _states_equal, parquet_rows  # noqa: E402


# every supported major; PGCDC_SPARK_SERVERS=pg18 (say) narrows it, for quicker local runs
@pytest.mark.parametrize("key", servers.keys_from_env("PGCDC_SPARK_SERVERS"))
def test_spark_snapshot_is_the_exported_snapshot(pg, key, tmp_path, spark):  # noqa: F811
    out = tmp_path / "snapshot"
    with pg.database(key) as srv, srv.connect() as conn:
        setup_schema(conn)
        writer = Writer(srv.conninfo(), seed=18)
        writer.start()
        at_snapshot = {}
        try:
            writer.wait_for(30)

            def verify(exported):
                # a verifying session at the same exported snapshot: the truth for the rows
                with open_snapshot_connection(srv.conninfo(), exported.snapshot_name) as v:
                    at_snapshot.update(server_state(v))
                writer.wait_for(20)  # changes the snapshot must not see

            result = take_snapshot(
                spark, srv.conninfo(), SLOT, [PUB], out, blocks_per_range=16, batch_rows=500,
                on_exported=verify, driver_bytes=0,  # parallel tasks, each its own connection
            )  # fmt: skip
            writer.wait_for(40)
        finally:
            writer.finish()
        final = server_state(conn)
        end_lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]

        assert result.ranges > 8
        manifest = json.loads((out / "_snapshot.json").read_text())
        assert parse_lsn(manifest["consistent_point"]) == result.consistent_point
        assert manifest["keys"]["public.acct"] == ["id"]
        rows = {}
        for name in TRUTH:
            rows[name], order = parquet_rows(out / name)
            assert order == {(result.consistent_point, 0)}
            assert manifest["tables"][name] == len(rows[name])
        got = {n: sorted(canonical(r) for r in rs) for n, rs in rows.items()}
        _states_equal(got, at_snapshot)
        assert got != final

        capdir, events = changes_since(srv, tmp_path, end_lsn, result.consistent_point)
        _states_equal(replay(rows, events), final)

        # the apply engineer's apply_changes: snapshot + captures -> the server's tables
        state = tmp_path / "state"
        apply_changes(spark, [str(capdir)], str(state), snapshot=str(out))
        applied = {}
        for name in TRUTH:
            table_rows, _ = parquet_rows(state / name)
            applied[name] = sorted(canonical(r) for r in table_rows)
        _states_equal(applied, final)
