"""apply_changes against real PostgreSQL: after the change-events workload (ALTER TABLE, key
changes, every replica identity, unchanged TOAST, truncate, streamed transactions with
subtransaction aborts, two-phase), the Parquet state equals the server's tables.

The truth is the server's own rendering (``SELECT to_jsonb(t)::text FROM t``). The Parquet
rows are read with pyarrow and brought to that form only through the documented mapping
rules of pgcdc.spark.types: a value in ``_pg_text`` replaces the null typed value, strings of
types mapped to text (unconstrained numeric, json) are compared as the numbers/JSON they
spell, bytea as ``\\x`` hex, timestamps as ISO 8601 in UTC, float NaN/infinity as words.
"""

from __future__ import annotations


import pytest

from tests.postgres import capture, servers
from tests.postgres import cdc_workload as wl
from tests.postgres.capture import Options

pq = pytest.importorskip("pyarrow.parquet")

from pgcdc.apply.run import apply_changes  # noqa: E402
from pgoutput_codec import capture as capfmt  # noqa: E402
from tests.support.truth import _parquet_rows, _truth  # noqa: E402

# every supported major (about 2 minutes); PGCDC_APPLY_SERVERS=pg18 (say) narrows it
SERVER_KEYS = servers.keys_from_env("PGCDC_APPLY_SERVERS")


LABELS = ["proto1-text-off", "binary-streamed-2pc"]
# records per unit: small where transactions are streamed (carried state crosses units),
# larger elsewhere (each unit is a Spark task: small units cost time, not coverage)
SPLIT = {"proto1-text-off": 400, "binary-streamed-2pc": 40}


def option_sets(major: int) -> dict:
    """label -> (Options, slot). Streamed binary: protocol 4 with parallel streaming on
    PostgreSQL 16+, protocol 3 with streaming on PostgreSQL 15 (its highest)."""
    streamed = (
        Options(4, True, "parallel", origin=None, publication=wl.PUB_ROOT)
        if major >= 16
        else Options(3, True, "on", origin=None, publication=wl.PUB_ROOT)
    )
    return {
        "proto1-text-off": (
            Options(1, False, "off", origin=None, publication=wl.PUB_LEAF),
            "plain",
        ),
        "binary-streamed-2pc": (streamed, "2pc"),
    }


@pytest.fixture(scope="module", params=SERVER_KEYS)
def server_run(pg, request):
    key = request.param
    with pg.database(key) as srv, srv.connect() as conn, srv.connect() as other:
        conn.execute("SET TimeZone = 'UTC'")
        for stmt in wl.SCHEMA:
            conn.execute(stmt)
        conn.execute("SELECT pg_create_logical_replication_slot('plain', 'pgoutput', false, false)")
        conn.execute("SELECT pg_create_logical_replication_slot('2pc', 'pgoutput', false, true)")
        for _name, statements in wl.STEPS:
            wl.run_step(conn, other, statements)
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE flush_marker ()")
        conn.execute("COMMIT")
        truth = {t: _truth(conn, t) for t in wl.KEYS}
        captures = {}
        for label, (opts, slot) in option_sets(srv.major).items():
            captures[label] = (opts, capture.sql_capture(conn, slot, opts))
        yield key, truth, captures


@pytest.mark.parametrize("label", LABELS)
def test_applied_state_equals_the_server(server_run, label, spark, tmp_path):  # noqa: F811
    key, truth, captures = server_run
    opts, records = captures[label]
    path = tmp_path / "c.pgcap"
    capfmt.write(path, records)
    out = tmp_path / "out"
    # small units: transactions span unit boundaries, so carried state is exercised
    report = apply_changes(spark, [str(path)], out, split_records=SPLIT[label])
    leaf = opts.publication == wl.PUB_LEAF
    tables = [t for t in wl.KEYS if t not in (wl.ROOT_ONLY if leaf else wl.LEAF_ONLY)]
    for table in tables:
        name = f"public.{table}"
        assert name in report, f"{key} {label}: {name} not written ({report})"
        expected, rows = truth[table]
        got = _parquet_rows(out / name, rows)
        assert got == expected, f"{key} {label}: {name} differs from the server"
    # spark reads the Delta table's current files (as a Spark without Delta's jars can)
    from deltalake import DeltaTable

    files = DeltaTable(str(out / "public.kv")).file_uris()
    assert spark.read.parquet(*files).count() == len(truth["kv"][0])
    # a second run over the same capture applies nothing and changes nothing
    state = (out / "_pgcdc_state.json").read_text()
    again = apply_changes(spark, [str(path)], out, split_records=SPLIT[label])
    assert again == {} and again.run["units_read"] == 0
    assert (out / "_pgcdc_state.json").read_text() == state
