"""Typed values against real PostgreSQL 15-18: a table with a column of every built-in type
(and an array of it), rows of edge values, captured through a pgoutput slot in text and in
binary mode, decoded with the codec and loaded with ``pgcdc.values.RowLoader``.

Checked per server, with the server as the independent source:
(a) the text slot and the binary slot give equal values;
(b) ``dumps_row`` of each row equals ``SELECT to_jsonb(t)`` (both parsed, numbers as Decimal);
(c) each value equals what psycopg returns for a plain SELECT of that column, where psycopg
    can load it (psycopg raises on infinity/BC dates: those must be OutOfRange here).

One server start per version (module scope); a missing server is a failure, not a skip.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pgoutput_codec as pgc  # noqa: E402

from pgcdc.values import (  # noqa: E402
    UNCHANGED,
    Catalog,
    OutOfRange,
    RowLoader,
    ValueLoadError,
    dumps_row,
    to_json_value,
)
from pgcdc.values._json import dumps_row_stdlib  # noqa: E402
from tests.postgres import capture, servers  # noqa: E402
from tests.support.values_live import (  # noqa: E402
    BIG,
    CUSTOM_ROWS,
    CUSTOM_SQL,
    NO_ARRAY,
    _array_literal,
    _column_types,
    _has_xml,
)  # noqa: E402


# reg* types send their OID in binary and their name in text: see pgcdc.values' docstring.
REG_TYPES = {
    "regproc",
    "regprocedure",
    "regoper",
    "regoperator",
    "regclass",
    "regtype",
    "regconfig",
    "regdictionary",
    "regnamespace",
    "regrole",
    "regcollation",
}


@dataclass
class Custom:
    names: list[str]
    oids: list[int]
    catalog: Catalog
    text_rows: list  # TupleColumns per row
    binary_rows: list
    server_json: list[dict]


@dataclass
class Captured:
    major: int
    names: list[str]  # column names (including "id")
    sql_types: dict[str, str]  # column name -> SQL type
    oids: list[int]
    text_rows: list[tuple]  # loaded values of each inserted row, text slot
    binary_rows: list[tuple]
    binary_kinds: list[str]  # kinds of each binary row's columns, e.g. "tbb..."
    update_text: tuple  # the row of the UPDATE that left the big TOASTed text unchanged
    update_binary: tuple
    server_json: list[dict]  # SELECT to_jsonb(t) per row, parsed with Decimal numbers
    select_values: list[dict]  # per row: column -> (psycopg's value or its error, text)
    custom: Custom
    # RowLoader.load_rows (the chunk path) of each row alone, then of all rows at once:
    # (rows, or None where it leaves them to load, or the exception it raised), per slot
    column_wise: dict = None


def _decimal_json(text: str):
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _rows_from(records, protocol_version: int, table: str) -> tuple[list[int], list, list]:
    """(type OIDs, inserted TupleData, update TupleData) of ``table`` from one slot."""
    oids, rel_oid, inserts, updates = None, None, [], []
    for rec in records:
        msg = pgc.decode(rec.data, protocol_version=protocol_version)
        if isinstance(msg, pgc.Relation) and msg.relation_name == table:
            oids, rel_oid = [c.type_oid for c in msg.columns], msg.relation_oid
        elif isinstance(msg, pgc.Insert) and msg.relation_oid == rel_oid:
            inserts.append(msg.new_tuple)
        elif isinstance(msg, pgc.Update) and msg.relation_oid == rel_oid:
            updates.append(msg.new_tuple)
    assert oids is not None, f"no Relation message for table {table}"
    return oids, inserts, updates


def _capture(pg, key: str) -> Captured:
    with pg.database(key) as srv, srv.connect() as conn:
        major = srv.major
        cols = _column_types(major, _has_xml(conn))
        sql_types = {name: t for name, t, _ in cols}
        ddl = ["id int PRIMARY KEY"]
        for name, sql_type, _ in cols:
            ddl.append(f"{name} {sql_type}")
            if sql_type not in NO_ARRAY:
                ddl.append(f"{name}_a {sql_type}[]")
                sql_types[f"{name}_a"] = f"{sql_type}[]"
        conn.execute(f"CREATE TABLE vals ({', '.join(ddl)})")
        for stmt in CUSTOM_SQL:
            conn.execute(stmt)
        conn.execute("CREATE PUBLICATION pub FOR TABLE vals, custom")
        conn.execute("SELECT pg_create_logical_replication_slot('vals', 'pgoutput')")
        nrows = max(max(len(lits) for _, _, lits in cols), 6)
        with conn.transaction():
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
        for stmt in CUSTOM_ROWS:
            conn.execute(stmt)
        big_col = next(name for name, _, lits in cols if BIG in lits)
        big_row = next(lits.index(BIG) for _, _, lits in cols if BIG in lits)
        conn.execute(f"UPDATE vals SET c0 = NOT c0 WHERE id = {big_row}")
        opts = dict(protocol_version=1, origin="any" if major >= 16 else None, messages=False)
        text_recs = capture.sql_capture(conn, "vals", capture.Options(**opts))
        bin_recs = capture.sql_capture(conn, "vals", capture.Options(binary=True, **opts))
        server_json = [
            _decimal_json(r[0])
            for r in conn.execute("SELECT to_jsonb(t)::text FROM vals t ORDER BY id").fetchall()
        ]
        catalog = Catalog.from_connection(conn)
        reg_names = _reg_names(conn)
        custom_json = [
            _decimal_json(r[0])
            for r in conn.execute("SELECT to_jsonb(r)::text FROM custom r ORDER BY id").fetchall()
        ]
        names = ["id"] + [n for name, _, _ in cols for n in (name, f"{name}_a") if n in sql_types]
        select_values = [{} for _ in range(nrows)]
        for name in names:
            # format() calls the output function (a cast to text would trim char(n))
            texts = conn.execute(f"SELECT format('%s', {name}) FROM vals ORDER BY id").fetchall()
            try:
                column = [r[0] for r in conn.execute(f"SELECT {name} FROM vals ORDER BY id")]
            except Exception:  # psycopg cannot load a value (infinity, BC, ...): row by row
                column = []
                for row in range(nrows):
                    try:
                        sql = f"SELECT {name} FROM vals WHERE id = {row}"
                        column.append(conn.execute(sql).fetchone()[0])
                    except Exception as err:
                        column.append(err)
            for row in range(nrows):
                select_values[row][name] = (column[row], texts[row][0])

    oids, text_inserts, text_updates = _rows_from(text_recs, 1, "vals")
    boids, bin_inserts, bin_updates = _rows_from(bin_recs, 1, "vals")
    assert oids == boids
    loader = RowLoader(oids, catalog=reg_names)
    text_rows = [loader.load(t.columns) for t in text_inserts]
    binary_rows = [loader.load(t.columns) for t in bin_inserts]
    unnamed = RowLoader(oids)  # no catalog: a binary reg* value is an OID nobody can name
    with pytest.raises(ValueLoadError, match="no catalog to name it"):
        for t in bin_inserts:
            unnamed.load(t.columns)
    column_wise = {
        "text": _column_wise(RowLoader(oids, catalog=reg_names), text_inserts),
        "binary": _column_wise(RowLoader(oids, catalog=reg_names), bin_inserts),
    }
    kinds = ["".join(c.kind for c in t.columns) for t in bin_inserts]
    assert len(text_updates) == len(bin_updates) == 1
    upd_t, upd_b = loader.load(text_updates[0].columns), loader.load(bin_updates[0].columns)
    assert names.index(big_col) > 0
    c_oids, c_text, _ = _rows_from(text_recs, 1, "custom")
    _, c_bin, _ = _rows_from(bin_recs, 1, "custom")
    custom = Custom(
        names=["id", "m", "p", "n", "t", "ms", "ps", "pr"],
        oids=c_oids,
        catalog=catalog,
        text_rows=[t.columns for t in c_text],
        binary_rows=[t.columns for t in c_bin],
        server_json=custom_json,
    )
    return Captured(
        major,
        names,
        sql_types,
        oids,
        text_rows,
        binary_rows,
        kinds,
        (big_col, upd_t),
        (big_col, upd_b),
        server_json,
        select_values,
        custom,
        column_wise,
    )


_REG_CATALOGS = {
    "regclass": "pg_class", "regtype": "pg_type", "regproc": "pg_proc",
    "regprocedure": "pg_proc", "regoper": "pg_operator", "regoperator": "pg_operator",
    "regconfig": "pg_ts_config", "regdictionary": "pg_ts_dict", "regnamespace": "pg_namespace",
    "regrole": "pg_authid", "regcollation": "pg_collation",
}  # fmt: skip


def _reg_names(conn) -> Catalog:
    """A catalog naming every object a reg* value can name, the way a text slot prints it (the
    server's own output functions): what ``pgcdc capture`` records for the OIDs it sees."""
    cat = Catalog()
    for reg, table in _REG_CATALOGS.items():
        typ = conn.execute(f"SELECT '{reg}'::regtype::oid::int8").fetchone()[0]
        rows = conn.execute(f"SELECT oid::int8, oid::{reg}::text FROM {table}").fetchall()
        cat.reg_names[typ] = dict(rows)
    return cat


def _column_wise(loader: RowLoader, inserts) -> tuple[list, object]:
    def load(tuples):
        kinds = [c.kind for t in tuples for c in t.columns]
        values = [c.value for t in tuples for c in t.columns]
        try:
            return loader.load_rows(kinds, values, len(tuples))
        except Exception as e:  # noqa: BLE001 (the chunk path then loads row by row)
            return e

    return [load([t]) for t in inserts], load(inserts)


@pytest.fixture(scope="module", params=servers.SERVER_KEYS)
def captured(pg, request) -> Captured:
    return _capture(pg, request.param)


def _type_of(cap: Captured, name: str) -> str:
    return "int4" if name == "id" else cap.sql_types[name]


def _is_reg(cap: Captured, name: str) -> bool:
    return _type_of(cap, name).rstrip("[]") in REG_TYPES


def test_column_wise_loads_give_what_row_loads_give(captured):
    """The chunk path loads a run of rows a column at a time (RowLoader.load_rows) and falls
    back to load() where it gives up or raises. It gives up only on rows holding a value
    Python cannot (OutOfRange: infinity, BC, years past 9999; some of which its loaders
    give too), and elsewhere every value of every type is the one load() gives."""
    for slot, rows in (("text", captured.text_rows), ("binary", captured.binary_rows)):
        singles, together = captured.column_wise[slot]
        for row, (want, got) in enumerate(zip(rows, singles)):
            odd = _out_of_range(want)
            if got is None or isinstance(got, Exception):
                assert odd, f"{slot} row {row}: left to load() ({got!r}) with nothing odd"
                continue
            assert len(got) == 1
            for name, w, g in zip(captured.names, want, got[0]):
                assert _same(w, g), f"{slot} row {row} {name}: {g!r} != {w!r}"
        assert any(not _out_of_range(r) for r in rows)
        if together is not None and not isinstance(together, Exception):
            assert len(together) == len(rows)
            for want, got in zip(rows, together):
                assert all(map(_same, want, got))


def _out_of_range(value) -> list:
    """The OutOfRange values in a loaded row (arrays and ranges included)."""
    if isinstance(value, OutOfRange):
        return [value]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _out_of_range(v)]
    return []


