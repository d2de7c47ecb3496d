"""Only committed, durable work leaves a capture directory (PostgreSQL 18, real captures).

The losses these tests pin, each with a plain workflow:

* a first capture stopped (or its segment copied) in the middle of a 100k-row transaction,
  before its first durable point: no state.json, the segment ends inside the transaction. Its
  events must not be printed or applied, and once the capture completes, apply over the
  complete directory must give the server's table (before: half the transaction applied, its
  commit LSN, taken from Begin, recorded as applied, the other half skipped for good);
* a segment cut shorter than the durable offset state.json records: an error (exit 2), not a
  silent partial read;
* a capture still running, whose segment holds records past its durable position: readers stop
  at the durable position.

The truth is the server: its table, and the transactions it sent (read back from the complete
capture of a twin slot created at the same point).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.capture import segments
from pgcdc.cli import capture as cli
from pgcdc.capture.files import Captures
from tests.support.delta import read_table

pq = pytest.importorskip("pyarrow.parquet")

BIG = 100_000
SMALL = 10


def _pgcdc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc", *args], capture_output=True, text=True, timeout=300
    )


def _capture(srv, slot: str, out: Path, *extra: str, to_wal_end: bool = True) -> None:
    """Capture ``slot`` up to the server's WAL end now (the decoding of the 100k-row
    transaction can keep the stream silent for seconds on a busy machine: an idle timeout
    alone would stop before it), or, with open transactions, until the stream is idle."""
    if to_wal_end:
        with srv.connect() as c:
            wal = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        extra = ("--until-lsn", wal, "--idle-exit", "120", *extra)
    else:
        extra = ("--idle-exit", "1", *extra)
    code = cli.main(["--dsn", srv.conninfo(), "--slot", slot, "--publication", "pub",
                     "--out", str(out), *extra])  # fmt: skip
    assert code == 0


@pytest.fixture(scope="module")
def source(pg, tmp_path_factory):
    """A server with two slots created at the same point (``ref`` and ``late``), three
    transactions after it (10 rows, 100k rows, 10 rows), and the complete capture of ``ref``."""
    root = tmp_path_factory.mktemp("integrity")
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE bulk")
        for slot in ("ref", "late"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        conn.execute(f"INSERT INTO bulk SELECT g, 'a' || g FROM generate_series(1, {SMALL}) g")
        conn.execute(
            f"INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series({SMALL + 1}, "
            f"{SMALL + BIG}) g"
        )
        conn.execute(
            f"INSERT INTO bulk SELECT g, 'z' || g FROM generate_series({SMALL + BIG + 1}, "
            f"{2 * SMALL + BIG}) g"
        )
        full = root / "full"
        _capture(srv, "ref", full)
        truth = sorted(conn.execute("SELECT id, v FROM bulk").fetchall())
        yield srv, full, truth, root


def _record_offsets(directory: Path) -> list[tuple[int, bytes]]:
    """(offset, tag) of every record of the directory's only segment."""
    (seg,) = segments.list_segments(directory)
    data = seg.read_bytes()
    off, out = len(segments.FILE_HEADER), []
    while off < len(data):
        _, _, _, length = segments.RECORD_HEADER.unpack_from(data, off)
        out.append((off, data[off + 14 : off + 15]))
        off += 14 + length
    return out


def _cut_copy(full: Path, dest: Path, *, keep_state: bool) -> tuple[Path, int, int]:
    """A copy of ``full`` whose segment ends in the middle of the 100k-row transaction (not
    on a record boundary: a copy taken while the file was written). Returns (directory,
    offset of the big transaction's Begin, offset just past the first transaction)."""
    shutil.copytree(full, dest)
    marks = _record_offsets(dest)
    begins = [o for o, t in marks if t == b"B"]
    commits = [o for o, t in marks if t == b"C"]
    assert len(begins) == len(commits) == 3
    (seg,) = segments.list_segments(dest)
    middle = (begins[1] + commits[1]) // 2 + 5
    with open(seg, "r+b") as f:
        f.truncate(middle)
    if not keep_state:
        (dest / segments.STATE_FILE).unlink()
    return dest, begins[1], begins[1]


