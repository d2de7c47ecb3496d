"""Walsender traffic fixtures: the full CopyData messages of one short replication session per
server (PostgreSQL 15, 16, 17, 18), both directions, for the replication codec's tests.

    python -m tests.postgres.replication_fixtures [--out tests/captures/replication] [--servers pg15,...]

Per server: schema, a two-phase slot made with CREATE_REPLICATION_SLOT over the walsender, the
small workload, then START_REPLICATION with the richest options (highest protocol version,
binary, streaming, messages, two_phase; origin on 16+) and ``wal_sender_timeout = 1s`` so the
server asks for replies. Recorded: every ``w`` and ``k`` the server sent, the ``r`` replies and
unsolicited status updates this client sent, and one ``h`` (hot standby feedback) at the end.

File format (``<server>.replfx.gz``, gzip, documented in tests/captures/replication/README.md):

    magic        b"PGREPLFX"
    version      u1 = 1
    meta_length  u4, then that many bytes of UTF-8 JSON (server version, pgoutput options)
    records, to the end:
        direction  u1   b"B" server -> client (backend), b"F" client -> server (frontend)
        length     u4
        payload    `length` bytes: one CopyData message, type byte included
"""

from __future__ import annotations

import argparse
import gzip
import json
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pgcdc.capture.options import PluginOptions, max_protocol_version, pg_now_us
from pgcdc.capture.walsender import WalsenderConnection

from . import servers, workload
from .capture import _is_end_marker

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "captures" / "replication"
MAGIC = b"PGREPLFX"
FORMAT_VERSION = 1
SLOT = "fixture_slot"
_RECORD = struct.Struct(">cI")


@dataclass(frozen=True)
class Fixture:
    meta: dict
    records: list[tuple[bytes, bytes]]  # (direction b"B" | b"F", CopyData payload)

    @property
    def server_major(self) -> int:
        return self.meta["server_major"]


def dumps(fx: Fixture) -> bytes:
    meta = json.dumps(fx.meta, sort_keys=True).encode()
    parts = [MAGIC, bytes((FORMAT_VERSION,)), struct.pack(">I", len(meta)), meta]
    for direction, payload in fx.records:
        parts += [_RECORD.pack(direction, len(payload)), payload]
    return b"".join(parts)


def loads(data: bytes) -> Fixture:
    if data[:8] != MAGIC or data[8] != FORMAT_VERSION:
        raise ValueError(f"not a replication fixture (expected {MAGIC!r} version 1)")
    (n,) = struct.unpack_from(">I", data, 9)
    meta = json.loads(data[13 : 13 + n])
    off, records = 13 + n, []
    while off < len(data):
        direction, length = _RECORD.unpack_from(data, off)
        off += _RECORD.size
        if direction not in (b"B", b"F") or off + length > len(data):
            raise ValueError(f"bad record at byte {off - _RECORD.size}")
        records.append((direction, data[off : off + length]))
        off += length
    return Fixture(meta, records)


def read(path: Path) -> Fixture:
    return loads(gzip.decompress(Path(path).read_bytes()))


def write(path: Path, fx: Fixture) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: reproducible bytes
        f.write(dumps(fx))


def fixture_options(major: int) -> PluginOptions:
    top = max_protocol_version(major)
    return PluginOptions(
        publications=(workload.PUBLICATION,),
        protocol_version=top,
        binary=True,
        streaming="parallel" if top >= 4 else "on",
        messages=True,
        origin="any" if major >= 16 else None,
        two_phase=True,
    )


def record_session(srv, log=print, timeout: float = 60.0) -> Fixture:
    import replication_codec as rc

    opts = fixture_options(srv.major)
    with srv.connect() as conn:
        workload.prepare_schema(conn, srv.major)
        ws = WalsenderConnection.connect(srv.conninfo())
        try:
            ws.create_slot(SLOT, two_phase=True)
            workload.run(conn, srv.major)
            ws.execute("SET wal_sender_timeout = '1s'")  # the server then asks for replies
            ws.start_replication(SLOT, 0, opts.as_list())
            records: list[tuple[bytes, bytes]] = []
            last = 0
            ended_at = None
            asked = 0
            deadline = time.monotonic() + timeout

            def send(msg) -> None:
                data = rc.encode(msg, server_version=srv.major)
                ws.send(data)
                records.append((b"F", bytes(data)))

            while time.monotonic() < deadline:
                buf = ws.read(0.2)
                if buf is None:
                    continue
                data = bytes(buf)
                records.append((b"B", data))
                msg = rc.decode(data, server_version=srv.major)
                if isinstance(msg, rc.XLogData):
                    last = max(last, msg.wal_start)
                    if ended_at is None and _is_end_marker(msg.data):
                        ended_at = time.monotonic()
                        # an unsolicited status update: everything received, nothing flushed
                        send(rc.StandbyStatusUpdate(
                            written_lsn=last, flushed_lsn=0, applied_lsn=0,
                            client_time=pg_now_us(), reply_requested=False,
                        ))  # fmt: skip
                elif isinstance(msg, rc.PrimaryKeepalive) and msg.reply_requested:
                    asked += 1
                    send(rc.StandbyStatusUpdate(
                        written_lsn=last, flushed_lsn=0, applied_lsn=0,
                        client_time=pg_now_us(), reply_requested=False,
                    ))  # fmt: skip
                if ended_at is not None and asked >= 2:
                    break
            else:
                raise TimeoutError(
                    f"{srv.key}: no end marker / keepalive requests within {timeout}s "
                    f"({len(records)} messages)"
                )
            # Hot standby feedback with no xmin: the server clears the walsender's xmin. (It is
            # meant for physical standbys; the slot is dropped with the server.)
            send(rc.HotStandbyFeedback(
                client_time=pg_now_us(), xmin=0, xmin_epoch=0, catalog_xmin=0,
                catalog_xmin_epoch=0,
            ))  # fmt: skip
            time.sleep(0.2)
        finally:
            ws.close()
    meta = {
        "server": srv.key,
        "server_version": srv.version,
        "server_major": srv.major,
        "slot_two_phase": True,
        "protocol_version": opts.protocol_version,
        "binary": opts.binary,
        "streaming": opts.streaming,
        "messages": opts.messages,
        "origin": opts.origin,
        "two_phase": opts.two_phase,
        "publication": workload.PUBLICATION,
        "wal_sender_timeout": "1s",
    }
    return Fixture(meta, records)


def fixture_path(out: Path, key: str) -> Path:
    return out / f"{key}.replfx.gz"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--servers", default=",".join(servers.SERVER_KEYS))
    args = ap.parse_args(argv)
    for key in args.servers.split(","):
        with servers.running_server(key) as srv:
            fx = record_session(srv)
        path = fixture_path(args.out, key)
        write(path, fx)
        kinds: dict[str, int] = {}
        for d, p in fx.records:
            k = f"{d.decode()}:{p[:1].decode()}"
            kinds[k] = kinds.get(k, 0) + 1
        print(f"{key} {fx.meta['server_version']}: {path.name} {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
