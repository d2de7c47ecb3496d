"""A sync cycle's count of change events (its apply line, ``pgcdc_applied_events``): every
applied change counted once, in the cycle that applied it, however far apply read past what
the cycle's first look saw."""

from __future__ import annotations

import dataclasses

import pgoutput_codec as pgc
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.capture.segments import SegmentWriter
from pgcdc.sync.records import NewRecords

OID = 16800
RELATION = pgc.Relation(
    relation_oid=OID,
    namespace="public",
    relation_name="r",
    replica_identity=ord("d"),
    columns=(pgc.RelationColumn(flags=1, name="id", type_oid=23, type_modifier=-1),),
)


def _row(i: int):
    return pgc.TupleData(columns=(pgc.TupleColumn(kind="t", value=str(i).encode()),))


def _transaction(w: SegmentWriter, lsn: int, inserts: int, deletes: int = 0) -> int:
    """One durable transaction at ``lsn``; its commit LSN (the next one starts past it)."""
    final = lsn + 0x10 * (inserts + deletes + 3)
    w.append(1, 0, lsn, pgc.encode(pgc.Begin(final_lsn=final, commit_time=1, xid=lsn % 997 + 1),
                                   protocol_version=1))  # fmt: skip
    w.append(1, 0, lsn + 8, pgc.encode(RELATION, protocol_version=1))
    for j in range(inserts):
        msg = pgc.Insert(relation_oid=OID, new_tuple=_row(j))
        w.append(1, 0, lsn + 0x10 * (j + 1), pgc.encode(msg, protocol_version=1))
    for j in range(deletes):
        msg = pgc.Delete(relation_oid=OID, old_kind="K", old_tuple=_row(j))
        w.append(1, 0, lsn + 0x10 * (inserts + j + 1), pgc.encode(msg, protocol_version=1))
    commit = pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=1)
    w.append(1, 0, final, pgc.encode(commit, protocol_version=1))
    w.mark_end(final + 8)
    w.commit()
    return final


def test_a_cycle_counts_what_apply_read_past_its_first_look(tmp_path):
    w = SegmentWriter(tmp_path, fsync=False)
    w.start(0x1000)
    records = NewRecords(tmp_path)
    assert records.look(None)[:2] == (0, False)  # nothing durable yet

    a = _transaction(w, 0x1000, 5)
    events, worth, durable = records.look(None)
    assert (events, worth) == (5, True)
    assert durable == a + 8

    # while the cycle applies, the capture makes two more transactions durable; apply read
    # the first of them (its position: b), the second came after apply's start
    b = _transaction(w, a + 0x20, 3, deletes=2)
    c = _transaction(w, b + 0x20, 7)
    assert records.look(None, upto=b)[0] == 5  # the second look counts up to b only

    # the next cycle: c's 7 changes are new to it (applied position b), nothing else
    events, worth, durable = records.look(b)
    assert (events, worth, durable) == (7, True, c + 8)
    # and nothing is new after that
    assert records.look(c)[:2] == (0, False)


def test_changes_already_applied_are_not_counted(tmp_path):
    w = SegmentWriter(tmp_path, fsync=False)
    w.start(0x1000)
    a = _transaction(w, 0x1000, 4)
    b = _transaction(w, a + 0x20, 6)
    records = NewRecords(tmp_path)
    # a rerun whose tables hold everything up to a: only b's changes are new
    assert records.look(a)[:2] == (6, True)
    records = NewRecords(tmp_path)
    assert records.look(b)[:2] == (0, False)


def test_a_rerun_does_not_read_the_segments_before_its_applied_position(tmp_path, monkeypatch):
    """Segments end at a transaction's end: one followed by a segment that starts at or
    before the applied position holds nothing to count, and is not read (a rerun's first
    look read every segment not yet pruned: 0.27 s for 300 MB)."""
    import builtins

    from pgcdc.capture.segments import list_segments
    from pgcdc.sync import records as records_module

    w = SegmentWriter(tmp_path, fsync=False, max_bytes=1)  # a segment per transaction
    w.start(0x1000)
    lsn, commits = 0x1000, []
    for n in (2, 3, 4, 5):
        commits.append(_transaction(w, lsn, n))
        lsn = commits[-1] + 0x20
    segments = [p.name for p in list_segments(tmp_path)]
    assert len(segments) == 5  # the last one open and empty

    def look(floor):
        opened = []

        def open_(path, *a, **k):
            opened.append(path.name)
            return builtins.open(path, *a, **k)

        monkeypatch.setattr(records_module, "open", open_, raising=False)
        events, worth, _durable = NewRecords(tmp_path).look(floor)
        return events, worth, opened

    assert look(None) == (2 + 3 + 4 + 5, True, segments[:4])
    # the segment of the last applied transaction is read (the next one starts at its end,
    # past its commit LSN), the ones before it are not
    assert look(commits[0]) == (3 + 4 + 5, True, segments[:4])
    assert look(commits[1]) == (4 + 5, True, segments[1:4])
    assert look(commits[2]) == (5, True, segments[2:4])
    assert look(commits[3]) == (0, False, segments[3:4])


