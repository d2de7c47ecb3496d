"""Transaction assembly on hand-built pgoutput streams: plain, streamed (with subtransaction
and top-level aborts), two-phase, logical messages, unchanged TOAST, errors, spilling.

The messages are built as dataclasses and encoded with the codec, so the reader sees the
same bytes a server would send."""

from __future__ import annotations

import json

import pytest

import pgoutput_codec as pgc
from pgcdc.cli import changes
from pgcdc.events.reader import ChangeStreamError, read_events
from pgcdc.values import UNCHANGED, RawValue
from tests.support.transactions import INT4, INT8, OID_A, OID_B, TEXT, Wire, relation, tup  # noqa: E402

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm


REL_A = relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)])
REL_B = relation(OID_B, "b", [("k", INT8, True), ("doc", TEXT, True)], identity="f")


def events(wire, **options):
    return list(read_events(wire.records, **options))


def summary(evs):
    return [(e.op, e.xid, e.commit_lsn, e.tx_ordinal, e.before, e.after) for e in evs]


def test_plain_transaction_events_carry_names_keys_and_order():
    w = Wire(1, "off").extend(
        pgc.Begin(final_lsn=0x5000, commit_time=1_000_000, xid=700),
        REL_A,
        pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "one")),
        pgc.Update(relation_oid=OID_A, old_kind="K", old_tuple=tup(1, None), new_tuple=tup(2, "x")),
        pgc.Delete(relation_oid=OID_A, old_kind="K", old_tuple=tup(2, None)),
        pgc.Commit(flags=0, commit_lsn=0x5000, end_lsn=0x5030, commit_time=1_000_000),
    )
    evs = events(w, transaction_events=True)
    assert [e.op for e in evs] == ["begin", "c", "u", "d", "end"]
    assert [e.order_key for e in evs] == [(0x5000, i) for i in range(5)]
    ins, upd, dele = evs[1:4]
    assert (ins.schema, ins.table, ins.after_dict()) == ("public", "a", {"id": 1, "v": "one"})
    assert upd.before_dict() == {"id": 1} and upd.after_dict() == {"id": 2, "v": "x"}
    assert dele.before_is_key and dele.before == (2,) and dele.after is None
    assert {e.xid for e in evs} == {700} and evs[-1].detail == (3,)
    assert ins.lsn == w.records[2].lsn  # the message's own LSN


def stream_of_two_transactions(streaming="on"):
    """xid 100 (subxact 101 aborted, 102 kept) interleaved with xid 200 (aborted whole),
    then xid 300 committed before 100."""
    w = Wire(4, streaming)
    abort_extra = {"abort_lsn": 0x9000, "abort_time": 5} if streaming == "parallel" else {}
    w.extend(
        pgc.StreamStart(xid=100, first_segment=1),
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)], xid=100),
        pgc.Insert(xid=100, relation_oid=OID_A, new_tuple=tup(1, "top")),
        pgc.Insert(xid=101, relation_oid=OID_A, new_tuple=tup(2, "aborted subxact")),
        pgc.StreamStop(),
        pgc.StreamStart(xid=200, first_segment=1),
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)], xid=200),
        pgc.Insert(xid=200, relation_oid=OID_A, new_tuple=tup(9, "aborted top")),
        pgc.StreamStop(),
        pgc.StreamStart(xid=100, first_segment=0),
        pgc.Insert(xid=102, relation_oid=OID_A, new_tuple=tup(3, "released subxact")),
        pgc.Message(xid=100, flags=1, lsn=0x1234, prefix="p", content=b"in txn"),
        pgc.StreamStop(),
        pgc.StreamAbort(xid=100, subxid=101, **abort_extra),
        pgc.StreamAbort(xid=200, subxid=200, **abort_extra),
        pgc.StreamStart(xid=300, first_segment=1),
        pgc.Insert(xid=300, relation_oid=OID_A, new_tuple=tup(4, "other")),
        pgc.StreamStop(),
        pgc.StreamCommit(xid=300, flags=0, commit_lsn=0x7000, end_lsn=0x7010, commit_time=7),
        pgc.StreamCommit(xid=100, flags=0, commit_lsn=0x8000, end_lsn=0x8010, commit_time=8),
    )
    return w


