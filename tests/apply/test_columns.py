"""Column names that PostgreSQL takes and Spark or Delta Lake do not take as they are (issue
61): dots, spaces, quotes, backticks, case (``"Id"`` beside ``id``), non-ASCII, reserved
words, 63 bytes, the characters Delta keeps out of names (`` ,;{}()\\n\\t=``) and ``%``; a
key of such a name, REPLICA IDENTITY DEFAULT and FULL, and a table without a key.

On a real PostgreSQL 18 (one server for the module), a workload of two phases (inserts,
updates, an unchanged TOAST value of such a column, deletes, a key change) captured by
``pgcdc capture``:

- ``pgcdc changes``: every change line names the columns exactly as the server does;
- Delta Lake tables by ``pgcdc apply`` (its CLI) after phase 1 and ``apply_changes`` after
  phase 2, and history (SCD2: its current rows): every table, read by
  delta-rs with each renamed column's recorded name and by DuckDB with the stored names
  percent-decoded, equals the server's; the stored names are ones Delta takes, the table
  records its source (schema, table, OID);
- ``pgcdc sync`` from a snapshot of the tables, then writes while it runs (a cycle through
  Spark, then one the driver writes): the same; and ``pgcdc status`` reads its directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("deltalake")

from deltalake import DeltaTable  # noqa: E402

from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.spark.names import DELTA_REFUSED, FIELD_KEY  # noqa: E402
from tests.support.delta import duckdb_connect, duckdb_table  # noqa: E402
from tests.support.truth import _parquet_rows, _truth  # noqa: E402
from tests.support.sync import Sync  # noqa: E402
from tests.wait import WaitTimeout, until  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LONG = "ñ" * 31 + "z"  # 63 bytes, the longest name PostgreSQL keeps
COLUMNS = [  # (name, type); "note.text" holds a value stored out of line (TOAST)
    ("note.text", "text"), ("a b", "text"), ('a"b', "text"), ("x`y", "text"), ("Id", "int"),
    ("id", "int"), ("ñandú", "text"), ("列", "text"), ("select", "text"), ("order", "int"),
    ("w,;{}()=", "text"), ("tab\tnl\nx", "text"), ("%41", "text"), (LONG, "bigint"),
]  # fmt: skip
# primary keys; odd_full and odd_bag: REPLICA IDENTITY FULL (no key to apply: multisets)
# (odd's key: quoted in Spark for its dot, stored as "key.%20id" for its space)
KEYS = {"odd": "key. id", "odd_full": "Key Col", "odd_bag": None}
TABLES = tuple(KEYS)
# a sync cycle writes the three tables with Spark (unchanged TOAST and a table without a key
# are not for the driver's path): a minute or more on two cores that other tests share
CONVERGE_TIMEOUT = 240


def q(name: str) -> str:
    """A PostgreSQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def _create(table: str) -> list[str]:
    key = KEYS[table]
    cols = ([f"{q(key)} int PRIMARY KEY"] if key else []) + [f"{q(n)} {t}" for n, t in COLUMNS]
    out = [f"CREATE TABLE {table} ({', '.join(cols)})",
           f'ALTER TABLE {table} ALTER COLUMN "note.text" SET STORAGE EXTERNAL']  # fmt: skip
    if table != "odd":
        out.append(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    return out


def _insert(table: str, lo: int, hi: int) -> str:
    """Rows lo..hi; "note.text" over 2 kB, stored out of line uncompressed (EXTERNAL)."""
    key = KEYS[table]
    names = ([key] if key else []) + [n for n, _t in COLUMNS]
    values = (["g"] if key else []) + [
        "repeat('t', 3000) || g", "'a b ' || g", "'q' || g", "'`' || g", "g", "-g", "'ñ' || g",
        "'列' || g", "'sel'", "g * 10", "'w'", "E'\\t'", "'%41'", "g::bigint << 40",
    ]  # fmt: skip
    return (f"INSERT INTO {table} ({', '.join(map(q, names))}) SELECT {', '.join(values)} "
            f"FROM generate_series({lo}, {hi}) g")  # fmt: skip


def _where(table: str, n: int) -> str:
    return f"{q(KEYS[table] or 'Id')} = {n}"


def _phase1(table: str) -> list[str]:
    out = [
        _insert(table, 1, 6),
        # "note.text" unchanged: a TOAST value the update does not carry (DEFAULT), filled
        # from the insert in the same run
        f"UPDATE {table} SET \"a b\" = 'changed' WHERE {_where(table, 2)}",
        f'UPDATE {table} SET "Id" = 100, id = -100, "%41" = NULL WHERE {_where(table, 3)}',
        f"DELETE FROM {table} WHERE {_where(table, 4)}",
    ]
    if KEYS[table]:  # a key change (with a new "note.text": an unchanged one has no old row)
        out.append(f"UPDATE {table} SET {q(KEYS[table])} = 60, \"note.text\" = 'moved' "
                   f"WHERE {_where(table, 6)}")  # fmt: skip
    return out


def _phase2(table: str) -> list[str]:
    return [
        # "note.text" unchanged again: filled from the table's state of the first run
        f'UPDATE {table} SET "order" = "order" + 1, "列" = \'ph2\', {q(LONG)} = NULL '
        f"WHERE {_where(table, 1)} OR {_where(table, 5)}",
        f"DELETE FROM {table} WHERE {_where(table, 2)}",
        _insert(table, 7, 8),
    ]


def _capture(srv, capdir: Path, until: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "pgcdc", "capture", "--dsn", srv.conninfo(), "--slot", "cols",
         "--publication", "cols_pub", "--out", str(capdir), "--until-lsn", until,
         "--log-format", "json", "--no-fsync"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr


def _run(conn, statements) -> str:
    for stmt in statements:
        conn.execute(stmt)
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _truths(conn) -> dict:
    return {t: _truth(conn, t) for t in TABLES}


@pytest.fixture(scope="module")
def captured(pg, tmp_path_factory):
    """The server (still running), the captures after phase 1 (cap1) and 2 (cap) and the
    server's tables after each."""
    tmp = tmp_path_factory.mktemp("columns")
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("SET TimeZone = 'UTC'")
        _run(conn, [s for t in TABLES for s in _create(t)])
        conn.execute(f"CREATE PUBLICATION cols_pub FOR TABLE {', '.join(TABLES)}")
        conn.execute("SELECT pg_create_logical_replication_slot('cols', 'pgoutput')")
        _capture(srv, tmp / "cap", _run(conn, [s for t in TABLES for s in _phase1(t)]))
        truth1 = _truths(conn)
        shutil.copytree(tmp / "cap", tmp / "cap1")
        _capture(srv, tmp / "cap", _run(conn, [s for t in TABLES for s in _phase2(t)]))
        oids = {t: conn.execute("SELECT %s::regclass::oid", [t]).fetchone()[0] for t in TABLES}
        yield SimpleNamespace(srv=srv, conn=conn, cap1=tmp / "cap1", cap=tmp / "cap",
                              truth1=truth1, truth2=_truths(conn), oids=oids)  # fmt: skip


# --- reading the tables back -------------------------------------------------------------------


def _canon(table, truth_rows) -> list[str]:
    """A pyarrow table under PostgreSQL's names in the server's to_jsonb form."""
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(table, f"{tmp}/t.parquet")
        return _parquet_rows(f"{tmp}/t.parquet", truth_rows)


def _stored_names_taken_by_delta(names: list[str]) -> None:
    lower = [n.lower() for n in names]
    assert len(set(lower)) == len(lower), names
    assert not [n for n in names if set(n) & set(DELTA_REFUSED)], names


def _delta_rs(path: Path):
    """delta-rs' rows of a table under the names its schema records (each renamed field's
    metadata), checked to be its stored names percent-decoded."""
    dt = DeltaTable(str(path))
    recorded = {f.name: f.metadata.get(FIELD_KEY, f.name) for f in dt.schema().fields}
    assert recorded == {s: unquote(s) for s in recorded}, recorded
    _stored_names_taken_by_delta(list(recorded))
    table = dt.to_pyarrow_table()
    return table.rename_columns([recorded[c] for c in table.column_names])


def _duckdb(path: Path, con):
    """DuckDB's rows of a table, its names percent-decoded (the documented rule)."""
    table = duckdb_table(path, con)
    return table.rename_columns([unquote(c) for c in table.column_names])


def _short(row: str) -> dict:
    return {k: v[:20] if isinstance(v, str) else v for k, v in json.loads(row).items()}


def _same(got: list[str], expected: list[str], label: str) -> None:
    """got == expected, or say which rows differ (shortened: "note.text" is 3 kB)."""
    if got != expected:
        extra = [_short(r) for r in sorted(set(got) - set(expected))]
        missing = [_short(r) for r in sorted(set(expected) - set(got))]
        pytest.fail(f"{label}: rows not the server's {extra}; the server's not there {missing}")


def _equal_delta(out: Path, truth: dict, label: str, con=None) -> None:
    con = con or duckdb_connect()
    for t in TABLES:
        expected, rows = truth[t]
        path = out / f"public.{t}"
        _same(_canon(_delta_rs(path), rows), expected, f"{label}: {t} (delta-rs)")
        _same(_canon(_duckdb(path, con), rows), expected, f"{label}: {t} (DuckDB)")


def _apply_cli(cap: Path, out: Path) -> None:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    got = subprocess.run(
        [sys.executable, "-m", "pgcdc", "apply", str(cap), "--out", str(out), "--master",
         "local[2]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-4000:]


# --- the tests ---------------------------------------------------------------------------------


def test_changes_name_columns_exactly(captured):
    got = subprocess.run([sys.executable, "-m", "pgcdc", "changes", str(captured.cap)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    lines = [json.loads(x) for x in got.stdout.splitlines()]
    names = [n for n, _t in COLUMNS]
    for t in TABLES:
        mine = [e for e in lines if e["source"]["table"] == t]
        want = ([KEYS[t]] if KEYS[t] else []) + names
        inserts = [e for e in mine if e["op"] == "c"]
        assert inserts and all(list(e["after"]) == want for e in inserts), t
        deletes = [e for e in mine if e["op"] == "d"]
        assert deletes, t
        for e in deletes:  # the old row: the key (DEFAULT), or every column (FULL)
            assert list(e["before"]) == (want if t != "odd" else [KEYS[t]]), e
    # an update that leaves the TOAST value out says so by its exact name
    assert any("note.text" in (e.get("unchanged") or ()) for e in lines if e["op"] == "u")


def test_apply_delta_tables_equal_the_servers(captured, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    _apply_cli(captured.cap1, out)
    _equal_delta(out, captured.truth1, "phase 1")
    # on the tables of phase 1 (their rows read back by their names), in this process: a
    # second JVM's start is most of a CLI run's time here
    apply_changes(spark, [str(captured.cap)], out)
    con = duckdb_connect()
    _equal_delta(out, captured.truth2, "phase 2", con)
    doc = json.loads((out / "_pgcdc_state.json").read_text())
    for t in TABLES:
        dt = DeltaTable(str(out / f"public.{t}"))
        source = {"schema": "public", "table": t, "oid": captured.oids[t]}
        assert json.loads(dt.metadata().description) == {"pgcdc.source": source}
        assert dt.history(1)[0]["pgcdc.source"] == source
        entry = doc["tables"][f"public.{t}"]
        stored = [f.name for f in dt.schema().fields]
        assert entry["names"] == {s: unquote(s) for s in stored if unquote(s) != s}
        assert entry["columns"] == ([KEYS[t]] if KEYS[t] else []) + [n for n, _t in COLUMNS]
    # "Id" came first and keeps its name, id is stored apart from it; "a b" and "%41" encoded
    names = doc["tables"]["public.odd"]["names"]
    assert "Id" not in names and names["%69d"] == "id"
    assert names["a%20b"] == "a b" and names["%2541"] == "%41"
    status = subprocess.run([sys.executable, "-m", "pgcdc", "status", "--state", str(out),
                             "--json"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)


def test_apply_scd2_current_rows_equal_the_servers(captured, spark, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    keyed = ["odd"]  # apply keys a table by its DEFAULT identity: a FULL one has none
    for cap in (captured.cap1, captured.cap):
        apply_changes(spark, [str(cap)], out, scd=2, tables=keyed)
    for t in keyed:
        expected, rows = captured.truth2[t]
        history = _delta_rs(out / f"public.{t}")
        assert history.num_rows > len(expected)  # closed versions too
        current = history.filter(history.column("_is_current"))
        scd2 = ["_valid_from_lsn", "_valid_from_time", "_valid_to_lsn", "_valid_to_time"]
        _same(_canon(current.drop_columns([*scd2, "_is_current"]), rows), expected, t)


def _converged(conn, out: Path, sync: Sync) -> None:
    last = []

    def equal():
        try:
            _equal_delta(out, _truths(conn), "sync")
            return True
        except (Exception, pytest.fail.Exception) as e:  # no table yet, or not equal yet
            assert sync.proc.poll() is None, sync.log()
            last[:] = [e]
            return False

    try:
        until("the Delta tables equal to the server's", equal, CONVERGE_TIMEOUT, 0.1)
    except WaitTimeout:
        pytest.fail(f"not converged: {last[0]}\n{sync.log()}")


def test_sync_keeps_the_tables(captured, tmp_path):
    srv, conn = captured.srv, captured.conn
    conn.execute(f"CREATE PUBLICATION sync_pub FOR TABLE {', '.join(TABLES)}")
    out = tmp_path / "sync"
    sync = Sync(srv, out, slot="sync_slot", publication="sync_pub")
    try:
        sync.wait_for("ready")  # a snapshot of the tables, loaded
        _converged(conn, out, sync)
        # while it runs, in one transaction (one cycle): inserts, updates leaving the TOAST
        # value out, deletes, a key change
        with conn.transaction():
            for t in TABLES:
                _run(conn, [_insert(t, 20, 22),
                            f"UPDATE {t} SET \"select\" = 'upd' WHERE {_where(t, 20)}",
                            f"UPDATE {t} SET \"order\" = -1 WHERE {_where(t, 5)}",
                            f"DELETE FROM {t} WHERE {_where(t, 21)}"])  # fmt: skip
            conn.execute(f"UPDATE odd SET {q(KEYS['odd'])} = 2200, \"note.text\" = 'k' "
                         f"WHERE {_where('odd', 22)}")  # fmt: skip
        _converged(conn, out, sync)
        # a cycle of inserts and deletes only: the driver writes odd's files (with pyarrow,
        # under the stored names) rather than Spark
        _run(conn, [_insert("odd", 30, 32), f"DELETE FROM odd WHERE {_where('odd', 31)}"])
        _converged(conn, out, sync)
        doc = json.loads((out / "_pgcdc_state.json").read_text())
        assert doc["tables"]["public.odd"].get("applied_by") == "driver", doc["tables"]
        assert sync.stop() == 0, sync.log()
    finally:
        if sync.proc.poll() is None:
            sync.stop()
    status = subprocess.run([sys.executable, "-m", "pgcdc", "status", str(out), "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert "public.odd" in status.stdout