def _ids_in_changes(stdout: str) -> list[int]:
    return [json.loads(line)["after"]["id"] for line in stdout.splitlines()]


def _applied(out: Path) -> list[tuple]:
    rows = read_table(out / "public.bulk").to_pylist()  # the Delta table's current files
    return sorted((r["id"], r["v"]) for r in rows)


def test_changes_stops_at_the_last_commit_of_a_directory_without_state(source, tmp_path):
    srv, full, truth, _ = source
    cut, _, _ = _cut_copy(full, tmp_path / "cut", keep_state=False)
    run = _pgcdc("changes", str(cut))
    assert run.returncode == 0, run.stderr
    assert _ids_in_changes(run.stdout) == list(range(1, SMALL + 1))  # before: 50k more
    assert "no state.json" in run.stderr and "last commit boundary" in run.stderr
    # the library reader says the same, and reads the same
    from pgcdc.events.reader import read_captures

    assert [e.after[0] for e in read_captures([cut])] == list(range(1, SMALL + 1))


def test_interrupted_first_capture_then_completion_loses_nothing(source, spark, tmp_path):  # noqa: F811
    """The directory of slot ``late`` is left as a first capture stopped inside the big
    transaction leaves it; apply runs on it; then the capture completes (resuming as
    ``pgcdc capture`` does) and apply runs again: the state must be the server's table."""
    from pgcdc.apply.run import apply_changes

    srv, full, truth, _ = source
    late, _, _ = _cut_copy(full, tmp_path / "late", keep_state=False)
    out = tmp_path / "tables"
    apply_changes(spark, [str(late)], out)
    assert _applied(out) == truth[:SMALL]  # the first transaction only
    _capture(srv, "late", late)  # completes: the server sends everything again
    assert segments.read_state(late) is not None
    apply_changes(spark, [str(late)], out)
    assert _applied(out) == truth  # before: 49,8xx rows missing, exit 0


def test_a_segment_shorter_than_its_durable_offset_is_an_error(source, spark, tmp_path):  # noqa: F811
    from pgcdc.capture.segments import CaptureDirError
    from pgcdc.apply.run import apply_changes

    _, full, _, _ = source
    cut, _, _ = _cut_copy(full, tmp_path / "short", keep_state=True)
    run = _pgcdc("changes", str(cut))
    assert run.returncode == 2 and "fewer than" in run.stderr, run.stderr
    assert run.stdout == ""
    with pytest.raises(CaptureDirError, match="fewer than"):
        Captures.open([cut])
    out = tmp_path / "tables"
    with pytest.raises(Exception, match="fewer than"):
        apply_changes(spark, [str(cut)], out)
    assert not (out / "public.bulk").exists()
    run = _pgcdc("apply", str(cut), "--out", str(out))
    assert run.returncode == 2, run.stderr
    assert "fewer than" in run.stderr


