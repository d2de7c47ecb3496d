"""Byte vectors written by hand from the PostgreSQL docs, independent of the generator.

Each entry: (id, context, wire bytes, expected message). The hex is spelled field by field,
in the order the docs list the fields, so a reader can check it against the docs page.
One table drives the decoder test, the encoder test and the truncation/trailing-byte tests.
"""

from __future__ import annotations

import pgoutput_codec as pgc


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts))


def s(text: str) -> str:
    return (text.encode() + b"\x00").hex()


V1 = dict(protocol_version=1)
V2_IN = dict(protocol_version=2, streaming="on", in_stream=True)
V4_PAR = dict(protocol_version=4, streaming="parallel")
V4_ON = dict(protocol_version=4, streaming="on")

T = pgc.TupleColumn
NULL, TOAST = T(kind="n", value=None), T(kind="u", value=None)

TUPLE_3 = h("0003", "6e", "75", "74", "00000002", "3432")  # n, u, t "42"
TUPLE_3_VALUE = pgc.TupleData(columns=(NULL, TOAST, T(kind="t", value=b"42")))

VECTORS = [
    (
        "begin",
        V1,
        h("42", "0000000116B374D8", "0002A3B2C1D0E0F0", "000004D2"),
        pgc.Begin(final_lsn=0x116B374D8, commit_time=0x2A3B2C1D0E0F0, xid=1234),
    ),
    (
        "begin-max-lsn-negative-time",
        V1,
        h("42", "FFFFFFFFFFFFFFFF", "FFFFFFFFFFFFFFFF", "FFFFFFFF"),
        pgc.Begin(final_lsn=2**64 - 1, commit_time=-1, xid=2**32 - 1),
    ),
    (
        "message-transactional",
        V1,
        h("4D", "01", "0000000000001000", s("pfx"), "00000003", "AABBCC"),
        pgc.Message(flags=1, lsn=0x1000, prefix="pfx", content=b"\xaa\xbb\xcc"),
    ),
    (
        "message-in-stream",
        V2_IN,
        h("4D", "00000309", "00", "0000000000000010", s(""), "00000000"),
        pgc.Message(xid=777, flags=0, lsn=0x10, prefix="", content=b""),
    ),
    (
        "commit",
        V1,
        h("43", "00", "0000000000000100", "0000000000000200", "0000000000000300"),
        pgc.Commit(flags=0, commit_lsn=0x100, end_lsn=0x200, commit_time=0x300),
    ),
    (
        "origin",
        V1,
        h("4F", "00000000DEADBEEF", s("node_a")),
        pgc.Origin(origin_lsn=0xDEADBEEF, origin_name="node_a"),
    ),
    (
        "relation",
        V1,
        h(
            "52",
            "00004000",
            s("public"),
            s("users"),
            "66",
            "0002",
            "01",
            s("id"),
            "00000017",
            "FFFFFFFF",
            "00",
            s("name"),
            "00000413",
            "00000044",
        ),
        pgc.Relation(
            relation_oid=16384,
            namespace="public",
            relation_name="users",
            replica_identity=ord("f"),
            columns=(
                pgc.RelationColumn(flags=1, name="id", type_oid=23, type_modifier=-1),
                pgc.RelationColumn(flags=0, name="name", type_oid=1043, type_modifier=68),
            ),
        ),
    ),
    (
        "relation-in-stream-no-columns",
        V2_IN,
        h("52", "00000010", "00004000", s(""), s("t"), "64", "0000"),
        pgc.Relation(
            xid=16,
            relation_oid=16384,
            namespace="",
            relation_name="t",
            replica_identity=ord("d"),
            columns=(),
        ),
    ),
    (
        "type",
        V1,
        h("59", "00006000", s("public"), s("mood")),
        pgc.Type(type_oid=0x6000, namespace="public", type_name="mood"),
    ),
    (
        "insert",
        V1,
        h("49", "00004000", "4E", TUPLE_3.hex()),
        pgc.Insert(relation_oid=16384, new_tuple=TUPLE_3_VALUE),
    ),
    (
        "insert-binary-in-stream",
        V2_IN,
        h("49", "00000005", "00004000", "4E", "0001", "62", "00000004", "0000002A"),
        pgc.Insert(
            xid=5,
            relation_oid=16384,
            new_tuple=pgc.TupleData(columns=(T(kind="b", value=b"\x00\x00\x00\x2a"),)),
        ),
    ),
    (
        "update-no-old",
        V1,
        h("55", "00004000", "4E", TUPLE_3.hex()),
        pgc.Update(relation_oid=16384, new_tuple=TUPLE_3_VALUE),
    ),
    (
        "update-key",
        V1,
        h("55", "00004000", "4B", "0001", "74", "00000001", "37", "4E", TUPLE_3.hex()),
        pgc.Update(
            relation_oid=16384,
            old_kind="K",
            old_tuple=pgc.TupleData(columns=(T(kind="t", value=b"7"),)),
            new_tuple=TUPLE_3_VALUE,
        ),
    ),
    (
        "update-old-in-stream",
        V2_IN,
        h("55", "00000009", "00004000", "4F", TUPLE_3.hex(), "4E", "0000"),
        pgc.Update(
            xid=9,
            relation_oid=16384,
            old_kind="O",
            old_tuple=TUPLE_3_VALUE,
            new_tuple=pgc.TupleData(columns=()),
        ),
    ),
    (
        "delete-key",
        V1,
        h("44", "00004000", "4B", "0001", "6E"),
        pgc.Delete(relation_oid=16384, old_kind="K", old_tuple=pgc.TupleData(columns=(NULL,))),
    ),
    (
        "delete-old",
        V1,
        h("44", "00004000", "4F", TUPLE_3.hex()),
        pgc.Delete(relation_oid=16384, old_kind="O", old_tuple=TUPLE_3_VALUE),
    ),
    (
        "truncate",
        V1,
        h("54", "00000002", "03", "00004000", "00004001"),
        pgc.Truncate(options=3, relation_oids=(16384, 16385)),
    ),
    (
        "truncate-in-stream",
        V2_IN,
        h("54", "00000007", "00000000", "00"),
        pgc.Truncate(xid=7, options=0, relation_oids=()),
    ),
    ("stream-start", V4_ON, h("53", "000001F4", "01"), pgc.StreamStart(xid=500, first_segment=1)),
    ("stream-stop", V4_ON, h("45"), pgc.StreamStop()),
    (
        "stream-commit",
        V4_ON,
        h("63", "000001F4", "00", "0000000000000A00", "0000000000000B00", "0000000000000C00"),
        pgc.StreamCommit(xid=500, flags=0, commit_lsn=0xA00, end_lsn=0xB00, commit_time=0xC00),
    ),
    (
        "stream-abort-on",
        V4_ON,
        h("41", "000001F4", "000001F5"),
        pgc.StreamAbort(xid=500, subxid=501),
    ),
    (
        "stream-abort-parallel",
        V4_PAR,
        h("41", "000001F4", "000001F4", "0000000000000D00", "FFFFFFFFFFFFFFFE"),
        pgc.StreamAbort(xid=500, subxid=500, abort_lsn=0xD00, abort_time=-2),
    ),
    (
        "begin-prepare",
        dict(protocol_version=3),
        h("62", "0000000000000100", "0000000000000200", "0000000000000300", "0000002A", s("gid1")),
        pgc.BeginPrepare(prepare_lsn=0x100, end_lsn=0x200, prepare_time=0x300, xid=42, gid="gid1"),
    ),
    (
        "prepare",
        dict(protocol_version=3),
        h(
            "50",
            "00",
            "0000000000000100",
            "0000000000000200",
            "0000000000000300",
            "0000002A",
            s("g"),
        ),
        pgc.Prepare(flags=0, prepare_lsn=0x100, end_lsn=0x200, prepare_time=0x300, xid=42, gid="g"),
    ),
    (
        "commit-prepared",
        dict(protocol_version=3),
        h(
            "4B",
            "00",
            "0000000000000100",
            "0000000000000200",
            "0000000000000300",
            "0000002A",
            s("g"),
        ),
        pgc.CommitPrepared(
            flags=0, commit_lsn=0x100, end_lsn=0x200, commit_time=0x300, xid=42, gid="g"
        ),
    ),
    (
        "rollback-prepared",
        dict(protocol_version=3),
        h(
            "72",
            "00",
            "0000000000000100",
            "0000000000000200",
            "0000000000000300",
            "0000000000000400",
            "0000002A",
            s("g"),
        ),
        pgc.RollbackPrepared(
            flags=0,
            prepare_end_lsn=0x100,
            rollback_end_lsn=0x200,
            prepare_time=0x300,
            rollback_time=0x400,
            xid=42,
            gid="g",
        ),
    ),
    (
        "stream-prepare",
        dict(protocol_version=4, streaming="on"),
        h(
            "70",
            "00",
            "0000000000000100",
            "0000000000000200",
            "0000000000000300",
            "0000002A",
            s("g"),
        ),
        pgc.StreamPrepare(
            flags=0, prepare_lsn=0x100, end_lsn=0x200, prepare_time=0x300, xid=42, gid="g"
        ),
    ),
    (
        "relation-latin1-name",
        V1,
        h("52", "00004000", s("public"), "6EE900", "64", "0000"),  # 'n', 0xE9: not UTF-8
        pgc.Relation(
            relation_oid=16384,
            namespace="public",
            relation_name="n\udce9",
            replica_identity=ord("d"),
            columns=(),
        ),
    ),
]