@pytest.mark.parametrize("streaming", ["on", "parallel"])
def test_streamed_transactions_drop_aborted_subtransactions_and_release_in_commit_order(
    streaming,
):
    evs = events(stream_of_two_transactions(streaming))
    assert summary(evs) == [
        ("c", 300, 0x7000, 1, None, (4, "other")),
        ("c", 100, 0x8000, 1, None, (1, "top")),
        ("c", 100, 0x8000, 2, None, (3, "released subxact")),
        ("m", 100, 0x8000, 3, None, None),
    ]
    assert evs[-1].detail == ("p", b"in txn", True)
    assert [e.commit_time for e in evs] == [7, 8, 8, 8]


def test_spilling_to_disk_gives_the_same_events_and_frees_memory():
    from pgcdc.events.reader import EventReader

    reader = EventReader(memory_limit=0)
    spilled = list(reader.read(stream_of_two_transactions().records))
    assert summary(spilled) == summary(events(stream_of_two_transactions()))
    assert reader.budget.spilled_bytes > 0
    assert reader.budget.in_memory == 0 and not reader.budget.buffers


def test_a_stray_stream_abort_after_a_plain_commit_is_ignored():
    w = Wire(1, "off").extend(
        pgc.Begin(final_lsn=0x5000, commit_time=1, xid=700),
        REL_A,
        pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "x")),
        pgc.Commit(flags=0, commit_lsn=0x5000, end_lsn=0x5010, commit_time=1),
        pgc.StreamAbort(xid=700, subxid=700),  # PG 18 sends this to protocol 1 clients
    )
    assert [e.after for e in events(w)] == [(1, "x")]


def test_two_phase_held_by_gid_until_commit_prepared_and_dropped_at_rollback():
    w = Wire(3, "on").extend(
        pgc.BeginPrepare(prepare_lsn=0x100, end_lsn=0x110, prepare_time=1, xid=50, gid="g1"),
        REL_A,
        pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "prepared")),
        pgc.Prepare(flags=0, prepare_lsn=0x100, end_lsn=0x110, prepare_time=1, xid=50, gid="g1"),
        pgc.BeginPrepare(prepare_lsn=0x200, end_lsn=0x210, prepare_time=2, xid=51, gid="g2"),
        pgc.Insert(relation_oid=OID_A, new_tuple=tup(2, "rolled back")),
        pgc.Prepare(flags=0, prepare_lsn=0x200, end_lsn=0x210, prepare_time=2, xid=51, gid="g2"),
        pgc.StreamStart(xid=52, first_segment=1),
        pgc.Insert(xid=52, relation_oid=OID_A, new_tuple=tup(3, "stream prepared")),
        pgc.StreamStop(),
        pgc.StreamPrepare(
            flags=0, prepare_lsn=0x300, end_lsn=0x310, prepare_time=3, xid=52, gid="g3"
        ),
    )
    assert events(w) == []  # nothing is committed yet
    w.extend(
        pgc.RollbackPrepared(
            flags=0,
            prepare_end_lsn=0x210,
            rollback_end_lsn=0x400,
            prepare_time=2,
            rollback_time=4,
            xid=51,
            gid="g2",
        ),
        pgc.CommitPrepared(
            flags=0, commit_lsn=0x500, end_lsn=0x510, commit_time=5, xid=52, gid="g3"
        ),
        pgc.CommitPrepared(
            flags=0, commit_lsn=0x600, end_lsn=0x610, commit_time=6, xid=50, gid="g1"
        ),
    )
    assert summary(events(w)) == [
        ("c", 52, 0x500, 1, None, (3, "stream prepared")),
        ("c", 50, 0x600, 1, None, (1, "prepared")),
    ]