def test_readers_stop_at_the_durable_position(source, spark, tmp_path):  # noqa: F811
    """A capture still running: its segment holds the big transaction's first half past the
    durable position state.json records (just after the first transaction)."""
    from pgcdc.apply.run import apply_changes

    _, full, truth, _ = source
    live = tmp_path / "live"
    shutil.copytree(full, live)
    marks = _record_offsets(live)
    begins = [o for o, t in marks if t == b"B"]
    commits = [o for o, t in marks if t == b"C"]
    (seg,) = segments.list_segments(live)
    with open(seg, "r+b") as f:
        f.truncate((begins[1] + commits[1]) // 2)
    state = json.loads((live / segments.STATE_FILE).read_text())
    state["offset"] = begins[1]  # the first transaction's end: a transaction boundary
    (live / segments.STATE_FILE).write_text(json.dumps(state))
    run = _pgcdc("changes", str(live))
    assert run.returncode == 0, run.stderr
    assert _ids_in_changes(run.stdout) == list(range(1, SMALL + 1))
    assert "note" not in run.stderr  # nothing was cut: the durable position is the end
    out = tmp_path / "tables"
    apply_changes(spark, [str(live)], out)
    assert _applied(out) == truth[:SMALL]


def test_a_plain_capture_file_ending_inside_a_transaction(source, tmp_path):
    """A capture file (not a directory) cut inside a transaction at a record boundary: read
    up to its last commit, with a note."""
    _, full, _, _ = source
    marks = _record_offsets(full)
    commits = [o for o, t in marks if t == b"C"]
    (seg,) = segments.list_segments(full)
    data = seg.read_bytes()
    inside = next(o for o, _ in marks if o > (commits[0] + commits[1]) // 2)
    path = tmp_path / "cut.pgcap"
    path.write_bytes(data[:inside])
    run = _pgcdc("changes", str(path))
    assert run.returncode == 0, run.stderr
    assert _ids_in_changes(run.stdout) == list(range(1, SMALL + 1))
    assert "last commit boundary" in run.stderr


def test_a_streamed_transaction_is_read_only_once_committed(pg, tmp_path):
    """A 20k-row transaction streamed (``--streaming on``) while still open, two small ones
    committed between its chunks: the capture directory holds the open one's chunks before
    and between the small ones' commits. Readers print the small one only, say the other is not committed,
    and print it once a later capture has its Stream Commit. Likewise with state.json gone and
    the segment cut inside the streamed chunks that follow."""
    from pgcdc.events.reader import read_captures

    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE bulk")
        conn.execute("SELECT pg_create_logical_replication_slot('st', 'pgoutput')")
        with srv.connect() as other:
            other.autocommit = False
            other.execute(
                "INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(1, 20000) g"
            )
            conn.execute("INSERT INTO bulk VALUES (100001, 'small')")
            other.execute("INSERT INTO bulk SELECT g, 'late' FROM generate_series(20001, 20010) g")
            conn.execute("INSERT INTO bulk VALUES (100002, 'small')")  # flushes the late rows
            out = tmp_path / "cap"
            _capture(srv, "st", out, "--streaming", "on", "--protocol-version", "2",
                     to_wal_end=False)  # fmt: skip
            tags = [t for _, t in _record_offsets(out)]
            # the server streams every transaction (the harness sets immediate streaming): two
            # Stream Commits, the small ones'; the big one's chunks come before and between
            assert tags.count(b"c") == 2 and tags.count(b"S") > 4, sorted(set(tags))
            run = _pgcdc("changes", str(out))
            assert run.returncode == 0, run.stderr
            assert _ids_in_changes(run.stdout) == [100001, 100002]
            assert "none of their changes were emitted" in run.stderr, run.stderr
            assert [e.after[0] for e in read_captures([out])] == [100001, 100002]
            # state.json gone and the segment cut inside the streamed chunks after the commit
            cut = tmp_path / "cut"
            shutil.copytree(out, cut)
            (cut / segments.STATE_FILE).unlink(missing_ok=True)  # none yet: the big one is open
            marks = _record_offsets(cut)
            commit = next(o for o, t in marks if t == b"c")
            after = [o for o, t in marks if o > commit and t == b"I"]  # the late rows' chunks
            (seg,) = segments.list_segments(cut)
            with open(seg, "r+b") as f:
                f.truncate(after[len(after) // 2] + 7)
            run = _pgcdc("changes", str(cut))
            assert run.returncode == 0, run.stderr
            assert _ids_in_changes(run.stdout) == [100001]
            other.commit()
        _capture(srv, "st", out, "--streaming", "on", "--protocol-version", "2")
        run = _pgcdc("changes", str(out))
        assert run.returncode == 0, run.stderr
        ids = _ids_in_changes(run.stdout)
        assert ids == [100001, 100002, *range(1, 20011)], ids[:5]
        truth = sorted(r[0] for r in conn.execute("SELECT id FROM bulk").fetchall())
        assert sorted(ids) == truth
