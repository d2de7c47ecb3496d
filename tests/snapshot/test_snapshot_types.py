"""The snapshot's fast reader (binary COPY typed into Arrow by the ADBC driver) against the
text COPY path (the change events' loader and converter), on a table of every built-in type
the change-event tests use (tests/values/test_values_live.py: one column and one array column per
type, rows of edge values: infinity, BC and year-10000 dates, NaN, multi-dimensional arrays,
lower bounds other than 1, ...), plus typmod columns, tricky jsonb and types that are not
built in (enum, domain, composite: typed by the server's catalog, as a capture's catalog types
them for change events), on a real PostgreSQL 18.

Checked: ``take_snapshot(reader="arrow")`` writes Parquet equal, value for value and in
``_pg_text``, to ``take_snapshot(reader="text")``; Spark reads both with the schema
``table_schema`` gives (the change events' Spark types); values of types that are not built
in follow the server's catalog (to_jsonb's rendering for a composite); xid is typed. Also: ranges sized by bytes, progress reports, a table
whose job fails is redone from the ranges left, and a rerun after a run that died starts over
and says why.
"""

from __future__ import annotations

import contextlib
import json
import logging

import pytest


import pyarrow.parquet as pq  # noqa: E402

from pgcdc.snapshot import server as pgsnap  # noqa: E402
from pgcdc.snapshot import job as sparksnap  # noqa: E402
from pgcdc.snapshot.job import table_schema, take_snapshot  # noqa: E402
from tests.support.values_live import (
    CUSTOM_ROWS,
    CUSTOM_SQL,
    NO_ARRAY,
    _array_literal,
    _column_types,
    _has_xml,
)  # noqa: E402
from tests.wait import until  # noqa: E402

pytest.importorskip("adbc_driver_postgresql")

TRICKY_JSONB = [
    r'{"a, b": "x: y", "q\"": [1, 2.50, {"k": null}], "e": ""}',
    r'"tab\tnl\nctl\u0001\u001f del\u007f"',
    r'["\\", "\\\"", ", ", ": "]',
    r'{"ü": "𝄞 \u2028", "n": -0, "big": 1e400, "small": 1.0e-20}',
    "[]",
    "{}",
    "null",
    "12345678901234567890.1234567890",
    r'"\/slash"',
    '{"nested": {"deep": [{"x": [1, {"y": "a\\"b, c: d"}]}]}}',
]

EXTRA_COLUMNS = [
    "n12 numeric(12,2)",
    "n38 numeric(38,10)",
    "n40 numeric(40,2)",
    "nneg numeric(5,-2)",
    "vc varchar(3)",
    "ts3 timestamp(3)",
    "jb jsonb",
    "jba jsonb[]",
]
EXTRA_ROWS = [
    "INSERT INTO vals (id, n12, n38, n40, vc, ts3, nneg) VALUES (100, 1234567890.12,"
    " -1234567890123456789012345678.0123456789, 'NaN', 'abc', '2020-01-01 00:00:00.123', 12300),"
    " (101, 'NaN', 'NaN', 1.5, 'x', 'infinity', 'NaN')",
]


def _make_tables(conn) -> None:
    cols = _column_types(18, _has_xml(conn))
    ddl = ["id int PRIMARY KEY"]
    for name, sql_type, _ in cols:
        ddl.append(f"{name} {sql_type}")
        if sql_type not in NO_ARRAY:
            ddl.append(f"{name}_a {sql_type}[]")
    conn.execute(f"CREATE TABLE vals ({', '.join(ddl + EXTRA_COLUMNS)})")
    for stmt in CUSTOM_SQL:
        conn.execute(stmt)
    nrows = max(max(len(lits) for _, _, lits in cols), 6)
    for row in range(nrows):
        names, exprs = ["id"], [str(row)]
        for name, sql_type, lits in cols:
            if row < len(lits):
                names.append(name)
                exprs.append(f"({lits[row]})::{sql_type}")
            arr = None if sql_type in NO_ARRAY else _array_literal(sql_type, lits, row)
            if arr is not None:
                names.append(f"{name}_a")
                exprs.append(arr)
        conn.execute(f"INSERT INTO vals ({', '.join(names)}) VALUES ({', '.join(exprs)})")
    for stmt in EXTRA_ROWS + CUSTOM_ROWS:
        conn.execute(stmt)
    for k, doc in enumerate(TRICKY_JSONB):
        conn.execute(
            "INSERT INTO vals (id, jb, jba) VALUES (%s, %s::jsonb, ARRAY[%s::jsonb, NULL])",
            [200 + k, doc, doc],
        )
    # enough rows of the plain columns for several ranges
    conn.execute(
        "INSERT INTO vals (id, c0, jb, n12) SELECT g, g % 2 = 0, jsonb_build_object('g', g),"
        " g * 0.01 FROM generate_series(1000, 20000) g"
    )
    conn.execute("CREATE PUBLICATION pub FOR TABLE vals, custom")
    conn.execute("ANALYZE")


