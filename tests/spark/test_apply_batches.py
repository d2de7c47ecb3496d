"""The Arrow batches of the Spark change events (pgcdc.spark.changes), built a column at a time,
against the events they come from, read one by one; the stats the tasks gather for apply.

No Spark needed: the batches are built as a task builds them, on the real captures of
PostgreSQL 15-18 (several relation versions in a batch, key-only old images, unchanged TOAST,
truncates), cut into small units.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pgcdc.events.reader import Event  # noqa: E402
from pgcdc.lsn import MAX_LSN, format_lsn  # noqa: E402
from pgcdc.spark import table_batches as batches  # noqa: E402
from pgcdc.spark import changes as ch  # noqa: E402

CAPTURES = sorted(Path(__file__).parents[1].glob("captures/pg1*/*.pgcap*"))


def test_event_fields_are_the_events():
    # the batches unpack an Event by position
    assert batches.EVENT_FIELDS == Event._fields


@pytest.mark.parametrize(
    "lsns",
    [
        [0],
        [0, 1, 15, 16, 1 << 32, (1 << 32) - 1, MAX_LSN, 0x16B374D848],
        [0x16B374D848] * 50 + [0x16B374D850] * 50,  # a commit LSN per transaction
        [random.Random(7).randrange(MAX_LSN + 1) for _ in range(5000)],
        [3, None],
        [],
    ],
)
def test_lsn_texts_as_format_lsn(lsns):
    texts = ch.lsn_texts(lsns).to_pylist()
    assert texts == [None if x is None else format_lsn(x) for x in lsns]


def _units(path, split):
    files = ch.list_capture_files([str(path)])
    summaries = [ch.summarize_file(i, f, split) for i, f in enumerate(files)]
    return ch.plan(files, summaries)


@pytest.mark.parametrize("path", CAPTURES[::3], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_batches_hold_the_events(path):
    units, tables = _units(path, 40)
    schema = ch.event_schema(tables)
    names = list(tables)
    for unit in units:
        events = [e for e in ch.unit_events(unit) if e.relation is not None]
        stats = {"after": None, "tables": {}}
        batches = list(ch.events_to_batches(unit, tables, schema, stats=stats))
        rows = [r for b in batches for r in b.to_pylist()]
        # batches come out per table, in each table's order
        for name in names:
            mine = [e for e in events if f"{e.relation.schema}.{e.relation.table}" == name]
            got = [r for r in rows if r["table_name"] == name]
            assert len(got) == len(mine)
            col = ch.table_column(name, names.index(name))
            for ev, row in zip(mine, got):
                assert row["op"] == ev.op
                assert (row["commit_lsn"], row["tx_ordinal"]) == (ev.commit_lsn, ev.tx_ordinal)
                src = row["source"]
                assert src["lsn"] == format_lsn(ev.lsn)
                assert src["commit_lsn"] == format_lsn(ev.commit_lsn)
                assert (src["xid"], src["origin"]) == (ev.xid, ev.origin)
                assert row["before_is_key"] == ev.before_is_key
                assert row["unchanged"] == list(ev.unchanged)
                assert (row["truncate"] is None) == (ev.op != "t")
                assert (row[col]["before"] is None) == (ev.before is None)
                assert (row[col]["after"] is None) == (ev.after is None)
                if ev.before_is_key and ev.before is not None:  # the key columns only
                    before = row[col]["before"]
                    keys = set(ev.relation.key_names)
                    assert all(v is None for k, v in before.items() if k not in keys)
            if got:
                st = stats["tables"][name]
                assert st["last"] == max((e.commit_lsn, e.tx_ordinal) for e in mine)
                cut = [(e.commit_lsn, e.tx_ordinal) for e in mine if e.op == "t"]
                assert st["truncate"] == (max(cut) if cut else None)
                assert st["unchanged"] == {c for e in mine for c in e.unchanged}
            else:
                assert name not in stats["tables"]


def test_stats_merge_is_idempotent():
    a = {"t": {"last": (5, 2), "truncate": None, "unchanged": {"x"}}}
    b = {"t": {"last": (7, 1), "truncate": (6, 1), "unchanged": {"y"}}}
    merged = ch.EventStats.addInPlace(ch.EventStats.zero(None), a)
    merged = ch.EventStats.addInPlace(merged, b)
    again = ch.EventStats.addInPlace(ch.EventStats.addInPlace({}, b), a)
    again = ch.EventStats.addInPlace(again, b)
    want = {"t": {"last": (7, 1), "truncate": (6, 1), "unchanged": {"x", "y"}}}
    assert merged == again == want


@pytest.mark.parametrize("grain", [7, 50, 100_000])
def test_summary_in_c_is_the_summary_one_at_a_time(grain, monkeypatch, tmp_path):
    """The summary's C path (record headers a chunk at a time) gives the same control
    entries, split points and record count as reading every record in Python, on every real
    capture and on one whose last record was cut short."""
    from pgcdc.capture import files as sources

    if sources._c_scan is None:
        pytest.skip("the C reader is not built")
    cut = tmp_path / "cut.pgcap"
    import gzip

    whole = (
        gzip.open(CAPTURES[0]).read() if CAPTURES[0].suffix == ".gz" else CAPTURES[0].read_bytes()
    )
    cut.write_bytes(whole[:-5])
    for path in [*CAPTURES, cut]:
        files = ch.list_capture_files([str(path)])
        fast = [ch.summarize_file(i, f, grain) for i, f in enumerate(files)]
        with monkeypatch.context() as m:
            m.setattr(sources, "_c_scan", None)
            slow = [ch.summarize_file(i, f, grain) for i, f in enumerate(files)]
        assert fast == slow, path


def _summary(file_no, records, grain):
    splits = [(i, 5 + i * 20) for i in range(0, max(records, 1), grain)]
    return {"file_no": file_no, "splits": splits, "records": records, "control": []}


@pytest.mark.parametrize(
    "records, split, cores, sizes",
    [
        ([1_003_000], 1_000_000, 2, [[500_000, 503_000]]),  # a unit per core, no crumb
        ([1_003_000], 200_000, 2, [[200_000] * 5 + [3_000]]),  # at most split_records
        ([1_003_000], 1_000_000, 8, [[150_000] * 6 + [103_000]]),  # on the grain's points
        ([30_000], 1_000_000, 2, [[30_000]]),  # fewer records than a grain: one unit
        ([120_000, 80_000], 1_000_000, 2, [[120_000], [80_000]]),  # every file starts one
        ([0], 1_000_000, 2, [[]]),  # an empty file: nothing to read
    ],
)
def test_units_are_sized_to_the_cores(records, split, cores, sizes):
    """Units hold at most split_records records, and about total / cores when that is fewer,
    cut on the summary's split points; a file always starts a unit."""
    grain = 50_000
    files = [ch.CaptureFile(f"f{i}", None) for i in range(len(records))]
    summaries = [_summary(i, n, grain) for i, n in enumerate(records)]
    units, _ = ch.plan(files, summaries, split, cores)
    got = {}
    for u in units:
        for fno, _path, _end, start, _off, end, *_rest in u.files[-1:]:
            got.setdefault(fno, []).append(end - start)
    assert [got.get(i, []) for i in range(len(records))] == sizes
