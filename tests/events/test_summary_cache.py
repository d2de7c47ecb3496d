"""The summaries change_events remembers across runs (sync plans a run every second over the
same segments): a growing segment of a capture directory summarised from where its last
summary ended equals its summary made anew, split points, control entries and Relation
records seen included; a file rewritten is summarised anew."""

from __future__ import annotations

import os
from pathlib import Path

import pgoutput_codec as pgc
import pytest

from pgcdc.capture.segments import SegmentWriter
from pgcdc.capture.files import Captures
from pgcdc.spark import changes
from pgcdc.spark.units import summarize_file
from tests.support.apply_model import OID, RELATION, _tuple  # noqa: E402

pytest.importorskip("pyspark")

GRAIN = 7  # a split point every 7 records: the steps below cross several


def _transaction(w: SegmentWriter, lsn: int, rows: int, relation: bool) -> int:
    """Append one transaction at ``lsn`` (its Relation first when asked); the next LSN."""
    final = lsn + 0x10 * (rows + 2)
    begin = pgc.Begin(final_lsn=final, commit_time=lsn, xid=lsn % 1000 + 1)
    w.append(1, 0, lsn, pgc.encode(begin, protocol_version=1))
    if relation:
        w.append(1, 0, lsn + 8, pgc.encode(RELATION, protocol_version=1))
    for j in range(rows):
        msg = pgc.Insert(relation_oid=OID, new_tuple=_tuple((lsn + j, "a", None, j)))
        w.append(1, 0, lsn + 0x10 * (j + 1), pgc.encode(msg, protocol_version=1))
    commit = pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=lsn)
    w.append(1, 0, final, pgc.encode(commit, protocol_version=1))
    w.mark_end(final + 8)
    w.commit()
    return final + 0x28


def _directory(path, rows: int):
    """A capture directory at ``path`` holding one transaction of ``rows`` rows (its
    Relation first); its segment's CaptureFile."""
    path.mkdir()
    w = SegmentWriter(path, fsync=False)
    w.start(0x1000)
    _transaction(w, 0x1000, rows, relation=True)
    w.close()
    (f,) = Captures.open([str(path)]).files
    return f


def _plain(summary: dict) -> dict:
    return {k: summary[k] for k in ("file_no", "splits", "records", "control")}


def test_a_growing_segment_is_summarised_from_where_it_was(tmp_path, monkeypatch):
    changes._SUMMARIES.clear()
    read = []
    real = summarize_file
    monkeypatch.setattr(
        changes,
        "summarize_file",
        lambda *a, **k: read.append(k.get("since") is not None) or real(*a, **k),
    )
    w = SegmentWriter(tmp_path, fsync=False)
    lsn = 0x1000
    w.start(lsn)
    for step, rows in enumerate([3, 9, 1, 12, 0, 5]):
        lsn = _transaction(w, lsn, rows, relation=step in (0, 3))  # the Relation sent twice
        (f,) = Captures.open([str(tmp_path)]).files
        assert f.boundary and f.end is not None
        got = changes._cached_summary(0, f, GRAIN)
        if got is None:
            got = real(0, f, GRAIN)
            changes._remember_summary(f, GRAIN, got)
        assert _plain(got) == _plain(real(0, f, GRAIN)), step
    assert read == [True] * 5  # every step after the first read only the new records
    again = changes._cached_summary(0, f, GRAIN)  # nothing new: a whole hit
    assert _plain(again) == _plain(got) and len(read) == 5
    w.close()


def test_a_file_written_again_is_summarised_anew(tmp_path):
    changes._SUMMARIES.clear()
    first, other = tmp_path / "a", tmp_path / "b"
    f = _directory(first, 4)
    changes._remember_summary(f, GRAIN, summarize_file(0, f, GRAIN))
    _directory(other, 6)
    first.rename(tmp_path / "old")
    other.rename(first)  # another file at the same path
    (h,) = Captures.open([str(first)]).files
    assert changes._cached_summary(0, h, GRAIN) is None
    assert summarize_file(0, h, GRAIN)["records"] == 9  # Begin, Relation, 6 rows, Commit


def test_summaries_of_files_gone_are_dropped(tmp_path):
    """Sync prunes applied segments every minute: their summaries go with them."""
    changes._SUMMARIES.clear()
    files = [_directory(tmp_path / name, 2) for name in ("a", "b")]
    changes._remember_summary(files[0], GRAIN, summarize_file(0, files[0], GRAIN))
    Path(files[0].path).unlink()
    changes._remember_summary(files[1], GRAIN, summarize_file(0, files[1], GRAIN))
    assert [k[0] for k in changes._SUMMARIES] == [os.path.abspath(files[1].path)]
