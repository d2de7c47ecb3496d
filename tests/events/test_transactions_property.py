"""Property: however streamed transactions interleave, abort subtransactions, abort, or go
through two-phase commit, the events equal those of the same committed transactions sent
whole (Begin ... Commit, in commit order, without the aborted parts).

A model draws transactions (changes owned by the top xid or a subtransaction, aborted
subtransactions, a fate, streamed or not, an origin) and one interleaving of their actions in
WAL order. Two encodings of that history are built with the codec: how a protocol 4 slot with
streaming and two-phase sends it, and how a protocol 1 slot sends the committed transactions.
"""

from __future__ import annotations

import pytest

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from pgcdc.events.reader import read_events
from pgcdc.values import UNCHANGED
from tests.support.transactions import INT4, INT8, OID_A, OID_B, TEXT, Wire, relation, tup  # noqa: E402

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

FATES = ("commit", "abort", "prepare_commit", "prepare_rollback")
OPS = ("I", "U", "D", "T", "M")


@dataclass
class TxnModel:
    xid: int
    changes: list  # (owner xid, op, n)
    aborted_subxacts: set
    fate: str
    streamed: bool
    origin: str | None
    stray_abort: bool
    actions: list = field(default_factory=list)

    @property
    def gid(self) -> str:
        return f"gid{self.xid}"

    def kept(self) -> list:
        return [c for c in self.changes if c[0] not in self.aborted_subxacts]


@st.composite
def histories(draw):
    txns = []
    for t in range(draw(st.integers(1, 5))):
        xid = 1000 + 10 * t
        subxids = [xid + 1 + i for i in range(draw(st.integers(0, 3)))]
        owners = st.sampled_from([xid, *subxids])
        changes = draw(
            st.lists(st.tuples(owners, st.sampled_from(OPS), st.integers(0, 99)), max_size=7)
        )
        # a sequence number makes every change distinct (its LSN is looked up by it)
        changes = [(*c, i) for i, c in enumerate(changes)]
        aborted = draw(st.sets(st.sampled_from(subxids))) if subxids else set()
        txn = TxnModel(
            xid,
            changes,
            aborted,
            draw(st.sampled_from(FATES)),
            draw(st.booleans()),
            draw(st.sampled_from([None, "upstream"])),
            draw(st.booleans()),
        )
        # WAL order inside the transaction: each aborted subxact's abort right after its
        # last change (ROLLBACK TO), then the end (and, for two-phase, its later decision)
        last = {c[0]: i for i, c in enumerate(changes)}
        for i, change in enumerate(changes):
            txn.actions.append(("change", change))
            for sub in aborted:
                if last.get(sub) == i:
                    txn.actions.append(("subabort", sub))
        if txn.fate.startswith("prepare"):
            txn.actions.append(("prepare", None))
            txn.actions.append((txn.fate.split("_")[1] + "_prepared", None))
        else:
            txn.actions.append((txn.fate, None))
        txns.append(txn)
    nontx = draw(st.integers(0, 2))
    queues = [list(t.actions) for t in txns] + [[("nontx", None)] for _ in range(nontx)]
    owners = [*txns, *([None] * nontx)]
    schedule = []
    while any(queues):
        live = [i for i, q in enumerate(queues) if q]
        pick = live[draw(st.integers(0, len(live) - 1))]
        schedule.append((owners[pick], queues[pick].pop(0)))
    return (
        schedule,
        draw(st.sampled_from(["on", "parallel"])),
        draw(st.sampled_from([0, 400, 1 << 26])),
    )


def relations(xid=None):
    return (
        relation(OID_A, "a", [("id", INT4, True), ("v", TEXT, False)], xid=xid),
        relation(OID_B, "b", [("k", INT8, True), ("doc", TEXT, True)], identity="f", xid=xid),
    )


def change_message(owner, op, n, seq, xid):
    # xid is sent only inside a stream (then: the owning (sub)transaction)
    x = owner if xid else None
    if op == "I":
        return pgc.Insert(xid=x, relation_oid=OID_A, new_tuple=tup(n, f"v{n}"))
    if op == "U":
        new = tup(n + 1, UNCHANGED if n % 2 else f"w{n}")
        return pgc.Update(
            xid=x, relation_oid=OID_A, old_kind="K", old_tuple=tup(n, None), new_tuple=new
        )
    if op == "D":
        return pgc.Delete(xid=x, relation_oid=OID_B, old_kind="O", old_tuple=tup(n, f"d{n}"))
    if op == "T":
        return pgc.Truncate(xid=x, options=n % 4, relation_oids=(OID_A, OID_B))
    return pgc.Message(xid=x, flags=1, lsn=0x500 + n, prefix="tx", content=bytes([n]))


def lsn_of(pos: int) -> int:
    return 0x10000 + 0x100 * pos


def send_whole(w: Wire, txn: TxnModel, begin, end, lsns):
    w.add(begin)
    if txn.origin:
        w.add(pgc.Origin(origin_lsn=0x1234, origin_name=txn.origin))
    for r in relations():
        w.add(r)
    for change in txn.kept():
        w.add(change_message(*change, xid=False), lsn=lsns[(txn.xid, change)])
    w.add(end)