def _rows(path) -> list[str]:
    """A snapshot table's rows in a comparable form (NaN == NaN), by id."""
    table = pq.read_table(path)
    rows = table.drop_columns(["_commit_lsn"]).to_pylist()  # each run has its own slot
    rows.sort(key=lambda r: r["id"])
    return [repr(r) for r in rows]


@pytest.fixture(scope="module")
def types_server(pg):
    with pg.database("pg18") as srv, srv.connect() as conn:
        _make_tables(conn)
        yield srv, conn


def test_arrow_reader_equals_the_text_path_on_every_type(
    types_server,
    spark,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    srv, conn = types_server
    out = {}
    runs = (("text", "tasks"), ("arrow", "tasks"), ("arrow", "spark"), ("arrow", "connect"),
            ("arrow", "driver"))  # fmt: skip
    for reader, writer in runs:
        key = reader if writer == "tasks" else f"{reader}_{writer}"
        out[key] = tmp_path / key
        driver_bytes = 0  # every range a Spark task's
        with monkeypatch.context() as m:
            if writer == "connect":  # tasks write, as under Spark Connect: the data source
                m.setattr(sparksnap, "_spark_context", lambda spark: None)
                writer = "tasks"
            if writer == "driver":  # the ranges read by the driver, as a small table's are
                writer, driver_bytes = "tasks", 1 << 40
            res = take_snapshot(
                spark, srv.conninfo(), f"types_{key}", ["pub"], out[key], reader=reader,
                writer=writer, blocks_per_range=20, progress=False, driver_bytes=driver_bytes,
            )  # fmt: skip
        conn.execute("SELECT pg_drop_replication_slot(%s)", [f"types_{key}"])
        assert res.tables["public.vals"] == conn.execute("SELECT count(*) FROM vals").fetchone()[0]
        assert res.ranges > 3
    tables = {t.qualified_name: t for t in pgsnap.list_published_tables(conn, ["pub"])}
    for name, t in tables.items():
        text_rows = _rows(out["text"] / name)
        for other in ("arrow", "arrow_spark", "arrow_connect", "arrow_driver"):
            other_rows = _rows(out[other] / name)
            assert len(text_rows) == len(other_rows)
            for a, b in zip(text_rows, other_rows):
                assert a == b, (name, other)
        # the Spark types change events have (types not built in typed by the catalog)
        want = table_schema(t, pgsnap.make_catalog(pgsnap.catalog_docs(conn, [t])))
        for reader in out:
            got = spark.read.parquet(str(out[reader] / name)).schema
            assert [(f.name, f.dataType) for f in got] == [(f.name, f.dataType) for f in want]

    # types that are not built in, typed by the server's catalog as change events are by
    # the capture's: an enum its label, a composite a struct, an enum array an array (each
    # equal to to_jsonb's object and array)
    custom = {r["id"]: r for r in pq.read_table(out["arrow"] / "public.custom").to_pylist()}
    for row_id, m, pr, ms in conn.execute(
        "SELECT id, m::text, to_jsonb(pr)::text, to_jsonb(ms)::text FROM custom WHERE m IS NOT NULL"
    ).fetchall():
        got = custom[row_id]
        assert got["m"] == m
        assert got["pr"] == json.loads(pr)
        assert got["ms"] == json.loads(ms)
    # xid is typed (LongType), from its text
    xid_col = next(c.name for c in tables["public.vals"].columns if c.type_oid == 28)
    vals = {r["id"]: r for r in pq.read_table(out["arrow"] / "public.vals").to_pylist()}
    for row_id, text in conn.execute(f"SELECT id, {xid_col}::text FROM vals").fetchall():
        assert vals[row_id][xid_col] == (None if text is None else int(text))
    # jsonb: compact, and every document equal to the server's as JSON
    for row_id, text in conn.execute("SELECT id, jb::text FROM vals WHERE id >= 200").fetchall():
        got = vals[row_id]["jb"]
        if text in (None, "null"):
            assert got is None
        else:  # a string too is its JSON text, so that "1" and 1 stay apart
            assert json.loads(got) == json.loads(text)


def test_a_snapshot_loaded_in_the_driver_equals_sparks_load(
    types_server, spark, tmp_path, monkeypatch
):  # noqa: F811
    """The first version of each table of a snapshot, as sync's driver loads it
    (:mod:`pgcdc.apply.snapshot_load`, no Spark job) and as Spark loads it: the same Delta
    schema (column names kept apart from pgcdc's own, each with its PostgreSQL name) and the
    same rows, on every type, and names that a lake must store otherwise."""
    from deltalake import DeltaTable

    from pgcdc.apply import snapshot_load
    from pgcdc.apply.run import apply_changes

    srv, conn = types_server
    conn.execute('CREATE TABLE "Odd Names" ("Key.Part" int, "n" int, "KEY.part" text,'
                 ' "_PG_TEXT" text, PRIMARY KEY ("Key.Part", "KEY.part"))')  # fmt: skip
    conn.execute("""INSERT INTO "Odd Names" SELECT g % 7, g, 'k' || (g / 7), 'x'
                    FROM generate_series(1, 300) g""")  # fmt: skip
    conn.execute('CREATE PUBLICATION load_pub FOR TABLE vals, custom, "Odd Names"')
    snap = tmp_path / "snap"
    take_snapshot(spark, srv.conninfo(), "types_load", ["load_pub"], snap, progress=False)
    conn.execute("SELECT pg_drop_replication_slot('types_load')")
    (tmp_path / "captures").mkdir()
    loaded = []
    real = snapshot_load.load_files

    def recorded(uri, *rest):
        got = real(uri, *rest)
        if got is not None:
            loaded.append(str(uri))
        return got

    monkeypatch.setattr(snapshot_load, "load_files", recorded)
    apply_changes(spark, [str(tmp_path / "captures")], tmp_path / "driver", snapshot=snap,
                  driver_bytes=64 << 20)  # fmt: skip
    monkeypatch.setattr(snapshot_load, "SNAPSHOT_BYTES", 0)  # every table Spark's
    apply_changes(spark, [str(tmp_path / "captures")], tmp_path / "spark", snapshot=snap,
                  driver_bytes=64 << 20)  # fmt: skip
    names = ["public.vals", "public.custom", "public.Odd~20Names"]
    assert sorted(p.rpartition("/")[2] for p in loaded) == sorted(names)  # the driver loaded each
    for name in names:
        mine, theirs = (
            DeltaTable(str(tmp_path / "driver" / name)),
            DeltaTable(str(tmp_path / "spark" / name)),
        )
        assert mine.schema().to_json() == theirs.schema().to_json(), name
        a, b = mine.to_pyarrow_table(), theirs.to_pyarrow_table()
        assert a.schema == b.schema, name
        key = a.column_names[0]
        rows_a = sorted(map(repr, a.to_pylist()), key=str)
        rows_b = sorted(map(repr, b.to_pylist()), key=str)
        assert (
            len(rows_a)
            == conn.execute(  # every row of the server's
                f"SELECT count(*) FROM {'.'.join(chr(34) + p + chr(34) for p in name.replace('~20', ' ').split('.'))}"
            ).fetchone()[0]
        ), (name, key)
        assert rows_a == rows_b, name


def test_ranges_by_bytes_progress_and_retries(types_server, spark, tmp_path):  # noqa: F811
    srv, conn = types_server
    tables = {t.table: t for t in pgsnap.list_published_tables(conn, ["pub"])}
    vals = tables["vals"]
    assert vals.bytes >= vals.blocks * 8192 and vals.rows_estimate > 10_000
    by_bytes = pgsnap.plan_ranges([vals], range_bytes=vals.bytes // 5)
    assert 4 <= len(by_bytes) <= 7
    assert len(pgsnap.plan_ranges([vals], min_ranges=4)) >= 4
    assert by_bytes[-1].hi_block is None

    # a table whose job fails once is run again for the ranges not written
    out = tmp_path / "snap"
    out.mkdir()
    (out / sparksnap.FAULTS).write_text(json.dumps({"public.vals": [2]}))
    seen = []
    res = take_snapshot(
        spark, srv.conninfo(), "retry_slot", ["pub"], out, blocks_per_range=20,
        progress=seen.append, driver_bytes=0,
    )  # fmt: skip
    conn.execute("SELECT pg_drop_replication_slot('retry_slot')")
    assert json.loads((out / sparksnap.FAULTS).read_text()) == {"public.vals": []}
    assert res.tables["public.vals"] == conn.execute("SELECT count(*) FROM vals").fetchone()[0]
    assert res.peak_task_rss > 0
    final = [d for d in seen if d["done"] and d["table"] == "public.vals"]
    assert final and final[-1]["rows"] == res.tables["public.vals"]
    assert final[-1]["ranges_done"] == final[-1]["ranges"] and final[-1]["eta_s"] == 0
    assert (out / "_snapshot.json").exists() and not (out / sparksnap.PROGRESS).exists()
    assert json.loads((out / "public.vals" / sparksnap.TABLE_DONE).read_text())["rows"] == len(
        pq.read_table(out / "public.vals")
    )


def test_a_run_that_dies_leaves_no_complete_snapshot_and_a_rerun_starts_over(
    types_server,
    spark,  # noqa: F811
    tmp_path,
    caplog,
):
    srv, conn = types_server
    out = tmp_path / "snap"

    out.mkdir()
    (out / sparksnap.FAULTS).write_text(json.dumps({"public.vals": [0, 1, 2]}))
    with pytest.raises(Exception, match="injected failure"):
        take_snapshot(
            spark, srv.conninfo(), "dies_slot", ["pub"], out, table_attempts=1, progress=False
        )
    assert not (out / "_snapshot.json").exists()
    assert (out / sparksnap.PROGRESS).exists()  # what the next run reads
    # the slot of a failed run is dropped; a killed run's would be left: make one
    assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
    conn.execute("SELECT pg_create_logical_replication_slot('dies_slot', 'pgoutput')")
    (out / sparksnap.FAULTS).unlink()
    with caplog.at_level(logging.WARNING, logger="pgcdc.snapshot.server"):
        res = take_snapshot(spark, srv.conninfo(), "dies_slot", ["pub"], out, progress=False)
    assert "starting over" in caplog.text and "exported snapshot ended" in caplog.text
    conn.execute("SELECT pg_drop_replication_slot('dies_slot')")
    assert (out / "_snapshot.json").exists()
    assert res.tables["public.vals"] == conn.execute("SELECT count(*) FROM vals").fetchone()[0]


def test_dates_and_timestamps_checked_in_arrow_read_again_with_the_server(types_server):
    """The fast reader checks dates and timestamps in Arrow (no predicate on the server): a
    range holding one out of Spark's range raises Recheck for exactly the columns that hold
    such values, and read again with the server checking them it gives the batches of the
    reader whose server checks every such column."""
    from pyspark.sql.pandas.types import to_arrow_schema

    import pyarrow as pa

    from pgcdc.snapshot.binary_copy import _BOUNDS, RangeReader, Recheck

    srv, conn = types_server
    tables = pgsnap.list_published_tables(conn, ["pub"])
    t = next(t for t in tables if t.table == "vals")
    catalog = pgsnap.make_catalog(pgsnap.catalog_docs(conn, tables))
    schema = to_arrow_schema(table_schema(t), timezone="UTC")
    rng = pgsnap.TableRange(t, 0, 0, None)
    out_of_range = set()
    for c in t.columns:
        if c.type_oid in _BOUNDS:
            typ = {1082: "date", 1114: "timestamp", 1184: "timestamptz"}[c.type_oid]
            lo, hi = ("0001-01-01", "10000-01-01") if typ != "timestamptz" else (
                "0001-01-01 00:00:00+00", "10000-01-01 00:00:00+00")  # fmt: skip
            col = pgsnap.quote_ident(c.name)
            n = conn.execute(
                f"SELECT count(*) FROM vals WHERE {col} < '{lo}'::{typ} OR {col} >= '{hi}'::{typ}"
            ).fetchone()[0]
            if n:
                out_of_range.add(c.name)
    assert out_of_range  # infinity, BC and year-10000 values

    with psycopg_snapshot(srv) as snapshot:
        safe = RangeReader(t, schema, 0, catalog=catalog)
        want = pa.Table.from_batches(list(safe.read(srv.conninfo(), snapshot, rng)), schema)
        reader = RangeReader(t, schema, 0, catalog=catalog, checked=())
        rechecked = set()
        while True:
            try:
                got = pa.Table.from_batches(list(reader.read(srv.conninfo(), snapshot, rng)))
                break
            except Recheck as r:
                assert r.columns and not r.columns & rechecked
                rechecked |= r.columns
                reader = reader.checking(r.columns)
    assert rechecked == out_of_range
    assert got.schema == want.schema
    for name in want.column_names:  # repr: NaN equals NaN
        assert repr(got[name].to_pylist()) == repr(want[name].to_pylist()), name


@contextlib.contextmanager
def psycopg_snapshot(srv):
    """An exported snapshot, alive while the block runs."""
    import psycopg

    with psycopg.connect(srv.conninfo()) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        yield holder.execute("SELECT pg_export_snapshot()").fetchone()[0]


def test_jsonb_compaction_equals_orjson_on_random_documents():
    """jsonb's text (', ' and ': ' between items) made compact in Arrow equals orjson's
    rendering, on documents whose strings hold quotes, runs of backslashes, ', ' and ': '."""
    import random

    import numpy as np
    import orjson
    import pyarrow as pa

    from pgcdc.snapshot.binary_copy import _compact_json

    rnd = random.Random(27)
    chars = ['"', "\\", ",", ":", " ", "a", "{", "}", "[", "]", "\n", "ü"]

    def doc(depth=0):
        r = rnd.random()
        if depth > 3 or r < 0.3:
            return "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 8)))
        if r < 0.5:
            return rnd.randint(-5, 5)
        if r < 0.75:
            return [doc(depth + 1) for _ in range(rnd.randint(0, 4))]
        return {doc(4): doc(depth + 1) for _ in range(rnd.randint(0, 4))}

    docs = [doc() for _ in range(5000)]
    texts = [json.dumps(d, ensure_ascii=False, separators=(", ", ": ")) for d in docs]
    want = [orjson.dumps(d).decode() for d in docs]
    arr = pa.array(texts + [None])
    assert _compact_json(pa, np, arr).to_pylist() == want + [None]
    for offset in (1, 7, 333):  # slices: buffers not from 0
        assert _compact_json(pa, np, arr[offset:]).to_pylist() == want[offset:] + [None]


def test_a_killed_run_is_started_over_and_says_why(types_server, spark, tmp_path, caplog):  # noqa: F811
    """``pgcdc snapshot`` SIGKILLed between its two tables (public.custom written, public.vals
    under way): no _snapshot.json, the progress file and the finished table's marker stay,
    the slot is left behind. A rerun on the same directory and slot says why it starts over
    (the exported snapshot died with the run) and how far the dead run got, drops the dead
    run's slot once the server has let go of it, and writes a complete snapshot."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    srv, conn = types_server
    out = tmp_path / "snap"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcdc", "snapshot", "--dsn", srv.conninfo(), "--slot",
         "killed_slot", "--publication", "pub", "--out", str(out), "--cores", "1",
         "--blocks-per-range", "1"],
        cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    first = out / "public.custom" / sparksnap.TABLE_DONE
    try:

        def finished():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            return first.exists()

        until("the first table finished", finished, 240, 0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not (out / "_snapshot.json").exists()
    assert (out / sparksnap.PROGRESS).exists()
    assert not (out / "public.vals" / sparksnap.TABLE_DONE).exists()
    slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'killed_slot'"
    assert conn.execute(slots).fetchone()[0] == 1

    with caplog.at_level(logging.WARNING, logger="pgcdc.snapshot.server"):
        res = take_snapshot(spark, srv.conninfo(), "killed_slot", ["pub"], out, progress=False)
    assert "1 of 2 tables finished" in caplog.text and "starting over" in caplog.text
    assert "exported snapshot ended with the run that made it" in caplog.text
    assert (out / "_snapshot.json").exists() and not (out / sparksnap.PROGRESS).exists()
    assert res.tables["public.vals"] == conn.execute("SELECT count(*) FROM vals").fetchone()[0]
    assert conn.execute(slots).fetchone()[0] == 1  # the new run's
    conn.execute("SELECT pg_drop_replication_slot('killed_slot')")
