"""The initial snapshot against real PostgreSQL 15 to 18, with writes going on meanwhile.

A second connection keeps inserting, updating and deleting (small transactions, a fixed
seed) before, during and after the slot is created with an exported snapshot. Checked:

- the rows :mod:`pgcdc.snapshot.server` reads, range by range, equal what a verifying session sees
  at the same exported snapshot (``SET TRANSACTION SNAPSHOT`` then ``to_jsonb``), restricted
  to the published columns and rows by hand-written queries;
- the snapshot plus the slot's changes from the consistent point (captured by the existing
  ``pgcdc capture``, replayed key by key) equal the server's tables at the end.

The truth is always the server's own ``to_jsonb`` rendering, never this package's.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from pgcdc.snapshot import server as snap
from pgcdc.lsn import format_lsn
from pgcdc.values import dumps_row
from tests.postgres import servers
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


def read_snapshot(conninfo: str, exported, tables, *, blocks_per_range=16) -> dict:
    """Every range read on its own connection (as Spark tasks do): table -> rendered rows."""
    out: dict[str, list[str]] = {t.qualified_name: [] for t in tables}
    ranges = snap.plan_ranges(tables, blocks_per_range=blocks_per_range)
    for rng in ranges:
        t = rng.table
        conn = snap.open_snapshot_connection(conninfo, exported.snapshot_name)
        try:
            for batch in snap.read_range(conn, rng, batch_rows=1000):
                for row in batch:
                    line = dumps_row(t.names, row, t.type_oids)
                    out[t.qualified_name].append(json.loads(line, parse_float=Decimal))
        finally:
            conn.close()
    return out, ranges


@pytest.mark.parametrize("key", servers.SERVER_KEYS)
def test_snapshot_plus_changes_equals_the_server(pg, key, tmp_path):
    with pg.database(key) as srv, srv.connect() as conn:
        setup_schema(conn)
        writer = Writer(srv.conninfo())
        writer.start()
        try:
            writer.wait_for(30)
            with snap.SlotSnapshot(srv.conninfo(), SLOT) as holder:
                exported = holder.exported
                tables = snap.list_published_tables(conn, [PUB])
                assert [t.qualified_name for t in tables] == sorted(TRUTH)
                writer.wait_for(30)  # the snapshot must not see these
                rows, ranges = read_snapshot(srv.conninfo(), exported, tables)
                with snap.open_snapshot_connection(srv.conninfo(), exported.snapshot_name) as v:
                    at_snapshot = server_state(v)
            writer.wait_for(60)
        finally:
            writer.finish()
        final = server_state(conn)
        end_lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]

        # ranges really split the big table, and each row was read exactly once
        assert sum(r.table.table == "acct" for r in ranges) > 3
        got = {n: sorted(canonical(r) for r in rs) for n, rs in rows.items()}
        assert got == at_snapshot
        assert got != final, "the writer changed nothing after the snapshot"
        filtered = [t for t in tables if t.table == "filtered"][0]
        assert filtered.names == ("id", "v") and filtered.row_filter
        reg = [t for t in tables if t.table == "reg"][0]
        assert reg.relkind == "p" and reg.key == ("id", "region")

        # the slot's changes from the consistent point, through `pgcdc capture`
        _capdir, events = changes_since(srv, tmp_path, end_lsn, exported.consistent_point)
        assert replay(rows, events) == final
        assert format_lsn(exported.consistent_point) == exported.consistent_point_text
