"""replication_codec, the second spec: round trips with strategies derived from the spec, the
PostgreSQL 19 messages from bytes laid out by hand from the protocol documentation, and the
composition with pgoutput_codec.

No PostgreSQL 19 server is available here, so 's' and 'p' are checked against the documented
layout: Byte1('s'), Int64 WAL position, Int64 oldest committing FullTransactionId, Int64 next
FullTransactionId, Int64 server clock; Byte1('p'), Int64 client clock. The walsender traffic
of real PostgreSQL 15-18 servers is in tests/codec/test_replication_fixtures.py.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings

import pgoutput_codec as pgc
import replication_codec as rc
from codegen.loader import load_spec
from tests.support import spec_strategies as S

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

SPEC = load_spec("spec/replication.yaml")
PGOUTPUT = load_spec("spec/pgoutput.yaml")

STATUS = b"s" + struct.pack(">QQQq", 0x16_B374D848, (3 << 32) | 750, (3 << 32) | 755, 123456789)
REQUEST = b"p" + struct.pack(">q", -5)


@pytest.fixture(params=["c", "python"])
def impl(request):
    if request.param == "c" and rc._decoder.DISPATCH.speedups is None:
        pytest.fail("the replication_codec accelerator is not built (make generate)")
    rc.use_speedups(request.param == "c")
    yield request.param
    rc.use_speedups(True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=S.cases(SPEC, rc))
def test_round_trip_both_ways(data):
    gates, msg = data
    for accelerated in (True, False):
        rc.use_speedups(accelerated)
        wire = rc.encode_gates(msg, *gates)
        assert rc.decode_gates(wire, *gates) == msg
        assert rc.encode_gates(rc.decode_gates(wire, *gates), *gates) == wire
    rc.use_speedups(True)


def test_primary_status_update_from_the_documented_layout(impl):
    msg = rc.decode(STATUS, server_version=19)
    assert msg == rc.PrimaryStatusUpdate(
        wal_lsn=0x16_B374D848,
        oldest_committing_xid=(3 << 32) | 750,
        next_xid=(3 << 32) | 755,
        server_time=123456789,
    )
    assert msg.wal_lsn_text == "16/B374D848"
    assert rc.encode(msg, server_version=19) == STATUS
    assert rc.decode(REQUEST, server_version=19) == rc.PrimaryStatusRequest(client_time=-5)
    assert rc.encode(rc.PrimaryStatusRequest(client_time=-5), server_version=19) == REQUEST


@pytest.mark.parametrize("version", [15, 16, 17, 18])
def test_a_client_for_18_or_older_neither_decodes_nor_encodes_them(impl, version):
    for wire, cls in ((STATUS, "PrimaryStatusUpdate"), (REQUEST, "PrimaryStatusRequest")):
        with pytest.raises(rc.DecodeError) as err:
            rc.decode(wire, server_version=version)
        assert err.value.offset == 0 and err.value.path == (cls,)
        assert "server_version 19" in str(err.value)
    with pytest.raises(rc.EncodeError, match="server_version 19"):
        rc.encode(rc.PrimaryStatusRequest(client_time=1), server_version=version)


def test_damaged_messages_say_where(impl):
    with pytest.raises(rc.DecodeError) as err:
        rc.decode(STATUS[:20], server_version=19)
    # 20 bytes: tag, WAL position, oldest committing xid, then 3 of next_xid's 8 (at 1 + 8 + 8)
    assert err.value.path == ("PrimaryStatusUpdate", "next_xid")
    assert err.value.offset == 17
    with pytest.raises(rc.DecodeError) as err:
        rc.decode(b"k" + bytes(16), server_version=18)  # keepalive without its reply byte
    assert err.value.path == ("PrimaryKeepalive", "reply_requested")
    with pytest.raises(rc.DecodeError, match="trailing"):
        rc.decode(b"k" + bytes(18), server_version=18)


def test_xlogdata_carries_a_pgoutput_message_with_one_copy(impl):
    begin = pgc.encode(pgc.Begin(final_lsn=5, commit_time=6, xid=7), protocol_version=1)
    wire = b"w" + struct.pack(">QQq", 1, 2, 3) + begin
    x = rc.decode(memoryview(wire), server_version=18)
    assert type(x.data) is bytes and x.data == begin
    # bytes in, bytes out: pgoutput_codec decodes the payload without copying it again
    assert pgc.decode(x.data, protocol_version=1) == pgc.Begin(final_lsn=5, commit_time=6, xid=7)
    assert rc.decode(b"w" + bytes(24), server_version=10).data == b""


def test_the_spec_gates_only_the_19_messages():
    gated = {m.name: m.since for m in SPEC.messages if m.since}
    assert gated == {"Primary Status Update": 19, "Primary Status Request": 19}
    assert SPEC.version.name == "server_version" and not SPEC.contexts
