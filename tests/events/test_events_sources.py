"""The fast reading path gives what the reference path gives.

``sources.iter_raw`` / ``raw_records`` read capture records as (gates, lsn, data) triples and
``EventReader.read_raw`` turns them into events; ``read_events(sources.iter_records(...))``
goes through ``pgoutput_codec.capture.Record`` objects. Same events, same errors (with the
offset), on the real captures of PostgreSQL 15-18 and on damaged files."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

import pgoutput_codec as pgc
from pgcdc.capture import files as sources
from pgcdc.events.reader import ChangeStreamError, EventReader, read_events
from pgcdc.runtime.capture_file import RECORD_HEADER
from tests.support.events import described as comparable
from tests.postgres.capture import workload_catalog

CATALOG = workload_catalog()  # the captures' types that are not built in

CAPTURES = sorted(Path(__file__).parents[1].glob("captures/pg1*/*.pgcap*"))


def reference(path, **options):
    return [
        comparable(e) for e in read_events(sources.iter_records(path), catalog=CATALOG, **options)
    ]


def fast(path, **options):
    return [
        comparable(e)
        for e in EventReader(catalog=CATALOG, **options).read_raw(sources.iter_raw(path))
    ]


@pytest.mark.parametrize("path", CAPTURES[::3], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_captures_give_the_same_events_both_ways(path, tmp_path):
    options = {"transaction_events": True, "lenient": True, "memory_limit": 4096}
    want = reference(path, **options)
    assert want and fast(path, **options) == want
    # uncompressed, so the file path (mmap, struct headers) is the one taken
    plain = tmp_path / "capture.pgcap"
    plain.write_bytes(
        gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    )
    assert fast(plain, **options) == want
    # the record layout without the file head, as LogicalStream.read_records appends it
    data = plain.read_bytes()
    head = len(pgc.capture.MAGIC) + 1
    got = EventReader(catalog=CATALOG, **options).read_raw(sources.raw_records(data[head:]))
    assert [comparable(e) for e in got] == want


def _some_capture(tmp_path) -> Path:
    path = next(p for p in CAPTURES if "proto4-text-streaming_on" in p.name)
    plain = tmp_path / "c.pgcap"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    return plain


def test_a_truncated_file_raises_the_reference_error_after_the_same_events(tmp_path):
    plain = _some_capture(tmp_path)
    plain.write_bytes(plain.read_bytes()[:-3])
    with pytest.raises(sources.SourceError) as want:
        list(sources.iter_records(plain))
    with pytest.raises(sources.SourceError) as got:
        list(sources.iter_raw(plain))
    assert str(got.value) == str(want.value) and "byte" in str(got.value)
    n_ref = sum(1 for _ in _until_error(sources.iter_records(plain)))
    n_raw = sum(1 for _ in _until_error(sources.iter_raw(plain)))
    assert n_ref == n_raw > 0


def _until_error(it):
    try:
        yield from it
    except sources.SourceError:
        return


def test_a_record_with_an_unknown_protocol_version_is_a_change_stream_error(tmp_path):
    plain = _some_capture(tmp_path)
    data = bytearray(plain.read_bytes())
    data[len(pgc.capture.MAGIC) + 1] = 9  # the first record's protocol version
    plain.write_bytes(bytes(data))
    with pytest.raises(ChangeStreamError) as want:
        reference(plain)
    with pytest.raises(ChangeStreamError) as got:
        fast(plain)
    assert got.value.index == want.value.index == 0
    assert got.value.lsn == want.value.lsn
    assert "protocol_version" in str(got.value) and "9" in str(got.value)


def test_raw_records_name_the_offset_of_a_truncated_record():
    good = RECORD_HEADER.pack(1, 0, 0x10, 3) + b"abc"
    bad = RECORD_HEADER.pack(1, 0, 0x20, 10) + b"short"
    items = sources.raw_records(good + bad)
    assert next(items) == ((1, False, False), 0x10, b"abc")
    with pytest.raises(pgc.capture.DecodeError) as info:
        next(items)
    assert info.value.offset == len(good) + RECORD_HEADER.size
