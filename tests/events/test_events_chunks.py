"""The chunk path (``sources.iter_chunks`` -> ``EventReader.read_chunks``: records read in C,
Insert runs decoded and loaded a column at a time) gives exactly what the message-at-a-time
path (``iter_raw`` -> ``read_raw``) gives: the same events, and the same error after the same
events. On the real captures of PostgreSQL 15-18, with chunks cut anywhere, and on streams a
model generates with the things a column-wise load must give up on: NULLs, unchanged TOAST,
values that do not load, relations that change or were never described, mixed text and
binary, Inserts inside streams, begin/end events."""

from __future__ import annotations

import gzip
import shutil
import struct
import subprocess
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from pgcdc.capture import files as sources
from pgcdc.events.reader import EventReader
from tests.support.events import described
from tests.postgres.capture import workload_catalog

CATALOG = workload_catalog()  # the captures' types that are not built in

pytestmark = pytest.mark.skipif(
    sources._c_scan is None or not pgc.speedups_enabled(),
    reason="the chunk path needs the C capture reader and the codec's accelerator",
)

CAPTURES = sorted(Path(__file__).parents[1].glob("captures/pg1*/*.pgcap*"))


def comparable(ev):
    # errors are exceptions, which compare by identity: compare what they say
    return described(ev)._replace(errors=tuple(map(repr, ev.errors)))


def outcome(events):
    """(events, error) of an event iterator: what it yields, and how it ends."""
    got = []
    try:
        for ev in events:
            got.append(comparable(ev))
    except Exception as e:  # noqa: BLE001 (the error is part of the outcome)
        return got, (type(e).__name__, str(e), getattr(e, "index", None))
    return got, None


def both_ways(path, **options):
    want = outcome(EventReader(catalog=CATALOG, **options).read_raw(sources.iter_raw(path)))
    got = outcome(EventReader(catalog=CATALOG, **options).read_chunks(sources.iter_chunks(path)))
    return want, got


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_captures_give_the_same_events_read_in_chunks(path, tmp_path, monkeypatch):
    plain = tmp_path / "capture.pgcap"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    for options in ({}, {"transaction_events": True}, {"lenient": True}):
        want, got = both_ways(plain, **options)
        assert want[0] and got == want
    # chunks of 7 records: runs cut mid-transaction, a chunk starting inside a run
    monkeypatch.setattr(sources, "CHUNK_RECORDS", 7)
    want, got = both_ways(plain, transaction_events=True)
    assert got == want


def test_a_capture_directory_reads_in_chunks_with_a_partial_last_record(tmp_path):
    from pgcdc.capture import segments

    path = next(p for p in CAPTURES if "proto1-text" in p.name)
    records = list(pgc.capture.read(path))
    directory = tmp_path / "cap"
    directory.mkdir()
    half = len(records) // 2
    head = pgc.capture.MAGIC + b"\x01"
    for n, part in enumerate((records[:half], records[half:])):
        body = b"".join(
            struct.pack(">BBQI", r.protocol_version, 0, r.lsn, len(r.data)) + r.data for r in part
        )
        (directory / segments.segment_name(n, part[0].lsn)).write_bytes(head + body)
    with open(directory / segments.segment_name(1, records[half].lsn), "ab") as f:
        f.write(b"\x01\x00\x00")  # a crash mid-record: hidden, not an error
    want = outcome(EventReader(catalog=CATALOG).read_raw(sources.iter_raw(directory)))
    got = outcome(EventReader(catalog=CATALOG).read_chunks(sources.iter_chunks(directory)))
    assert want[0] and got == want


# -- streams from a model ----------------------------------------------------------------

TYPES = (23, 20, 25, 16, 701, 1082)  # int4 int8 text bool float8 date


def _text(oid: int, i: int) -> bytes:
    return {
        23: str(i),
        20: str(i * 1000),
        25: f"name {i} ü",
        16: "t" if i % 2 else "f",
        701: repr(i * 0.25),
        1082: f"2024-0{1 + i % 9}-1{i % 10}",
    }[oid].encode()


def _binary(oid: int, i: int) -> bytes:
    return {
        23: struct.pack(">i", i),
        20: struct.pack(">q", i * 1000),
        25: f"name {i}".encode(),
        16: bytes((i % 2,)),
        701: struct.pack(">d", i * 0.25),
        1082: struct.pack(">i", 8000 + i),
    }[oid]


# what one column of one row is: its value as sent, or something a column-wise load gives up on
CELL = st.sampled_from(["t", "t", "t", "b", "n", "u", "bad", "short"])


