"""What the stream leaves out, recorded by ``pgcdc capture`` (catalog.jsonl) and used by every
reader: real PostgreSQL 15 and 18, one workload captured by a text slot and a binary slot
created at the same point.

The truth is the server: each row's ``to_jsonb`` for the values, and a text slot for what a
binary slot must give byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pgcdc.capture import segments
from pgcdc.capture.catalog import CATALOG_FILE, read_catalog_lines
from pgcdc.lsn import parse_lsn
from tests.support.catalog import segmented_capture  # noqa: E402
from tests.wait import until  # noqa: E402


def _changes(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgcdc", "changes", *map(str, args)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_catalog_describes_the_types_and_the_added_default(captured):
    root, _, oids = captured
    for name in ("text", "bin"):
        lines = read_catalog_lines(root / name)
        types = {t["oid"]: t for line in lines for t in line.get("types", ())}
        assert types[oids["mood"]]["kind"] == "enum"
        assert types[oids["mood"]]["labels"][:3] == ["sad", "ok", "happy"]
        assert types[oids["pair"]]["fields"] == [["a", 23], ["b", 25], ["m", oids["mood"]]]
        assert types[oids["posint"]]["base_oid"] == 23
        assert types[oids["nice"]]["base_oid"] == oids["mood"]
        assert types[oids["floatrange"]]["subtype_oid"] == 701
        missing = [line["missing"] for line in lines if line.get("missing")]
        assert missing == [{"extra": "d"}]
        # durable with the data: nothing past what state.json says is durable
        durable = segments.read_state(root / name).lsn
        assert all(parse_lsn(line["lsn"]) <= durable for line in lines)
    # a binary slot's reg* OIDs are named as the text slot sends them; a text slot needs none
    reg = {
        k: v for line in read_catalog_lines(root / "bin") for k, v in line.get("reg", {}).items()
    }
    assert sorted(reg) == ["2205", "2206"] and "t" in reg["2205"].values()
    assert {"pair", "integer", "mood", "text"} <= set(reg["2206"].values())
    assert not any("reg" in line for line in read_catalog_lines(root / "text"))
    assert not (root / "plain" / CATALOG_FILE).exists()  # built-in types only: nothing


def test_text_and_binary_captures_print_the_same_changes(captured):
    root, _, _ = captured
    text, binary = _changes(root / "text"), _changes(root / "bin")
    assert text.returncode == binary.returncode == 0, (text.stderr, binary.stderr)
    assert text.stdout.count("\n") == 6
    assert binary.stdout == text.stdout


def test_values_equal_to_jsonb(captured):
    root, truth, _ = captured
    last = {}
    for line in _changes(root / "bin").stdout.splitlines():
        ev = json.loads(line)
        last[ev["after"]["id"]] = ev
    for i, ev in last.items():
        want = dict(truth[i])
        for column in ev["unchanged"]:
            want.pop(column)
        if "extra" not in ev["after"]:  # rows written before ADD COLUMN (see apply)
            want.pop("extra")
        assert ev["after"] == want, i


def test_columns_say_the_default_rows_before_the_column_hold(captured):
    root, truth, _ = captured
    lines = [json.loads(x) for x in _changes(root / "bin", "--columns").stdout.splitlines()]
    extra = [c for c in lines[-1]["columns"] if c["name"] == "extra"]
    assert extra == [{"name": "extra", "type": "text", "oid": 25, "key": False, "default": "d"}]
    assert truth[1]["extra"] == "d"  # what the server holds for a row from before the ALTER
    assert all("default" not in c for c in lines[0]["columns"])


def test_without_the_catalog_values_are_refused_or_raw(captured, tmp_path):
    root, _, oids = captured
    bare = tmp_path / "bare"
    shutil.copytree(root / "bin", bare)
    (bare / CATALOG_FILE).unlink()
    run = _changes(bare)
    assert run.returncode == 1
    err = run.stderr.strip().splitlines()[-1]
    assert "at LSN" in err and "column 'm'" in err and f"oid {oids['mood']}" in err, err
    assert "mood" in err and "catalog" in err
    run = _changes(bare, "--lenient")
    assert run.returncode == 0, run.stderr
    first = json.loads(run.stdout.splitlines()[0])
    assert first["after"]["m"] == "\\x" + b"happy".hex()  # the raw value, said to be raw
    assert any(f"oid {oids['mood']}" in e for e in first["errors"])


def paced_inserts(conn, out, sql: str, ids, step: int = 50, timeout: float = 60) -> None:
    """``sql`` (its parameters ``[i, i]``) for each id, one transaction each, in steps of
    ``step`` (about 6 kB of records, over the 4 kB that closes a segment); after each step,
    wait until the capture in ``out`` has made its last transaction durable, so a segment is
    closed however late the capture started or slowly it reads (a fixed sleep per insert
    left a busy machine with every insert in one flush, one segment)."""
    ids = list(ids)
    for at in range(0, len(ids), step):
        *first, last = ids[at : at + step]
        for i in first:
            conn.execute(sql, [i, i])
        with conn.transaction():  # its LSN read before its COMMIT: durable past it = durable
            conn.execute(sql, [last, last])
            lsn = parse_lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        until(f"the step's last {lsn} durable",
              lambda: (state := segments.read_state(out)) is not None and state.lsn > lsn,
              timeout, 0.01)  # fmt: skip


def test_a_directory_whose_first_segments_are_gone_still_reads(pg, tmp_path):
    """Segments deleted after they were applied (storage kept bounded): the Relation messages
    they held are in relations.jsonl, so the changes in the rest still load, with the types
    of the catalog, and equal what the whole directory gives for them."""
    with pg.database("pg18") as srv, srv.connect() as conn:
        out = tmp_path / "cap"
        proc = segmented_capture(srv, conn, out)
        paced_inserts(conn, out, "INSERT INTO t (id, m, p) VALUES (%s, 'ok', ROW(%s, 'x', 'sad'))",
                      range(10, 300))  # fmt: skip
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    segs = segments.list_segments(out)
    assert len(segs) > 3
    whole = _changes(out).stdout.splitlines()
    pruned = tmp_path / "pruned"
    shutil.copytree(out, pruned)
    for seg in segments.list_segments(pruned)[:2]:
        seg.unlink()
    run = _changes(pruned)
    assert run.returncode == 0, run.stderr
    assert "1 relation(s) described by" in run.stderr and "relations.jsonl" in run.stderr
    rest = run.stdout.splitlines()
    assert 0 < len(rest) < len(whole) and whole[-len(rest) :] == rest
    assert json.loads(rest[0])["after"]["p"]["b"] == "x"
    # without relations.jsonl the same read cannot know the relation: it says so
    (pruned / "relations.jsonl").unlink()
    run = _changes(pruned)
    assert run.returncode == 1 and "no Relation message has described" in run.stderr


@pytest.mark.parametrize("key,how", [("pg18", "walsender"), ("pg18", "sql"), ("pg15", "walsender")])
def test_segments_gone_before_an_alter_table_read_with_the_relation_they_had(
    pg, tmp_path, key, how
):
    """Changes of a table, then ALTER TABLE ... ADD COLUMN, then more: whichever first
    segments are gone, the rest reads as the whole directory gives it. The relations.jsonl
    line of each Relation message says where in the stream it came (the last transaction
    boundary before it), so a read starting at a segment knows the version its first
    changes were written under, not a later one (before 2026-11-28 every line said 0/0, read
    as "before" any segment: the rest began with the new version, and "the tuple has 2
    columns, relation ... has 3" ended the read)."""
    with pg.database(key) as srv, srv.connect() as conn:
        out = tmp_path / "cap"
        proc = segmented_capture(srv, conn, out, *(["--sql"] if how == "sql" else []))
        paced_inserts(conn, out, "INSERT INTO t (id, m, p) VALUES (%s, 'ok', ROW(%s, 'x', 'sad'))",
                      range(10, 160))  # fmt: skip
        conn.execute("ALTER TABLE t ADD COLUMN extra int")
        paced_inserts(
            conn, out, "INSERT INTO t (id, m, extra) VALUES (%s, 'ok', %s)", range(160, 300)
        )
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    lines = [json.loads(x) for x in (out / "relations.jsonl").read_text().splitlines()]
    # the second comes after a boundary (the first may say 0: before the first one)
    assert len(lines) == 2 and parse_lsn(lines[1]["lsn"]) > parse_lsn(lines[0]["lsn"]), lines
    segs = segments.list_segments(out)
    assert len(segs) > 4
    whole = _changes(out).stdout.splitlines()
    assert len(whole) == 290
    for k in range(1, len(segs) - 1):
        pruned = tmp_path / f"pruned{k}"
        shutil.copytree(out, pruned)
        for seg in segments.list_segments(pruned)[:k]:
            seg.unlink()
        run = _changes(pruned)
        assert run.returncode == 0, (k, run.stderr)
        rest = run.stdout.splitlines()
        assert 0 < len(rest) < len(whole) and whole[-len(rest) :] == rest, k


def test_lines_past_the_durable_position_are_skipped_not_a_stop(tmp_path):
    """A reg line is keyed by the first change that needed a name and written at the next
    durable point, so it can follow the line of a Relation message read after the durable
    position: reading up to that position keeps it."""
    lines = [
        {"lsn": "0/100", "relation": 1, "types": []},
        {"lsn": "0/300", "relation": 2, "types": []},  # past the durable position 0/200
        {"lsn": "0/150", "reg": {"2205": {"16384": "t"}}},
    ]
    (tmp_path / CATALOG_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    kept = read_catalog_lines(tmp_path, parse_lsn("0/200"))
    assert [x["lsn"] for x in kept] == ["0/100", "0/150"]


def test_renamed_columns_are_those_replaced_in_place_by_a_new_name_of_their_type():
    """The Relation messages' columns ([flags, name, type OID, typmod]) before and after an
    ALTER TABLE: a rename (or a drop and an add of the same type last, which look the same)
    gives the pairs; a drop, an add, a retype or names swapped give none."""
    from pgcdc.capture.catalog import renamed_columns

    cols = [[1, "id", 23, -1], [0, "note", 25, -1], [0, "n", 1700, 655366]]
    renamed = [[1, "id", 23, -1], [0, "memo", 25, -1], [0, "n", 1700, 655366]]
    assert renamed_columns(cols, renamed) == [("note", "memo")]
    two = [[1, "key", 23, -1], [0, "memo", 25, -1], [0, "n", 1700, 655366]]
    assert renamed_columns(cols, two) == [("id", "key"), ("note", "memo")]
    assert renamed_columns(cols, cols[:2]) == []  # dropped
    assert renamed_columns(cols, [*cols, [0, "x", 25, -1]]) == []  # added
    assert renamed_columns(cols, [cols[0], [0, "memo", 20, -1], cols[2]]) == []  # retyped too
    swapped = [[1, "id", 23, -1], [0, "n", 25, -1], [0, "note", 1700, 655366]]
    assert renamed_columns(cols, swapped) == []