def test_slots_send_both_kinds(captured):
    """The binary slot really sends binary values, and text for types without a send
    function (aclitem), so mixed rows are exercised."""
    kinds = "".join(captured.binary_kinds)
    assert "b" in kinds and "t" in kinds and "n" in kinds
    mixed = [k for k in captured.binary_kinds if "b" in k and "t" in k]
    assert mixed, "expected rows that mix text and binary columns"


def test_text_and_binary_slots_give_equal_values(captured):
    diffs = []
    for row, (t_row, b_row) in enumerate(zip(captured.text_rows, captured.binary_rows)):
        for name, t, b in zip(captured.names, t_row, b_row):
            if not _same(t, b):
                diffs.append(f"row {row} {name} ({_type_of(captured, name)}): {t!r} != {b!r}")
    assert not diffs, "\n".join(diffs)


def test_json_equals_to_jsonb(captured):
    for label, rows in (("text", captured.text_rows), ("binary", captured.binary_rows)):
        diffs = []
        for row, (values, expected) in enumerate(zip(rows, captured.server_json)):
            got = _decimal_json(dumps_row(captured.names, values, captured.oids))
            stdlib = _decimal_json(dumps_row_stdlib(captured.names, values, captured.oids))
            if stdlib != got:
                diffs.append(f"{label} row {row}: the stdlib dumper differs from orjson's")
            for name in captured.names:
                if got.get(name) != expected.get(name):
                    diffs.append(
                        f"{label} row {row} {name} ({_type_of(captured, name)}): "
                        f"{got.get(name)!r} != server {expected.get(name)!r}"
                    )
        assert not diffs, "\n".join(diffs)