def test_after_apply_says_the_tables_hold_what_is_durable_when_nothing_is_left(tmp_path):
    """A cycle's apply reads what is durable when it starts, often past its first look: once
    nothing durable is left to apply, the tables hold everything up to the durable position
    (the end of the last transaction), not only to the last commit's LSN; with a transaction
    still to apply, nothing more is said."""
    w = SegmentWriter(tmp_path, fsync=False)
    w.start(0x1000)
    a = _transaction(w, 0x1000, 2)
    records = NewRecords(tmp_path)
    assert records.look(None)[:2] == (2, True)
    b = _transaction(w, a + 0x20, 3)  # durable while apply ran, and applied by it
    assert records.after_apply(None, b) == (3, b + 8)
    assert records.look(b)[:2] == (0, False)  # the next cycle: nothing new
    c = _transaction(w, b + 0x20, 4)  # durable while apply ran, and applied by it
    d = _transaction(w, c + 0x20, 1)  # durable after apply's start: left
    assert records.after_apply(b, c) == (4, None)
    assert records.look(c)[:2] == (1, True)  # counted by the cycle that applies it
    assert records.after_apply(c, d) == (0, d + 8)


# transactions as (kind, inserts, deletes, truncate, message): kind "plain" or "streamed"
_TX = st.tuples(st.sampled_from(["plain", "plain", "streamed"]), st.integers(0, 6),
                st.integers(0, 3), st.booleans(), st.booleans())  # fmt: skip


def _mixed(w: SegmentWriter, txs) -> list[int]:
    """``txs`` as protocol-2 records (a streamed one: a Stream Start, its changes, a Stream
    Stop and a Stream Commit; some with a logical message, some with a non-transactional one
    after them), each durable at its end: their commit LSNs."""
    pv, lsn, commits = 2, 0x1000, []

    def put(msg, stream=False):
        nonlocal lsn
        data = pgc.encode(msg, protocol_version=pv, streaming="on", in_stream=stream)
        w.append(pv, 1 if stream else 0, lsn, data)
        lsn += 0x10

    for k, (kind, inserts, deletes, truncate, message) in enumerate(txs):
        xid = 700 + k
        final = lsn + 0x10 * (inserts + deletes + truncate + message + 5)
        stream = kind == "streamed"
        x = xid if stream else None
        if stream:
            put(pgc.StreamStart(xid=xid, first_segment=1), True)
        else:
            put(pgc.Begin(final_lsn=final, commit_time=1, xid=xid))
        put(dataclasses.replace(RELATION, xid=x), stream)
        for j in range(inserts):
            put(pgc.Insert(xid=x, relation_oid=OID, new_tuple=_row(j)), stream)
        if message:
            put(pgc.Message(xid=x, flags=1, lsn=lsn, prefix="p", content=b"m"), stream)
        for j in range(deletes):
            put(pgc.Delete(xid=x, relation_oid=OID, old_kind="K", old_tuple=_row(j)), stream)
        if truncate:
            put(pgc.Truncate(xid=x, options=0, relation_oids=(OID,)), stream)
        lsn = final
        if stream:
            put(pgc.StreamStop(), True)
            lsn = final
            put(pgc.StreamCommit(xid=xid, flags=0, commit_lsn=final, end_lsn=final + 8,
                                 commit_time=1))  # fmt: skip
        else:
            put(pgc.Commit(flags=0, commit_lsn=final, end_lsn=final + 8, commit_time=1))
        commits.append(final)
        if message and k % 2:
            put(pgc.Message(xid=None, flags=0, lsn=lsn, prefix="q", content=b"n"))
        w.mark_end(lsn + 8)
        w.commit()
        lsn += 0x20
    return commits


@settings(max_examples=60, deadline=None)
@given(txs=st.lists(_TX, min_size=1, max_size=12), data=st.data())
def test_the_counts_are_the_change_events_read_from_the_captures(tmp_path_factory, txs, data):
    """A look counts what apply reads as change events (``read_captures``, an independent
    reader): every change of a transaction committed past the floor, up to ``upto`` now and
    past it at the next look; a chunk of plain transactions is counted a transaction at a
    time, one with streamed records record by record."""
    from pgcdc.events.reader import read_captures

    directory = tmp_path_factory.mktemp("cap")
    size = data.draw(st.sampled_from([1, 300, 1 << 20]))  # a segment per transaction, or a few
    w = SegmentWriter(directory, fsync=False, max_bytes=size)
    w.start(0x1000)
    commits = _mixed(w, txs)
    events = [e for e in read_captures([directory]) if e.op in ("c", "u", "d", "t")]
    streamed = any(kind == "streamed" for kind, *_ in txs)
    # a streamed transaction's changes are read before its commit is known: counted when read
    floor = None if streamed else data.draw(st.sampled_from([None, *commits]))
    upto = None if streamed else data.draw(st.sampled_from([None, *commits]))
    after = [e for e in events if floor is None or e.commit_lsn > floor]
    now = [e for e in after if upto is None or e.commit_lsn <= upto]
    records = NewRecords(directory)
    got, worth, _durable = records.look(floor, upto=upto)
    assert got == len(now)
    assert worth == (bool(now) or streamed)  # a stream's records are apply's to judge
    assert records.look(floor)[0] == len(after) - len(now)  # the rest, at the next look
