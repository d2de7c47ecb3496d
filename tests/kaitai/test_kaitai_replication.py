"""The Kaitai Struct files of spec/replication.yaml (the streaming replication protocol's
CopyData messages), compiled with the real kaitai-struct-compiler 0.11 and run against the
installed replication_codec: hypothesis messages at every server version, damaged bytes, the
sample session, and the walsender traffic recorded from PostgreSQL 15-18."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgoutput_codec as pgc
from tests.support import kaitai as K
from tests.support import spec_strategies as S
from tests.support.kaitai_damage import DAMAGE, LANGUAGES, damage  # noqa: E402

rc = pytest.importorskip("replication_codec", reason="run make generate")

SPEC_PATH = K.SPEC_DIR / "replication.yaml"
FIXTURE_DIR = K.ROOT / "tests" / "captures" / "replication"


def _rendered() -> K.Rendered:
    return K.rendered(SPEC_PATH)


SPEC = _rendered().spec


@pytest.fixture(scope="module")
def ksy(tmp_path_factory):
    return _rendered().write_ksy(tmp_path_factory.mktemp("ksy"))


@pytest.fixture(scope="module")
def parsers(ksy, tmp_path_factory) -> K.Parsers:
    return K.compile_parsers(SPEC, *ksy, tmp_path_factory.mktemp("ksc"))


@pytest.mark.parametrize("lang", LANGUAGES)
def test_ksy_compiles_without_errors_or_warnings(ksy, lang, tmp_path):
    K.ksc(ksy, tmp_path, langs=[lang])
    assert any((tmp_path / lang).rglob("*")), f"no {lang} output"


def test_ksy_shape():
    r = _rendered()
    msg = yaml.safe_load(r.files[r.message_ksy])
    cap = yaml.safe_load(r.files[r.capture_ksy])
    assert msg["meta"]["id"] == "replication_message"
    assert [(p["id"], p["type"]) for p in msg["params"]] == [("server_version", "u1")]
    data = next(a for a in msg["types"]["xlog_data"]["seq"] if a["id"] == "data")
    assert data["size-eos"] is True and "size" not in data
    assert cap["meta"]["id"] == "replication_capture"
    assert cap["meta"]["imports"] == ["replication_message"]
    assert cap["seq"][0]["contents"] == "PGREPCAP"
    record = cap["types"]["record"]["seq"]
    assert [a["id"] for a in record] == ["server_version", "flags", "lsn", "len_message", "message"]
    assert record[-1]["type"] == "replication_message(server_version)"
    assert "params" not in cap  # opens in the Web IDE with nothing to set


def _check(parsers, gates, msg):
    wire = bytes(rc.encode_gates(msg, *gates))
    expected = rc.decode_gates(wire, *gates)
    assert expected == msg
    K.check_message(parsers, rc, wire, gates, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.cases(SPEC, rc))
def test_message_cases(parsers, case):
    _check(parsers, *case)


@pytest.mark.parametrize("version", SPEC.version.values)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_at_every_version(parsers, version, data):
    gates = rc.PARAMS.resolve(version)
    for m in S.messages_allowed(SPEC, gates):
        _check(parsers, gates, data.draw(S.message(SPEC, rc, m.name, gates), label=m.name))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.cases(SPEC, rc), DAMAGE)
def test_accepts_and_rejects_what_the_codec_does(parsers, case, how):
    gates, msg = case
    data = damage(bytes(rc.encode_gates(msg, *gates)), *how)
    try:
        expected = rc.decode_gates(data, *gates)
    except rc.DecodeError:
        expected = None
    ks = K.ksy_accepts(parsers, data, gates)
    if expected is None:
        assert ks is None, f"the .ksy accepts what the codec rejects: {data.hex()}"
    else:
        assert ks is not None, f"the .ksy rejects what the codec accepts: {data.hex()}"
        K.check_parsed(ks, expected, data)


def test_postgresql_19_messages_need_version_19(parsers):
    for msg in (
        rc.PrimaryStatusRequest(client_time=1),
        rc.PrimaryStatusUpdate(wal_lsn=1, oldest_committing_xid=2, next_xid=3, server_time=4),
    ):
        wire = bytes(rc.encode(msg, server_version=19))
        assert K.ksy_accepts(parsers, wire, (19,)) is not None
        assert K.ksy_accepts(parsers, wire, (18,)) is None


def test_sample_covers_every_message(parsers):
    data = _rendered().sample
    records = rc.capture.loads(data)
    assert rc.capture.dumps(records) == data
    seen = K.check_capture(parsers, SPEC, data, records)
    assert set(seen) == {m.class_name for m in SPEC.messages}
    assert {r.version for r in records} == {19}
    # an XLogData carries a real pgoutput message
    inner = [pgc.decode(r.decode().data, protocol_version=1) for r in records if r.data[:1] == b"w"]
    assert {type(m) for m in inner} >= {pgc.Begin}


def _walsender_fixtures():
    from tests.postgres import replication_fixtures as fixtures
    from tests.postgres import servers

    for key in servers.SERVER_KEYS:
        path = fixtures.fixture_path(FIXTURE_DIR, key)
        if path.exists():
            yield key, fixtures.read(path)


def test_walsender_traffic(parsers):
    """Every CopyData payload PostgreSQL 15-18 sent or was sent parses as the codec decodes it."""
    total = 0
    for key, fixture in _walsender_fixtures():
        gates = rc.PARAMS.resolve(fixture.server_major)
        for i, (_direction, payload) in enumerate(fixture.records):
            try:
                K.check_message(parsers, rc, bytes(payload), gates)
            except K.Mismatch as exc:
                raise K.Mismatch(f"{key} record {i}: {exc}") from None
            total += 1
    if not total:
        pytest.skip("no walsender fixtures under tests/captures/replication")


def test_xlogdata_data_is_the_whole_rest(parsers):
    msg = rc.XLogData(wal_start=1, wal_end=2, server_time=3, data=b"")
    wire = bytes(rc.encode_gates(msg, 10))
    ks = K.ksy_accepts(parsers, wire, (10,))
    assert ks is not None and ks.body.data == b""
    assert dataclasses.replace(msg, data=b"B" * 300) == rc.decode(
        bytes(rc.encode(dataclasses.replace(msg, data=b"B" * 300), server_version=10)),
        server_version=10,
    )
