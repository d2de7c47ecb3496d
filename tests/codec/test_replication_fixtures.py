"""The replication codec against real walsender traffic: the CopyData messages PostgreSQL 15-18
sent (``w``, ``k``) and this client sent (``r``, ``h``), recorded by
``python -m tests.postgres.replication_fixtures`` into tests/captures/replication/.

Every payload decodes with replication_codec and re-encodes byte-identical, and every ``w``
payload's data decodes with pgoutput_codec in the slot's context (protocol version, streaming).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import pgoutput_codec as pgc
from tests.postgres import replication_fixtures as fixtures
from tests.postgres import servers

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "captures" / "replication"
SERVER_TAGS = {b"w", b"k"}
CLIENT_TAGS = {b"r", b"h"}


def _rc():
    try:
        import replication_codec
    except ImportError as e:
        pytest.fail(f"replication_codec is not importable ({e}): run make generate")
    return replication_codec


@pytest.fixture(scope="module", params=servers.SERVER_KEYS)
def fixture(request):
    path = fixtures.fixture_path(FIXTURE_DIR, request.param)
    if not path.exists():
        pytest.fail(f"{path.name} is missing: python -m tests.postgres.replication_fixtures")
    return fixtures.read(path)


def test_fixture_is_a_real_session(fixture):
    kinds = Counter((d, p[:1]) for d, p in fixture.records)
    assert {p[:1] for d, p in fixture.records if d == b"B"} == SERVER_TAGS, kinds
    assert {p[:1] for d, p in fixture.records if d == b"F"} == CLIENT_TAGS, kinds
    assert fixture.meta["server_version"].startswith(
        servers.EXPECTED_VERSIONS[fixture.meta["server"]]
    )


def test_every_payload_roundtrips(fixture):
    rc = _rc()
    version = fixture.server_major
    types = {
        b"w": rc.XLogData,
        b"k": rc.PrimaryKeepalive,
        b"r": rc.StandbyStatusUpdate,
        b"h": rc.HotStandbyFeedback,
    }
    replies_requested = 0
    for i, (direction, payload) in enumerate(fixture.records):
        where = f"{fixture.meta['server']} record {i} ({direction.decode()} {payload[:1]!r})"
        try:
            msg = rc.decode(payload, server_version=version)
            again = rc.encode(msg, server_version=version)
        except (rc.DecodeError, rc.EncodeError) as e:
            pytest.fail(f"{where}: {e!r} offset={e.offset} path={e.path}")
        assert type(msg) is types[payload[:1]], where
        assert bytes(again) == payload, f"{where}: re-encoded {bytes(again).hex()}"
        if isinstance(msg, rc.PrimaryKeepalive) and msg.reply_requested:
            replies_requested += 1
    assert replies_requested >= 1, "the session has no keepalive that asked for a reply"


def test_xlogdata_payloads_decode_with_pgoutput(fixture):
    rc = _rc()
    meta = fixture.meta
    dec = pgc.StreamDecoder(protocol_version=meta["protocol_version"], streaming=meta["streaming"])
    names = Counter()
    for i, (direction, payload) in enumerate(fixture.records):
        if payload[:1] != b"w":
            continue
        msg = rc.decode(payload, server_version=fixture.server_major)
        try:
            names[type(dec.decode(msg.data)).__name__] += 1
        except pgc.DecodeError as e:
            pytest.fail(f"record {i} (lsn {msg.wal_start:X}): {e} path={e.path}")
    # the workload's transactions, streamed ones included, are all there
    # (16+ stream every transaction: the harness sets debug_logical_replication_streaming)
    for name in ("Relation", "Insert", "Update", "Delete", "Truncate", "Message", "StreamStart",
                 "StreamStop", "StreamCommit", "CommitPrepared", "RollbackPrepared"):  # fmt: skip
        assert names[name] > 0, f"no {name} in {meta['server']}: {dict(names)}"
