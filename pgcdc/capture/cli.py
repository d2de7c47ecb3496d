"""``pgcdc capture``: read a replication slot into a capture directory, durably, resumably.

    pgcdc capture --dsn DSN --slot NAME --publication PUB[,PUB] --out DIR [options]

Exit status: 0 when stopped (SIGINT/SIGTERM, --until-lsn, --idle-exit) with everything received
up to the last transaction boundary durable; 2 for bad options and errors that retrying cannot
fix (one line on stderr, naming the fix). Dropped connections and server restarts are retried
with backoff, resuming from the durable position.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time

from ..lsn import format_lsn, parse_lsn
from .checks import ResumeRefused, SourceIdentity
from .segments import CaptureDirError, SegmentWriter
from .walsender import CaptureError, mask_dsn

PROG = "pgcdc capture"
RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15, 30)
SLOT_BUSY_PATIENCE = 30.0  # seconds: our own previous walsender may still hold the slot


class OptionError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage otherwise)
        raise OptionError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--dsn", default="", help="libpq connection string or URI (default: PG* env)")
    p.add_argument("--slot", required=True, help="logical replication slot (pgoutput)")
    p.add_argument("--publication", required=True, help="publication name(s), comma-separated")
    p.add_argument("--out", required=True, help="capture directory (created if missing)")
    p.add_argument("--create-slot", action="store_true", help="create the slot if it is missing")
    p.add_argument("--temporary", action="store_true", help="with --create-slot: temporary slot")
    p.add_argument("--two-phase", action="store_true", help="decode prepared transactions")
    p.add_argument("--protocol-version", type=int, help="pgoutput protocol (default: highest)")
    p.add_argument("--binary", action="store_true", help="binary column values")
    p.add_argument("--streaming", default="off", choices=("off", "on", "parallel"),
                   help="stream large transactions before they commit (protocol 2+; parallel: "
                   "protocol 4) (default off)")  # fmt: skip
    p.add_argument("--messages", action="store_true", help="include logical decoding messages")
    p.add_argument("--origin", choices=("any", "none"), help="origin filter (PostgreSQL 16+)")
    p.add_argument("--start-lsn", type=_lsn, help="start here when the directory is new")
    p.add_argument("--until-lsn", type=_lsn, help="stop at the first boundary at or past this")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS", help="stop after idle SECONDS")
    p.add_argument("--connect-attempts", type=int, default=3, metavar="N",
                   help="give up after N failed attempts at the first connection (default 3); "
                   "once connected, dropped connections are retried forever")  # fmt: skip
    p.add_argument("--status-interval", type=float, default=10.0, metavar="SECONDS",
                   help="send the server a status update at least this often")  # fmt: skip
    p.add_argument("--flush-interval", type=float, default=1.0, metavar="SECONDS",
                   help="make data durable (fsync) and acknowledge it this often")  # fmt: skip
    p.add_argument("--segment-bytes", type=int, default=64 << 20, metavar="BYTES",
                   help="start a new segment file past this size (default 64 MiB)")  # fmt: skip
    p.add_argument("--segment-seconds", type=float, default=600.0, metavar="SECONDS",
                   help="start a new segment file after this long (default 600)")  # fmt: skip
    p.add_argument("--sql", action="store_true", help="SQL-interface mode (no replication conn)")
    p.add_argument("--batch-size", type=int, default=10_000, help="--sql: changes per peek")
    p.add_argument("--retained-wal-warning", type=int, default=1 << 30, metavar="BYTES",
                   help="warn when the slot holds back more WAL than this")  # fmt: skip
    p.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                   help="stderr log: text with a progress line on a TTY, JSON lines otherwise "
                   "(default auto)")  # fmt: skip
    p.add_argument("--no-fsync", action="store_true", help=argparse.SUPPRESS)  # tests only
    return p


def _lsn(text: str) -> int:
    try:
        return parse_lsn(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Log:
    """Text with a progress line on a TTY, JSON lines otherwise (both on stderr)."""

    def __init__(self, fmt: str, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.json = fmt == "json" or (fmt == "auto" and not self.tty)
        self._progress_shown = False

    def event(self, level: str, event: str, message: str = "", **fields) -> None:
        if self.json:
            doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": level}
            doc.update(event=event, message=message, **fields)
            line = json.dumps(doc)
        else:
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            line = f"{PROG}: {level}: {message}" + (f" ({extra})" if extra else "")
        if self._progress_shown:
            self.stream.write("\r\x1b[K")
            self._progress_shown = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def progress(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()
        self._progress_shown = True

    def end_progress(self) -> None:
        if self._progress_shown:
            self.stream.write("\n")
            self._progress_shown = False


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class Capture:
    """The capture loop: a source (walsender stream or SQL reader) into a SegmentWriter."""

    def __init__(self, args, log: Log):
        self.args = args
        self.log = log
        self.stop = False
        self.writer = SegmentWriter(
            args.out,
            max_bytes=args.segment_bytes,
            max_seconds=args.segment_seconds,
            fsync=not args.no_fsync,
        )
        self.writer.slot = args.slot
        self.source = None
        self.done = False
        self._slot_created = False
        self.connected = False  # a session got as far as streaming at least once
        self.messages = self.bytes = 0  # received over all sessions

    def _make_source(self, start_lsn: int, state):
        a = self.args
        kw = dict(
            protocol_version=a.protocol_version,
            binary=a.binary,
            streaming=a.streaming,
            messages=a.messages,
            origin=a.origin,
            two_phase=a.two_phase,
            # a temporary slot exists only in the session that made it: create it every time
            create_slot=a.create_slot and (a.temporary or not self._slot_created),
            temporary=a.temporary,
            start_lsn=start_lsn,
            # a directory with a durable position: checked against this server before use
            resume_of=None if state is None else str(a.out),
            recorded_source=None if state is None else SourceIdentity.from_json(state.source),
        )
        if a.sql:
            from .sql import SqlSlotReader

            return SqlSlotReader(a.dsn, a.slot, a.publication, batch_size=a.batch_size, **kw)
        from .stream import LogicalStream

        return LogicalStream(
            a.dsn,
            a.slot,
            a.publication,
            status_interval=a.status_interval,
            auto_idle_ack=False,
            **kw,
        )

    def session(self) -> None:
        """One connection's worth: recover the directory, connect, stream until stopped."""
        a, log, writer = self.args, self.log, self.writer
        state = writer.recover()
        if state is not None and state.slot not in (None, a.slot):
            raise CaptureError(
                f"{a.out} holds a capture of slot {state.slot!r}, not {a.slot!r} "
                "(fix: use the same --slot, or a new --out directory)"
            )
        start = state.lsn if state is not None else (a.start_lsn or 0)
        src = self.source = self._make_source(start, state)
        src.open()
        try:
            self._slot_created = self._slot_created or src.created_slot is not None
            if src.created_slot is not None and state is not None:  # temporary: made anew
                log.event("warning", "slot_created", "the temporary slot was created again: "
                          "changes since the last session are not captured",
                          slot=a.slot)  # fmt: skip
            self.connected = True
            for warning in src.warnings:
                log.event("warning", "source", warning)
            writer.source = src.source.to_json()
            opts = src.options
            writer.info = {
                "protocol_version": opts.protocol_version,
                "streaming": opts.streaming,
                "binary": opts.binary,
                "messages": opts.messages,
                "two_phase": opts.two_phase,
                "origin": opts.origin,
                "publications": list(opts.publications),
                "interface": "sql" if a.sql else "walsender",
            }
            log.event("info", "started", f"capturing slot {a.slot} into {a.out}",
                      lsn=format_lsn(max(start, src.flushed_lsn)), dsn=mask_dsn(a.dsn),
                      protocol_version=opts.protocol_version, streaming=opts.streaming)  # fmt: skip
            writer.start(max(start, src.flushed_lsn))
            # what start-up allocated lives as long as the process: keep the collector, which
            # the per-message objects of the hot path set off, from walking it again and again
            gc.freeze()
            self._pump(src, opts)
        finally:
            self.source = None
            self.messages += src.stats.messages
            self.bytes += src.stats.bytes
            src.close()

    def _pump(self, src, opts) -> None:
        a, log, writer = self.args, self.log, self.writer
        buf = writer.buf  # the source appends records here; the writer hands them to the OS
        read_records = src.read_records
        batch_bytes = writer.buffer_bytes
        flush_every = a.flush_interval
        until = a.until_lsn
        now = time.monotonic()
        next_flush = now + flush_every
        next_report = now + (1.0 if log.tty else 10.0)
        last_data = now
        last_msgs, last_bytes, last_t = 0, 0, now
        warned_wal = False
        while not self.stop:
            count, end, ack = read_records(buf, 0.5, batch_bytes, until)
            now = time.monotonic()
            if end >= 0:
                writer.mark(end, ack)
                last_data = now
                if until is not None and ack >= until:
                    self._commit(src)
                    log.event("info", "until_lsn", "reached --until-lsn", lsn=format_lsn(ack))
                    self.done = True
                    return
            if count:
                if now >= next_flush and writer.marked:
                    self._commit(src)
                    next_flush = now + flush_every
                writer.maybe_write_out()
            else:  # idle
                if writer.marked:
                    self._commit(src)
                    next_flush = now + flush_every
                writer.write_out()  # let readers see what is mid-transaction too
                idle = src.idle_lsn
                if idle is not None and not writer.pending:
                    self.writer.commit_position(idle)
                    src.ack(idle)
                    if until is not None and idle >= until:
                        log.event("info", "until_lsn", "reached --until-lsn", lsn=format_lsn(idle))
                        self.done = True
                        return
                if a.idle_exit is not None and now - last_data >= a.idle_exit:
                    log.event("info", "idle_exit", f"no data for {a.idle_exit:g}s: stopping")
                    self.done = True
                    return
            if now >= next_report:
                st = src.stats
                dt = max(now - last_t, 1e-9)
                rate, brate = (st.messages - last_msgs) / dt, (st.bytes - last_bytes) / dt
                last_msgs, last_bytes, last_t = st.messages, st.bytes, now
                lag = max(0, st.server_wal_end - max(st.received_lsn, src.flushed_lsn))
                held = max(0, st.server_wal_end - src.flushed_lsn)
                durable = writer.state.lsn if writer.state else 0
                if log.tty and not log.json:
                    log.progress(
                        f"lsn {format_lsn(st.received_lsn)}  durable {format_lsn(durable)}  "
                        f"{rate:,.0f} msgs/s  {_human(brate)}/s  lag {_human(lag)}"
                    )
                else:
                    log.event("info", "progress", "", lsn=format_lsn(st.received_lsn),
                              durable_lsn=format_lsn(durable), messages=st.messages,
                              msgs_per_s=round(rate), bytes_per_s=round(brate),
                              lag_bytes=lag)  # fmt: skip
                if held > a.retained_wal_warning and not warned_wal:
                    log.event("warning", "retained_wal", f"the slot holds back {_human(held)} of "
                              "WAL not yet acknowledged", slot=a.slot,
                              flushed_lsn=format_lsn(src.flushed_lsn))  # fmt: skip
                    warned_wal = True
                elif held < a.retained_wal_warning // 2:
                    warned_wal = False
                next_report = now + (1.0 if log.tty else 10.0)
        if writer.marked:
            self._commit(src)

    def _commit(self, src) -> None:
        """Durable first (up to the last marked boundary), then tell the server."""
        state = self.writer.commit()
        if state is not None:
            src.ack(state.lsn)

    def run(self) -> int:
        log = self.log
        attempt = 0
        busy_since = None
        while True:
            connected_at = time.monotonic()
            try:
                self.session()
                return 0
            except CaptureDirError as e:
                log.event("error", "capture_dir", str(e))
                return 2
            except ResumeRefused as e:  # another server or slot: retrying cannot help
                log.end_progress()
                log.event("error", "resume_refused", str(e))
                return 2
            except CaptureError as e:
                if self.stop:
                    return 0
                transient = e.transient
                if e.sqlstate == "55006":  # slot busy: maybe our own walsender from before
                    busy_since = busy_since or time.monotonic()
                    transient = time.monotonic() - busy_since < SLOT_BUSY_PATIENCE
                if not transient:
                    log.end_progress()
                    log.event("error", "fatal", str(e), sqlstate=e.sqlstate)
                    return 2
                if not self.connected and attempt + 1 >= self.args.connect_attempts:
                    # never connected: a wrong host or port, a server that is not up; say so
                    # rather than retry forever (a connection that worked is retried forever)
                    log.end_progress()
                    log.event("error", "connect", f"{e} (gave up after {attempt + 1} "
                              "attempts; --connect-attempts sets how many)")  # fmt: skip
                    return 2
                if time.monotonic() - connected_at > 60:
                    attempt = 0  # it ran for a while: start the backoff over
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                log.event("warning", "reconnect", f"{e}; reconnecting in {delay:g}s",
                          attempt=attempt)  # fmt: skip
                deadline = time.monotonic() + delay
                while not self.stop and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self.stop:
                    return 0
            finally:
                self.writer.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        args.publication = [p.strip() for p in args.publication.split(",") if p.strip()]
        if not args.publication:
            raise OptionError("--publication needs at least one name")
        if args.temporary and not args.create_slot:
            raise OptionError("--temporary only makes sense with --create-slot")
        for name in ("status_interval", "flush_interval", "segment_seconds"):
            if getattr(args, name) <= 0:
                raise OptionError(f"--{name.replace('_', '-')} must be positive")
    except OptionError as e:
        print(f"{PROG}: error: {e} (see {PROG} --help)", file=sys.stderr)
        return 2
    log = Log(args.log_format)
    cap = Capture(args, log)

    def _stop(signum, frame):
        cap.stop = True

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = cap.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        log.end_progress()
    if code == 0:
        durable = cap.writer.state.lsn if cap.writer.state is not None else None
        log.event("info", "stopped", f"captured {cap.messages:,} messages "
                  f"({_human(cap.bytes)}) into {args.out}; "
                  + ("nothing is durable yet" if durable is None else
                     f"durable up to {format_lsn(durable)}"),
                  messages=cap.messages, bytes=cap.bytes,
                  durable_lsn=None if durable is None else format_lsn(durable))  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
