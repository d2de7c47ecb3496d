"""Replay every committed real-server capture (tests/captures/) through the generated codec.

For each capture file of the manifest: every record decodes through a StreamDecoder and encodes
back to the identical bytes, the per-type counts equal the manifest, and every one of the 19
pgoutput message types occurs on PG 16, 17 and 18. Needs only the committed fixtures
(regenerate them with ``python -m tests.postgres.make_captures``).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.postgres import plugin  # noqa: E402
from tests.postgres.capture import ALL_MESSAGE_NAMES, MESSAGE_NAMES  # noqa: E402

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

CAPTURES = ROOT / "tests" / "captures"
MANIFEST = json.loads((CAPTURES / "manifest.json").read_text())
FILES = MANIFEST["files"]
FULL_COVERAGE_SERVERS = ("pg16", "pg17", "pg18")


def _codec():
    try:
        import pgoutput_codec
    except ImportError as e:  # a real failure, not a skip: the codec is the thing under test
        pytest.fail(f"pgoutput_codec is not importable ({e}); run: pip install -e .")
    return pgoutput_codec


def _read(path: Path):
    _codec()
    from pgoutput_codec import capture

    return capture.read(path)


def test_manifest_matches_files():
    on_disk = {p.relative_to(CAPTURES).as_posix() for p in CAPTURES.rglob("*.pgcap*")}
    assert on_disk == {f["path"] for f in FILES}


@pytest.mark.parametrize("entry", FILES, ids=[f["path"] for f in FILES])
def test_replay_capture(entry, request, record_property):
    pgc = _codec()
    pv = entry["protocol_version"]
    mode = entry["options"]["streaming"]
    records = _read(CAPTURES / entry["path"])
    assert len(records) == entry["records"]
    dec = pgc.StreamDecoder(protocol_version=pv, streaming=mode)
    decoded = Counter()
    for i, rec in enumerate(records):
        data = bytes(rec.data)
        assert rec.protocol_version == pv
        assert rec.parallel_streaming == (mode == "parallel")
        where = f"{entry['path']} record {i} (lsn {rec.lsn:X}, {data[:1]!r}): {data.hex()}"
        try:
            msg = dec.decode(data)
        except pgc.CodecError as e:
            pytest.fail(
                f"decode failed at {where}: {e!r} offset={getattr(e, 'offset', None)} "
                f"path={getattr(e, 'path', None)}"
            )
        name = type(msg).__name__
        assert name == MESSAGE_NAMES[data[:1]], where
        decoded[name] += 1
        kind = data[:1]
        assert dec.in_stream == (kind == b"S" or (rec.in_stream and kind != b"E")), where
        try:
            again = pgc.encode(msg, protocol_version=pv, streaming=mode, in_stream=rec.in_stream)
        except pgc.CodecError as e:
            pytest.fail(f"encode failed at {where}: {e!r}")
        assert bytes(again) == data, f"re-encoding differs at {where}: {bytes(again).hex()}"
    assert dict(sorted(decoded.items())) == entry["message_counts"]
    cov = plugin.coverage(request.config)
    cov.setdefault(entry["server"], Counter()).update(decoded)
    record_property("message_counts", dict(decoded))


@pytest.mark.parametrize("server", FULL_COVERAGE_SERVERS)
def test_all_message_types_captured(server):
    total = Counter()
    for f in FILES:
        if f["server"] == server:
            total.update(f["message_counts"])
    missing = [n for n in ALL_MESSAGE_NAMES if not total[n]]
    assert not missing, f"{server}: no capture contains {missing}"


def test_interfaces_and_protocols_covered():
    seen = {(f["server"], f["protocol_version"], f["options"]["interface"]) for f in FILES}
    for server, top in (("pg15", 3), ("pg16", 4), ("pg17", 4), ("pg18", 4)):
        for pv in range(1, top + 1):
            assert (server, pv, "sql") in seen
        assert (server, top, "walsender") in seen
        assert (server, 1, "walsender") in seen