def _to_float(v):
    """psycopg's plain json loader gives floats where RowLoader keeps Decimals."""
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, list):
        return [_to_float(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_float(x) for k, x in v.items()}
    return v


def test_values_equal_psycopg_select(captured):
    diffs = []
    psycopg_failed = 0
    for row, (values, selected) in enumerate(zip(captured.text_rows, captured.select_values)):
        for name, value in zip(captured.names, values):
            expected, server_text = selected[name]
            sql_type = _type_of(captured, name)
            if isinstance(value, OutOfRange):
                # psycopg raises, or (interval) wraps around or gives 0 for infinity
                psycopg_failed += 1
                if value.text != server_text:
                    diffs.append(f"row {row} {name}: {value!r}, server text {server_text!r}")
                continue
            if isinstance(expected, Exception) or _contains_out_of_range(value):
                psycopg_failed += 1
                if not _contains_out_of_range(value):
                    diffs.append(f"row {row} {name}: psycopg raised {expected!r}, got {value!r}")
                continue
            if isinstance(expected, str) and not isinstance(value, str):
                # psycopg does not know the type (pg_snapshot): it gives the text
                assert sql_type == "pg_snapshot[]", (name, sql_type, value)
                continue
            if isinstance(value, str) and value != server_text and "json" not in sql_type:
                diffs.append(f"row {row} {name}: {value!r} != server text {server_text!r}")
            if sql_type in ("json", "jsonb", "json[]", "jsonb[]"):
                value = _to_float(value)
            if not _same(value, expected):
                diffs.append(f"row {row} {name} ({sql_type}): {value!r} != psycopg {expected!r}")
    assert psycopg_failed > 0  # the edge values psycopg cannot load are in the table
    assert not diffs, "\n".join(diffs)


def test_unchanged_toast_is_not_null(captured):
    """The UPDATE left TOASTed columns alone (the big text, and wide arrays the server moved
    out of line): they are UNCHANGED, the same ones in both slots, and none was NULL."""
    (big_col, t_row), (_, b_row) = captured.update_text, captured.update_binary
    i = captured.names.index(big_col)
    assert t_row[i] is UNCHANGED and b_row[i] is UNCHANGED
    t_unchanged = [n for n, v in zip(captured.names, t_row) if v is UNCHANGED]
    assert t_unchanged == [n for n, v in zip(captured.names, b_row) if v is UNCHANGED]
    big_row = next(r for r in captured.text_rows if r[i] is not None and len(r[i]) > 100_000)
    for name in t_unchanged:
        assert big_row[captured.names.index(name)] is not None, name
    assert t_row[0] == big_row[0] and t_row[0] is not None
    with pytest.raises(ValueError, match="UNCHANGED"):
        to_json_value(t_row[i])


def _contains_out_of_range(value) -> bool:
    if isinstance(value, OutOfRange):
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains_out_of_range(v) for v in value)
    for attr in ("lower", "upper"):
        if isinstance(getattr(value, attr, None), OutOfRange):
            return True
    if hasattr(value, "__iter__") and type(value).__name__ == "Multirange":
        return any(_contains_out_of_range(r) for r in value)
    return False


