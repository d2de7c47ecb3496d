"""Live conformance: start real PostgreSQL 15, 16, 17 and 18 servers, run the workload, capture
over the SQL interface and the walsender, and round-trip every message through the codec.

A missing server is a failure (ServerNotFound), never a skip: install the ``postgres`` extra
(pip install -e '.[postgres]') and Debian's postgresql-15.

Per server: two walsender streams run *while* the workload runs (highest protocol version,
binary, streaming parallel (on for PG 15), two_phase, debug_logical_replication_streaming =
buffered as in production; and protocol 1 text), then two SQL-interface captures (highest
protocol version with the same options in immediate streaming mode; protocol 1 text).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.postgres import capture, plugin, servers, workload  # noqa: E402
from tests.postgres.capture import ALL_MESSAGE_NAMES, MESSAGE_NAMES, Options  # noqa: E402

LIVE_SERVERS = (*servers.SERVER_KEYS, *servers.EXTRA_SERVER_KEYS)


def _codec():
    try:
        import pgoutput_codec
    except ImportError as e:
        pytest.fail(f"pgoutput_codec is not importable ({e}); run: pip install -e .")
    return pgoutput_codec


def _roundtrip(pgc, label: str, opts: Options, records) -> Counter:
    pv, mode = opts.protocol_version, opts.streaming
    dec = pgc.StreamDecoder(protocol_version=pv, streaming=mode)
    counts = Counter()
    for i, rec in enumerate(records):
        data = rec.data
        where = f"{label} record {i} (lsn {rec.lsn:X}, {data[:1]!r}): {data.hex()}"
        try:
            msg = dec.decode(data)
            again = pgc.encode(msg, protocol_version=pv, streaming=mode, in_stream=rec.in_stream)
        except pgc.CodecError as e:
            pytest.fail(
                f"codec error at {where}: {e!r} offset={getattr(e, 'offset', None)} "
                f"path={getattr(e, 'path', None)}"
            )
        assert type(msg).__name__ == MESSAGE_NAMES[data[:1]], where
        assert bytes(again) == data, f"re-encoding differs at {where}: {bytes(again).hex()}"
        counts[type(msg).__name__] += 1
    return counts


@pytest.mark.parametrize("key", LIVE_SERVERS)
def test_live_server_roundtrip(pg, key, request):
    pgc = _codec()
    with pg.database(key) as srv, srv.connect() as conn:
        top = 4 if srv.major >= 16 else 3
        origin = "any" if srv.major >= 16 else None
        richest = "parallel" if top >= 4 else "on"
        workload.prepare_schema(conn, srv.major)
        for slot, two_phase in (
            ("live_sql", True),
            ("live_sql_v1", False),
            ("live_ws", True),
            ("live_ws_v1", False),
        ):
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                [slot, two_phase],
            )
        ws_jobs = {
            "walsender top": (
                "live_ws",
                Options(
                    top,
                    True,
                    richest,
                    True,
                    origin=origin,
                    interface="walsender",
                    decoding="buffered",
                ),
            ),
            "walsender v1": (
                "live_ws_v1",
                Options(1, origin=origin, interface="walsender", decoding="buffered"),
            ),
        }
        results: dict[str, object] = {}

        def run(label, slot, opts):
            try:
                results[label] = capture.walsender_capture(srv, slot, opts, timeout=60)
            except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
                results[label] = e

        threads = [
            threading.Thread(target=run, args=(label, slot, o), daemon=True)
            for label, (slot, o) in ws_jobs.items()
        ]
        for t in threads:
            t.start()
        workload.run(conn, srv.major)
        for t in threads:
            t.join(90)
        captures = {}
        for label, (_slot, o) in ws_jobs.items():
            res = results.get(label)
            if isinstance(res, BaseException):
                raise res
            assert res is not None, f"{label}: walsender capture did not finish\n{srv.log_tail()}"
            captures[label] = (o, res)
        for label, slot, o in (
            ("sql top", "live_sql", Options(top, True, richest, True, origin=origin)),
            ("sql v1", "live_sql_v1", Options(1, origin=origin)),
        ):
            captures[label] = (o, capture.sql_capture(conn, slot, o))

    total = Counter()
    for label, (o, recs) in captures.items():
        assert recs, f"{key} {label}: no messages"
        counts = _roundtrip(pgc, f"{key} {label}", o, recs)
        assert counts == Counter(capture.message_counts(recs))
        total.update(counts)
    plugin.coverage(request.config).setdefault(f"live {key}", Counter()).update(total)
    if srv.major >= 16:
        missing = [n for n in ALL_MESSAGE_NAMES if not total[n]]
        assert not missing, f"{key}: live captures lack {missing}"