def test_non_transactional_messages_are_emitted_at_once():
    w = Wire(4, "on").extend(
        pgc.StreamStart(xid=100, first_segment=1),
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)], xid=100),
        pgc.Insert(xid=100, relation_oid=OID_A, new_tuple=tup(1, "x")),
        pgc.StreamStop(),
        pgc.Message(flags=0, lsn=0x2222, prefix="nt", content=b"now"),
        pgc.StreamCommit(xid=100, flags=0, commit_lsn=0x3000, end_lsn=0x3010, commit_time=1),
    )
    evs = events(w)
    assert [(e.op, e.order_key) for e in evs] == [("m", (0x2222, -1)), ("c", (0x3000, 1))]
    assert evs[0].detail == ("nt", b"now", False) and evs[0].xid is None


def test_unchanged_toast_is_filled_from_a_full_old_row_else_left_out():
    w = Wire(1, "off").extend(
        pgc.Begin(final_lsn=0x5000, commit_time=1, xid=700),
        REL_A,
        REL_B,
        pgc.Update(relation_oid=OID_A, new_tuple=tup(1, UNCHANGED)),
        pgc.Update(
            relation_oid=OID_B,
            old_kind="O",
            old_tuple=tup(5, "big doc"),
            new_tuple=tup(6, UNCHANGED),
        ),
        pgc.Commit(flags=0, commit_lsn=0x5000, end_lsn=0x5010, commit_time=1),
    )
    left_out, filled = events(w)
    assert left_out.after[1] is UNCHANGED and left_out.unchanged == ("v",)
    assert left_out.after_dict() == {"id": 1}
    assert filled.after == (6, "big doc") and filled.unchanged == ()


def test_a_buffered_change_is_typed_with_the_relation_it_arrived_under():
    # the stream's insert has 2 columns; an ALTER TABLE commits (3 columns) before it does
    w = Wire(4, "on").extend(
        pgc.StreamStart(xid=100, first_segment=1),
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)], xid=100),
        pgc.Insert(xid=100, relation_oid=OID_A, new_tuple=tup(1, "old shape")),
        pgc.StreamStop(),
        pgc.Begin(final_lsn=0x5000, commit_time=1, xid=101),
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False), ("w", INT8, False)]),
        pgc.Insert(relation_oid=OID_A, new_tuple=tup(2, "new shape", 7)),
        pgc.Commit(flags=0, commit_lsn=0x5000, end_lsn=0x5010, commit_time=1),
        pgc.StreamCommit(xid=100, flags=0, commit_lsn=0x6000, end_lsn=0x6010, commit_time=2),
    )
    new, old = events(w)
    assert new.after_dict() == {"id": 2, "v": "new shape", "w": 7}
    assert old.after_dict() == {"id": 1, "v": "old shape"}