def _same(a, b) -> bool:
    """Equality that also holds for NaN (float and Decimal) and checks types match."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, Decimal) and isinstance(b, Decimal) and a.is_nan() and b.is_nan():
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return format(a, "f") == format(b, "f")
    related = isinstance(a, type(b)) or isinstance(b, type(a))
    return (related or _numbers(a, b)) and a == b


def _numbers(a, b) -> bool:
    return isinstance(a, (int, float, Decimal)) and isinstance(b, (int, float, Decimal))


def test_catalog_types(captured):
    """With the catalog (as pgcdc capture records it), enums, domains, composites and their
    arrays load the same from both slots and render as to_jsonb does; without one, no value
    of those types loads (lenient reading keeps the raw value and says why)."""
    c = captured.custom
    typed = RowLoader(c.oids, catalog=c.catalog)
    plain = RowLoader(c.oids)
    for t_cols, b_cols, expected in zip(c.text_rows, c.binary_rows, c.server_json):
        t, b = typed.load(t_cols), typed.load(b_cols)
        for name, tv, bv in zip(c.names, t, b):
            assert _same(tv, bv), (name, tv, bv)
        assert _decimal_json(dumps_row(c.names, t, c.oids)) == expected
        for cols in (t_cols, b_cols):
            if any(col.kind != "n" for col in cols[1:]):
                with pytest.raises(ValueLoadError, match="does not describe it"):
                    plain.load(cols)
            values, errors = plain.load_lenient(cols)
            assert [e.column for e in errors] == [
                i for i, col in enumerate(cols) if i and col.kind != "n"
            ]
    first = typed.load(c.text_rows[0])
    assert first[1:7] == (
        "ok",
        5,
        Decimal("1.50"),
        OutOfRange(1184, "infinity"),
        ["sad", None, "happy ü"],
        [1, 2],
    )