def _cell(kind: str, oid: int, i: int) -> pgc.TupleColumn:
    if kind == "n":
        return pgc.TupleColumn(kind="n")
    if kind == "u":
        return pgc.TupleColumn(kind="u")
    if kind == "bad":  # text that does not load (except as text)
        return pgc.TupleColumn(kind="t", value=b"\xff not a value")
    if kind == "short":  # a binary value shorter than its type
        return pgc.TupleColumn(kind="b", value=b"\x01")
    value = _text(oid, i) if kind == "t" else _binary(oid, i)
    return pgc.TupleColumn(kind=kind, value=value)


@st.composite
def streams(draw):
    """(gates, lsn, payload) of a protocol 4 stream: transactions of Inserts, Updates and
    Deletes (mostly plain rows, sometimes odd ones; with and without old keys and rows),
    Relation messages that change a table's columns, changes for relations never described,
    and streamed transactions."""
    tables = {}
    out = []
    lsn = 0x1000

    def emit(msg, in_stream=False):
        nonlocal lsn
        lsn += 0x10
        data = pgc.encode(msg, protocol_version=4, streaming="on", in_stream=in_stream)
        out.append(((4, in_stream, False), lsn, data))

    def relation(oid, xid=None):
        types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4))
        tables[oid] = types
        cols = tuple(
            pgc.RelationColumn(flags=int(j == 0), name=f"c{j}", type_oid=t, type_modifier=-1)
            for j, t in enumerate(types)
        )
        return pgc.Relation(
            xid=xid,
            relation_oid=oid,
            namespace="public",
            relation_name=f"t{oid}",
            replica_identity=ord("d"),
            columns=cols,
        )

    def tuple_data(oid, i, key_only=False):
        types = tables.get(oid, [23])
        odd = draw(st.integers(0, 9)) == 0
        if odd:
            kinds = [draw(CELL) for _ in types]
            if draw(st.booleans()):
                types = [*types, 23]  # a column more than the relation has
                kinds.append("t")
        else:
            kinds = ["t"] * len(types)
        if key_only:  # a key tuple: the key column (the first), NULL for the others
            kinds = [kinds[0]] + ["n"] * (len(kinds) - 1)
        return pgc.TupleData(columns=tuple(_cell(k, t, i) for k, t in zip(kinds, types)))

    def insert(i, xid=None):
        oid = draw(st.sampled_from(sorted(tables) + [99]))  # 99: never described
        # an Update or a Delete here and there, with or without an old key or row
        what = draw(st.sampled_from(["I", "I", "I", "U", "U", "D"]))
        if what == "I":
            return pgc.Insert(xid=xid, relation_oid=oid, new_tuple=tuple_data(oid, i))
        old_kind = draw(st.sampled_from([None, "K", "O"] if what == "U" else ["K", "O"]))
        old = None if old_kind is None else tuple_data(oid, i, key_only=old_kind == "K")
        if what == "D":
            return pgc.Delete(xid=xid, relation_oid=oid, old_kind=old_kind, old_tuple=old)
        return pgc.Update(
            xid=xid,
            relation_oid=oid,
            old_kind=old_kind,
            old_tuple=old,
            new_tuple=tuple_data(oid, i),
        )

    xid = 500
    for _ in range(draw(st.integers(1, 5))):
        xid += 1
        streamed = draw(st.integers(0, 3)) == 0
        if streamed:
            emit(pgc.StreamStart(xid=xid, first_segment=1))
            if not tables or draw(st.booleans()):
                emit(relation(draw(st.sampled_from([1, 2])), xid), in_stream=True)
            for i in range(draw(st.integers(0, 12))):
                emit(insert(i, xid), in_stream=True)
            emit(pgc.StreamStop())
            emit(
                pgc.StreamCommit(
                    xid=xid, flags=0, commit_lsn=lsn + 8, end_lsn=lsn + 16, commit_time=7
                )
            )
            continue
        emit(pgc.Begin(final_lsn=lsn + 0x10000, commit_time=7, xid=xid))
        for _ in range(draw(st.integers(0, 3))):
            if not tables or draw(st.integers(0, 3)) == 0:
                emit(relation(draw(st.sampled_from([1, 2]))))
            for i in range(draw(st.integers(0, 15))):
                emit(insert(i))
        emit(pgc.Commit(flags=0, commit_lsn=lsn + 8, end_lsn=lsn + 16, commit_time=7))
    return out