@pytest.mark.parametrize(
    "msgs, index, words",
    [
        (
            [
                pgc.Begin(final_lsn=0x5000, commit_time=1, xid=7),
                pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "x")),
            ],
            1,
            "relation OID 16384",
        ),
        ([pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "x"))], 0, "outside any transaction"),
        ([pgc.Commit(flags=0, commit_lsn=1, end_lsn=2, commit_time=1)], 0, "without a Begin"),
        (
            [pgc.StreamCommit(xid=9, flags=0, commit_lsn=1, end_lsn=2, commit_time=1)],
            0,
            "no Stream Start opened",
        ),
        (
            [
                pgc.Begin(final_lsn=0x5000, commit_time=1, xid=7),
                pgc.Begin(final_lsn=0x6000, commit_time=1, xid=8),
            ],
            1,
            "has not ended",
        ),
        (
            [
                pgc.Begin(final_lsn=0x5000, commit_time=1, xid=7),
                REL_A,
                pgc.Insert(relation_oid=OID_A, new_tuple=tup("not a number", "x")),
            ],
            2,
            "column 'id' (#0, type int4, oid 23, text value)",
        ),
        (
            [
                pgc.StreamStart(xid=9, first_segment=1),
                pgc.Insert(xid=9, relation_oid=OID_A, new_tuple=tup(1, "x")),
            ],
            1,
            "relation OID 16384",
        ),
        (
            [
                pgc.CommitPrepared(
                    flags=0, commit_lsn=1, end_lsn=2, commit_time=1, xid=3, gid="nope"
                )
            ],
            0,
            "'nope'",
        ),
    ],
)
def test_bad_input_is_an_error_naming_the_message_and_lsn(msgs, index, words):
    w = Wire(4, "on").extend(*msgs)
    with pytest.raises(ChangeStreamError) as info:
        events(w)
    err = info.value
    lsn = w.records[index].lsn
    assert err.index == index and err.lsn == lsn
    text = str(err)
    assert f"message {index} " in text and f"0/{lsn:X}" in text and words in text, text


def test_lenient_mode_keeps_raw_values_and_the_errors():
    w = Wire(1, "off").extend(
        pgc.Begin(final_lsn=0x5000, commit_time=1, xid=7),
        REL_A,
        pgc.Insert(relation_oid=OID_A, new_tuple=tup("not a number", "x")),
        pgc.Insert(relation_oid=OID_B + 1, new_tuple=tup(1)),  # unknown relation
        pgc.Commit(flags=0, commit_lsn=0x5000, end_lsn=0x5010, commit_time=1),
    )
    bad_value, unknown = events(w, lenient=True)
    assert bad_value.after[0] == RawValue("t", b"not a number", INT4)
    assert bad_value.after[1] == "x" and len(bad_value.errors) == 1
    assert unknown.table is None and unknown.after == (RawValue("t", b"1", 0),)
    assert "unknown relation OID 16391" in unknown.errors[0]


def test_changes_cli_filters_by_table_and_commit_lsn(tmp_path, capsys):
    w = Wire(1, "off")
    for i, commit in enumerate((0x5000, 0x6000, 0x7000)):
        w.extend(
            pgc.Begin(final_lsn=commit, commit_time=1, xid=700 + i),
            REL_A,
            REL_B,
            pgc.Insert(relation_oid=OID_A, new_tuple=tup(i, "a")),
            pgc.Insert(relation_oid=OID_B, new_tuple=tup(i, "b")),
            pgc.Truncate(options=1, relation_oids=(OID_A, OID_B)),
            pgc.Commit(flags=0, commit_lsn=commit, end_lsn=commit + 16, commit_time=1),
        )
    path = tmp_path / "c.pgcap"
    pgc.capture.write(path, w.records)
    assert (
        changes.main(
            [str(path), "--from-lsn", "0/6000", "--until-lsn", "0/6000", "--table", "public.a"]
        )
        == 0
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["op"], x["after"]) for x in lines] == [("c", {"id": 1, "v": "a"}), ("t", None)]
    assert lines[1]["truncate"] == {"cascade": True, "restart_identity": False}
    src = lines[0]["source"]
    assert (src["commit_lsn"], src["tx_ordinal"], src["table"], src["xid"]) == (
        "0/6000",
        1,
        "a",
        701,
    )
    assert src["lsn"] == f"0/{w.records[10].lsn:X}"


def test_changes_cli_reports_bad_input_with_exit_status_1(tmp_path, capsys):
    w = Wire(1, "off").add(pgc.Insert(relation_oid=OID_A, new_tuple=tup(1, "x")))
    path = tmp_path / "bad.pgcap"
    pgc.capture.write(path, w.records)
    assert changes.main([str(path)]) == 1
    assert "message 0 (Insert) at LSN" in capsys.readouterr().err
