"""Hand-built pgoutput streams: relations, tuples and a wire of encoded messages
(tests/events/test_transactions*.py)."""

from __future__ import annotations

import pgoutput_codec as pgc
from pgcdc.values import UNCHANGED
from pgoutput_codec.capture import Record


INT4, INT8, TEXT = 23, 20, 25


OID_A, OID_B = 16384, 16390


def relation(oid, name, cols, identity="d", xid=None):
    """cols: (name, type oid, is_key)"""
    return pgc.Relation(
        xid=xid,
        relation_oid=oid,
        namespace="public",
        relation_name=name,
        replica_identity=ord(identity),
        columns=tuple(
            pgc.RelationColumn(flags=int(key), name=n, type_oid=t, type_modifier=-1)
            for n, t, key in cols
        ),
    )


def tup(*values):
    cols = []
    for v in values:
        if v is None:
            cols.append(pgc.TupleColumn(kind="n"))
        elif v is UNCHANGED:
            cols.append(pgc.TupleColumn(kind="u"))
        else:
            cols.append(pgc.TupleColumn(kind="t", value=str(v).encode()))
    return pgc.TupleData(columns=tuple(cols))


class Wire:
    """Encodes messages the way one slot sends them; in_stream follows Stream Start/Stop."""

    def __init__(self, protocol_version=4, streaming="on"):
        self.pv = protocol_version
        self.streaming = streaming
        self.in_stream = False
        self.records: list[Record] = []
        self.lsn = 0x1000

    def add(self, msg, lsn=None):
        if lsn is None:
            self.lsn += 0x10
            lsn = self.lsn
        tag = msg.TAG
        inside = self.in_stream and tag not in ("S", "E")
        data = pgc.encode(msg, protocol_version=self.pv, streaming=self.streaming, in_stream=inside)
        self.records.append(Record(self.pv, inside, self.streaming == "parallel", lsn, data))
        if tag == "S":
            self.in_stream = True
        elif tag == "E":
            self.in_stream = False
        return self

    def extend(self, *msgs):
        for m in msgs:
            self.add(m)
        return self
