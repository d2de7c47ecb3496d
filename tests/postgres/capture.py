"""Capture raw pgoutput messages from a running server.

* SQL interface: ``pg_logical_slot_peek_binary_changes`` (peek: the slot is not consumed, so one
  slot serves every option set); the record LSN is the ``lsn`` column.
* walsender: ``START_REPLICATION SLOT ... LOGICAL`` on a ``replication=database`` psycopg 3
  connection through the low-level ``pgconn``; the record LSN is the XLogData start LSN, the
  payload is the CopyData after the 25-byte 'w' header. The capture ends at the workload's end
  marker message (see :mod:`tests.postgres.workload`).
"""

from __future__ import annotations

import select
import struct
import time
from collections import Counter
from dataclasses import dataclass

from pgoutput_codec import capture as capfmt

from pgcdc.capture.options import PluginOptions

from . import workload

MESSAGE_NAMES = {
    b"B": "Begin",
    b"M": "Message",
    b"C": "Commit",
    b"O": "Origin",
    b"R": "Relation",
    b"Y": "Type",
    b"I": "Insert",
    b"U": "Update",
    b"D": "Delete",
    b"T": "Truncate",
    b"S": "StreamStart",
    b"E": "StreamStop",
    b"c": "StreamCommit",
    b"A": "StreamAbort",
    b"b": "BeginPrepare",
    b"P": "Prepare",
    b"K": "CommitPrepared",
    b"r": "RollbackPrepared",
    b"p": "StreamPrepare",
}
ALL_MESSAGE_NAMES = tuple(MESSAGE_NAMES.values())

PG_EPOCH_OFFSET_US = 946_684_800_000_000  # 2000-01-01 - 1970-01-01 in microseconds


@dataclass(frozen=True)
class Options:
    protocol_version: int
    binary: bool = False
    streaming: str = "off"  # off | on | parallel
    two_phase: bool = False
    messages: bool = True
    origin: str | None = "any"  # None: not sent (PG 15 does not know the option)
    publication: str = workload.PUBLICATION
    interface: str = "sql"  # sql | walsender
    decoding: str = "immediate"  # debug_logical_replication_streaming (16+); PG 15: buffered
    # decode a slot created with two_phase=true even though the two_phase option is not given
    two_phase_slot: bool = False

    def plugin_options(self) -> list[tuple[str, str]]:
        """The pgoutput options, as pgcdc's capture passes them."""
        same = ("protocol_version", "binary", "streaming", "messages", "origin", "two_phase")
        kw = {name: getattr(self, name) for name in same}  # PluginOptions' names too
        return PluginOptions(publications=(self.publication,), **kw).as_list()

    @property
    def parallel(self) -> bool:
        return self.streaming == "parallel"


def records_from_payloads(payloads, protocol_version: int, parallel: bool) -> list[capfmt.Record]:
    """Records from (lsn, payload) pairs of one slot, in order. in_stream is set for messages
    strictly between a Stream Start 'S' and the next Stream Stop 'E' (neither 'S' nor 'E'
    itself is in_stream)."""
    recs, in_stream = [], False
    for lsn, data in payloads:
        kind = bytes(data[:1])
        recs.append(
            capfmt.Record(
                protocol_version, in_stream and kind not in (b"S", b"E"), parallel, lsn, bytes(data)
            )
        )
        if kind == b"S":
            in_stream = True
        elif kind == b"E":
            in_stream = False
    return recs


def message_counts(records) -> dict[str, int]:
    c = Counter(MESSAGE_NAMES.get(r.data[:1], f"unknown:{r.data[:1]!r}") for r in records)
    return dict(sorted(c.items()))


def lsn_to_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def sql_capture(conn, slot: str, opts: Options) -> list[capfmt.Record]:
    """Peek all changes of ``slot`` with ``opts`` through the SQL interface."""
    args = []
    params: list[str] = []
    for k, v in opts.plugin_options():
        args.append("%s, %s")
        params += [k, v]
    if _has_debug_streaming(conn):
        conn.execute(f"SET debug_logical_replication_streaming = {opts.decoding}")
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL"
        + "".join(", " + a for a in args)
        + ")",
        [slot, *params],
    ).fetchall()
    if _has_debug_streaming(conn):
        conn.execute("RESET debug_logical_replication_streaming")
    return records_from_payloads(
        ((lsn_to_int(lsn), bytes(data)) for lsn, data in rows), opts.protocol_version, opts.parallel
    )


def _has_debug_streaming(conn) -> bool:
    return conn.info.server_version >= 160000


def _is_end_marker(data: bytes) -> bool:
    # Message: 'M', u8 flags, u64 lsn, prefix\0, u32 len, content (non-transactional: no xid)
    return (
        data[:1] == b"M"
        and data[10 : 10 + len(workload.END_PREFIX) + 1] == workload.END_PREFIX.encode() + b"\0"
        and data.endswith(workload.END_CONTENT)
    )


def _now_pg_us() -> int:
    return int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US


class WalsenderError(RuntimeError):
    pass


def walsender_capture(
    server, slot: str, opts: Options, timeout: float = 60.0
) -> list[capfmt.Record]:
    """Stream ``slot`` over the walsender protocol until the workload's end marker."""
    from psycopg import pq

    conn = server.connect_replication()
    try:
        pgconn = conn.pgconn
        if server.major >= 16:
            # SHOW/SET work on a replication=database connection
            conn.execute(f"SET debug_logical_replication_streaming = {opts.decoding}")
        optstr = ", ".join(f"\"{k}\" '{v}'" for k, v in opts.plugin_options())
        pgconn.send_query(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({optstr})".encode())
        res = pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            msg = pgconn.error_message.decode(errors="replace")
            raise WalsenderError(f"START_REPLICATION failed: {msg}")
        payloads: list[tuple[int, bytes]] = []
        last = 0
        deadline = time.monotonic() + timeout
        while True:
            n, buf = pgconn.get_copy_data(1)
            if n == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WalsenderError(f"timed out after {len(payloads)} messages")
                ready, _, _ = select.select([pgconn.socket], [], [], min(left, 1.0))
                if ready:
                    pgconn.consume_input()
                continue
            if n == -1:
                raise WalsenderError("server ended the COPY stream before the end marker")
            if n < -1:
                raise WalsenderError(pgconn.error_message.decode(errors="replace"))
            data = bytes(buf)
            if data[:1] == b"w":
                start, _end, _ts = struct.unpack_from(">QQq", data, 1)
                payload = data[25:]
                payloads.append((start, payload))
                last = max(last, start)
                if _is_end_marker(payload):
                    break
            elif data[:1] == b"k":
                wal_end, _ts, reply = struct.unpack_from(">QqB", data, 1)
                if reply:
                    # report what we received, never confirm a flush: the slot stays put
                    pgconn.put_copy_data(b"r" + struct.pack(">QQQqB", last, 0, 0, _now_pg_us(), 0))
                    pgconn.flush()
            else:
                raise WalsenderError(f"unexpected CopyData {data[:1]!r}")
        return records_from_payloads(payloads, opts.protocol_version, opts.parallel)
    finally:
        conn.close()


def workload_catalog():
    """The catalog of the workload's types that are not built in, as ``pgcdc capture`` records
    it, read from real servers (tests/captures/pgNN/catalog.jsonl, written by
    ``python -m tests.postgres.make_captures --catalog-only``; the same on every major)."""
    from pathlib import Path

    from pgcdc.capture.catalog import load_catalog

    return load_catalog([Path(__file__).resolve().parent.parent / "captures" / "pg18"])