def _records(items) -> bytes:
    return b"".join(
        struct.pack(">BBQI", v, int(s) | int(p) << 1, lsn, len(d)) + d
        for (v, s, p), lsn, d in items
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=streams(),
    options=st.sampled_from(
        [{}, {"transaction_events": True}, {"lenient": True}, {"memory_limit": 64}]
    ),
    chunk=st.sampled_from([1, 3, 4096]),
)
def test_chunks_give_the_events_and_errors_of_the_message_path(items, options, chunk):
    data = _records(items)
    want = outcome(EventReader(catalog=CATALOG, **options).read_raw(sources.raw_records(data)))
    saved = sources.CHUNK_RECORDS
    sources.CHUNK_RECORDS = chunk
    try:
        got = outcome(EventReader(catalog=CATALOG, **options).read_chunks(sources.raw_chunks(data)))
    finally:
        sources.CHUNK_RECORDS = saved
    assert got == want


def test_the_model_reaches_the_column_wise_path_and_its_fallbacks():
    """The property test above would pass vacuously if no run were loaded column-wise, or if
    every one were: count both on a stream with one good run and one bad one."""
    from pgcdc.capture import chunks as chunks_mod

    rel = pgc.Relation(
        relation_oid=1,
        namespace="public",
        relation_name="t",
        replica_identity=ord("d"),
        columns=(pgc.RelationColumn(flags=1, name="id", type_oid=23, type_modifier=-1),),
    )

    def ins(value):
        return pgc.Insert(
            relation_oid=1,
            new_tuple=pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=value),)),
        )

    msgs = [pgc.Begin(final_lsn=0x900, commit_time=1, xid=5), rel]
    msgs += [ins(b"%d" % i) for i in range(5)]
    msgs += [pgc.Commit(flags=0, commit_lsn=0x900, end_lsn=0x908, commit_time=1)]
    items = [
        ((1, False, False), 0x100 + i, pgc.encode(m, protocol_version=1))
        for i, m in enumerate(msgs)
    ]
    data = _records(items)
    calls = []
    loads = chunks_mod.ChangeRuns.plan

    def counting(self, chunk):
        plan = loads(self, chunk)
        calls.append(plan is not None and bool(plan[1]))
        return plan

    chunks_mod.ChangeRuns.plan = counting
    try:
        events = list(EventReader(catalog=CATALOG).read_chunks(sources.raw_chunks(data)))
    finally:
        chunks_mod.ChangeRuns.plan = loads
    assert calls == [True]
    assert [ev.after for ev in events] == [(i,) for i in range(5)]
    bad = data.replace(b"t\x00\x00\x00\x013", b"t\x00\x00\x00\x01x")  # '3' -> 'x'
    want = outcome(EventReader(catalog=CATALOG).read_raw(sources.raw_records(bad)))
    got = outcome(EventReader(catalog=CATALOG).read_chunks(sources.raw_chunks(bad)))
    assert got == want and len(want[0]) == 3 and "ChangeStreamError" in want[1][0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=streams(),
    how=st.integers(0, 3),
    at=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    chunk=st.sampled_from([2, 4096]),
)
def test_damaged_records_end_the_same_way_read_in_chunks(items, how, at, byte, chunk):
    """A byte cut, replaced, added or dropped anywhere (headers included): the C reader
    hands over to the reference reader at the same record, so the events before the damage
    and the error after it are the same."""
    data = bytearray(_records(items))
    at %= len(data) + 1
    if how == 0:
        del data[at:]
    elif how == 1 and at < len(data):
        data[at] = byte
    elif how == 2:
        data.insert(at, byte)
    elif at < len(data):
        del data[at]
    data = bytes(data)
    want = outcome(EventReader(catalog=CATALOG).read_raw(sources.raw_records(data)))
    saved = sources.CHUNK_RECORDS
    sources.CHUNK_RECORDS = chunk
    try:
        got = outcome(EventReader(catalog=CATALOG).read_chunks(sources.raw_chunks(data)))
    finally:
        sources.CHUNK_RECORDS = saved
    assert got == want


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("name", ["_capturescan.c", "_copyread.c"])
def test_the_capture_reader_compiles_without_warnings(tmp_path, name):
    source = Path(sources.__file__).parent.parent / "runtime" / name
    include = sysconfig.get_paths()["include"]
    proc = subprocess.run(
        ["cc", "-std=c99", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-c",
         f"-I{include}", str(source), "-o", str(tmp_path / "scan.o")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