# Bad input: (id, context, bytes, expected offset, expected path, words in the message)
BAD = [
    ("empty", V1, b"", 0, (), "empty"),
    ("unknown-tag", V1, h("5A00"), 0, (), "unknown message tag"),
    ("stream-start-on-v1", V1, h("53000001F401"), 0, ("StreamStart",), "protocol_version 2"),
    (
        "insert-wrong-new-tag",
        V1,
        h("49", "00004000", "58", "0000"),
        5,
        ("Insert", "new_tag"),
        "expected 'N'",
    ),
    (
        "unknown-column-kind",
        V1,
        h("49", "00004000", "4E", "0002", "6E", "78"),
        9,
        ("Insert", "new_tuple", "columns", 1, "kind"),
        "unknown value 'x'",
    ),
    (
        "delete-without-key",
        V1,
        h("44", "00004000", "4E", "0000"),
        5,
        ("Delete", "old_kind"),
        "unknown value 'N'",
    ),
    (
        "unterminated-string",
        V1,
        h("4F", "0000000000000001", "6162"),
        9,
        ("Origin", "origin_name"),
        "NUL",
    ),
    (
        "value-longer-than-message",
        V1,
        h("49", "00004000", "4E", "0001", "74", "00000010", "41"),
        13,
        ("Insert", "new_tuple", "columns", 0, "value"),
        "ends after",
    ),
    (
        "parallel-abort-on-plain-stream",
        V4_ON,
        h("41", "000001F4", "000001F4", "0000000000000D00", "0000000000000000"),
        9,
        ("StreamAbort",),
        "trailing",
    ),
]