def streamed_wire(schedule, streaming) -> Wire:
    """What a protocol 4 slot with streaming and two_phase sends."""
    w = Wire(4, streaming)
    block = None
    started = set()
    lsns = {}
    abort_extra = {"abort_lsn": 0, "abort_time": 0}

    def close():
        nonlocal block
        if block is not None:
            w.add(pgc.StreamStop())
            block = None

    for pos, (txn, (kind, arg)) in enumerate(schedule):
        lsn = lsn_of(pos)
        if kind == "change":
            lsns[(txn.xid, arg)] = lsn
        if txn is None:  # a non-transactional message
            close()
            w.add(pgc.Message(flags=0, lsn=lsn, prefix="nt", content=b"x"), lsn=lsn)
            continue
        sent = bool(txn.changes)
        streamed = txn.streamed and sent
        if kind == "change":
            if streamed:
                if block is not txn:
                    close()
                    first = txn.xid not in started
                    w.add(pgc.StreamStart(xid=txn.xid, first_segment=int(first)))
                    if first:
                        started.add(txn.xid)
                        if txn.origin:
                            w.add(pgc.Origin(origin_lsn=0, origin_name=txn.origin))
                        for r in relations(txn.xid):
                            w.add(r)
                    block = txn
                w.add(change_message(*arg, xid=True), lsn=lsn)
            continue
        close()
        extra = dict(abort_extra, abort_lsn=lsn) if streaming == "parallel" else {}
        if kind == "subabort":
            if streamed:
                w.add(pgc.StreamAbort(xid=txn.xid, subxid=arg, **extra))
        elif kind == "abort":
            if streamed or txn.stray_abort:
                w.add(pgc.StreamAbort(xid=txn.xid, subxid=txn.xid, **extra))
        elif kind == "commit" and sent:
            if streamed:
                w.add(
                    pgc.StreamCommit(
                        xid=txn.xid, flags=0, commit_lsn=lsn, end_lsn=lsn + 8, commit_time=lsn * 3
                    )
                )
            else:
                send_whole(
                    w,
                    txn,
                    pgc.Begin(final_lsn=lsn, commit_time=lsn * 3, xid=txn.xid),
                    pgc.Commit(flags=0, commit_lsn=lsn, end_lsn=lsn + 8, commit_time=lsn * 3),
                    lsns,
                )
        elif kind == "prepare" and sent:
            args = dict(
                prepare_lsn=lsn, end_lsn=lsn + 8, prepare_time=lsn, xid=txn.xid, gid=txn.gid
            )
            if streamed:
                w.add(pgc.StreamPrepare(flags=0, **args))
            else:
                send_whole(w, txn, pgc.BeginPrepare(**args), pgc.Prepare(flags=0, **args), lsns)
        elif kind == "commit_prepared" and sent:
            w.add(
                pgc.CommitPrepared(
                    flags=0,
                    commit_lsn=lsn,
                    end_lsn=lsn + 8,
                    commit_time=lsn * 3,
                    xid=txn.xid,
                    gid=txn.gid,
                )
            )
        elif kind == "rollback_prepared" and sent:
            w.add(
                pgc.RollbackPrepared(
                    flags=0,
                    prepare_end_lsn=1,
                    rollback_end_lsn=lsn + 8,
                    prepare_time=1,
                    rollback_time=lsn,
                    xid=txn.xid,
                    gid=txn.gid,
                )
            )
    close()
    return w


def whole_wire(schedule) -> Wire:
    """The committed transactions as a protocol 1 slot sends them: whole, at commit."""
    w = Wire(1, "off")
    lsns = {
        (txn.xid, arg): lsn_of(pos)
        for pos, (txn, (kind, arg)) in enumerate(schedule)
        if kind == "change"
    }
    for pos, (txn, (kind, _)) in enumerate(schedule):
        lsn = lsn_of(pos)
        if txn is None:
            w.add(pgc.Message(flags=0, lsn=lsn, prefix="nt", content=b"x"), lsn=lsn)
        elif kind in ("commit", "commit_prepared") and txn.changes:
            send_whole(
                w,
                txn,
                pgc.Begin(final_lsn=lsn, commit_time=lsn * 3, xid=txn.xid),
                pgc.Commit(flags=0, commit_lsn=lsn, end_lsn=lsn + 8, commit_time=lsn * 3),
                lsns,
            )
    return w


def comparable(ev):
    rel = None if ev.relation is None else ev.relation.qualified_name
    return (
        ev.op,
        rel,
        ev.before,
        ev.after,
        ev.unchanged,
        ev.lsn,
        ev.commit_lsn,
        ev.tx_ordinal,
        ev.commit_time,
        ev.xid,
        ev.origin,
        ev.before_is_key,
        ev.detail,
        ev.errors,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_streamed_interleavings_give_the_events_of_the_whole_transactions(history):
    schedule, streaming, memory_limit = history
    streamed = list(
        read_events(
            streamed_wire(schedule, streaming).records,
            transaction_events=True,
            memory_limit=memory_limit,
        )
    )
    whole = list(read_events(whole_wire(schedule).records, transaction_events=True))
    assert [comparable(e) for e in streamed] == [comparable(e) for e in whole]
    keys = [e.order_key for e in whole]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # a strict total order
