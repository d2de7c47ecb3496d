"""Apply of the catalog workload of :mod:`tests.capture.test_capture_catalog` (real PostgreSQL 15 and
18, text and binary slots): typed columns for the types that are not built in, the defaults
of columns added after rows existed, and incremental runs over new segments alone. The truth
is the server's ``to_jsonb(row)``."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import time

from pgcdc.capture import segments
from pgcdc.lsn import parse_lsn
from pgcdc.capture.files import iter_raw
from tests.support.catalog import segmented_capture
from tests.wait import until  # noqa: E402


def _applied(out, table="public.t") -> dict:
    from tests.support.delta import read_table

    return {r["id"]: r for r in read_table(out / table).to_pylist()}


def _as_json(value):
    """A Parquet value (pyarrow's Python form) as to_jsonb writes it, for these columns."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    return value


def test_apply_types_the_columns_and_fills_the_defaults(captured, spark, tmp_path):  # noqa: F811
    """Applied from a text and a binary capture, every row equals the server's to_jsonb(row):
    the composite a struct, the enum and composite arrays arrays, the domain its base type,
    reg* names; rows written before ADD COLUMN ... DEFAULT hold the default, as on the server."""
    from pyspark.sql import types as T

    from pgcdc.apply.run import apply_changes
    from pgcdc.spark.changes import change_events

    root, truth, _ = captured
    for name in ("text", "bin"):
        schema = change_events(spark, [root / name]).tables["public.t"]
        assert isinstance(schema.spark_type("p"), T.StructType)
        assert schema.spark_type("p")["m"].dataType == T.StringType()
        assert schema.spark_type("ms") == T.ArrayType(T.StringType())
        assert isinstance(schema.spark_type("ps").elementType, T.StructType)
        assert schema.spark_type("d") == T.IntegerType()  # posint, a domain over int
        out = tmp_path / name
        apply_changes(spark, [root / name], out)
        rows = _applied(out)
        assert sorted(rows) == sorted(truth)
        for i, want in truth.items():
            got = {k: _as_json(v) for k, v in rows[i].items() if not k.startswith("_")}
            assert got == want, (name, i)
            assert not rows[i]["_pg_text"], (name, i)


def _more_until_segments(conn, out, n: int, sql: str, first: int, timeout: float = 60) -> None:
    """Run ``sql`` (its key ``%(i)s``) from key ``first`` one by one, paced, until ``out`` has
    ``n`` segments."""
    keys = itertools.count(first)

    def enough():
        if len(segments.list_segments(out)) >= n:
            return True
        conn.execute(sql, {"i": next(keys)})
        return False

    until(f"{n} segments", enough, timeout, 0.01)


def test_apply_over_new_segments_alone_equals_apply_over_all(pg, spark, tmp_path):  # noqa: F811
    """One capture session cut into many segments; a first apply run reads the segments
    before an ALTER TABLE ... ADD COLUMN ... DEFAULT, a second run only the ones after,
    from a copy whose first segments and relations.jsonl are gone (pruned): the state
    carries the Relation messages. Both runs give what one run over every segment gives,
    and the server's rows (the rows from before the column hold its default)."""
    from pgcdc.apply.run import apply_changes

    with pg.database("pg18") as srv, srv.connect() as conn:
        out = tmp_path / "cap"
        proc = segmented_capture(srv, conn, out)
        before = "INSERT INTO t (id, m, p) VALUES (%(i)s, 'ok', ROW(%(i)s, 'x', 'sad'))"
        for i in range(10, 150):
            conn.execute(before, {"i": i})
            time.sleep(0.003)
        # a capture that started late (a busy machine) read those in one flush, one segment:
        # more rows, paced, until three segments are closed before the ALTER
        _more_until_segments(conn, out, 4, before, 1000)
        split = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        conn.execute("ALTER TABLE t ADD COLUMN extra text DEFAULT 'd'")
        for i in range(150, 250):
            conn.execute("INSERT INTO t (id, m, ms) VALUES (%s, 'sad', '{ok}')", [i])
            conn.execute("UPDATE t SET m = 'happy' WHERE id = %s", [i - 130])
            time.sleep(0.003)
        after = "INSERT INTO t (id, m, ms) VALUES (%(i)s, 'sad', '{ok}')"
        _more_until_segments(conn, out, len(segments.list_segments(out)) + 3, after, 2000)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        truth = {
            r[0]: json.loads(r[1])
            for r in conn.execute("SELECT id, to_jsonb(t)::text FROM t").fetchall()
        }
    segs = segments.list_segments(out)
    starts = [int(segments.SEGMENT_RE.fullmatch(s.name).group(2), 16) for s in segs]
    k = sum(1 for nxt in starts[1:] if nxt <= split)  # segments wholly before the ALTER
    assert 2 <= k < len(segs) - 2, (k, len(segs))
    whole = tmp_path / "whole"
    apply_changes(spark, [out], whole)
    inc = tmp_path / "inc"
    first = apply_changes(spark, segs[:k], inc)
    assert first.run["files_read"] == [str(s) for s in segs[:k]]
    pruned = tmp_path / "pruned"
    shutil.copytree(out, pruned)
    for s in segs[:k]:
        (pruned / s.name).unlink()
    (pruned / "relations.jsonl").unlink()
    rest = sorted(str(pruned / s.name) for s in segs[k:])
    second = apply_changes(spark, rest, inc)
    # a segment the capture opened at its last rotation may hold no record yet: not read
    assert second.run["files_read"] == [p for p in rest if any(True for _ in iter_raw(p))]
    a, b = _applied(whole), _applied(inc)
    assert sorted(a) == sorted(b) == sorted(truth)
    for i, want in truth.items():
        got = {k: _as_json(v) for k, v in b[i].items() if not k.startswith("_")}
        assert got == want, i
        assert {k: v for k, v in a[i].items() if k != "_tx_ordinal"} == {
            k: v for k, v in b[i].items() if k != "_tx_ordinal"
        }
    assert b[10]["extra"] == "d" and b[200]["extra"] == "d"


def test_apply_without_the_catalog_refuses_or_keeps_raw_and_reports(captured, tmp_path):  # noqa: F811
    """A binary capture without its catalog.jsonl: apply stops naming the column, the type
    and the remedy; with --lenient it keeps the raw value in _pg_text and says how many."""
    from tests.support.delta import read_table

    root, _, oids = captured
    bare = tmp_path / "bare"
    shutil.copytree(root / "bin", bare)
    (bare / "catalog.jsonl").unlink()

    def apply(*extra):
        return subprocess.run([sys.executable, "-m", "pgcdc", "apply", str(bare), "--out",
                               str(tmp_path / "out"), "--master", "local[1]", *extra],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    run = apply()
    assert run.returncode == 1, run.stderr
    err = run.stderr.strip().splitlines()[-1]
    assert "column 'm'" in err and f"oid {oids['mood']}" in err and "catalog" in err, err
    assert not (tmp_path / "out" / "public.t" / "_delta_log").exists()
    run = apply("--lenient")
    assert run.returncode == 0, run.stderr
    summary = [x for x in run.stderr.splitlines() if "kept raw" in x]
    assert len(summary) == 1 and "public.t:" in summary[0], run.stderr
    assert f"oid {oids['mood']}" in summary[0] and "at LSN" in summary[0]
    rows = {r["id"]: r for r in read_table(tmp_path / "out" / "public.t").to_pylist()}
    assert rows[1]["m"] is None and dict(rows[1]["_pg_text"])["m"] == "\\x" + b"ok".hex()
