"""A durable, resumable capture of a replication slot into a capture directory: the loop
behind ``pgcdc capture``, usable from Python without a command line.

    from pgcdc.capture.runner import Capture, CaptureConfig
    cap = Capture(CaptureConfig(dsn=..., slot="s", publications=["pub"], out="cap",
                                idle_exit=5))
    code = cap.run()   # 0: stopped with everything received durable; 2: cannot go on

Dropped connections and server restarts are retried with backoff, resuming from the durable
position; a first connection that never worked is given up after ``connect_attempts``.
Set ``cap.stop = True`` (from a signal handler) to stop at the next boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import gc
import time
from dataclasses import dataclass

from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture import catchup
from pgcdc.capture.catalog import CatalogRecorder
from pgcdc.capture.checks import ResumeRefused, SlotInvalidated, SourceIdentity
from pgcdc.capture.heartbeat import Heartbeat
from pgcdc.capture.log import Log
from pgcdc.capture.logical import LogicalStream
from pgcdc.capture.metrics import PipelineMetrics, parse_address, serve
from pgcdc.capture.segments import CaptureDirError, SegmentWriter
from pgcdc.capture.sql import SqlSlotReader
from pgcdc.capture.walsender import CaptureError, mask_dsn

RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15, 30)
SLOT_BUSY = "55006"  # the slot is active in another process
SLOT_BUSY_PATIENCE = 30.0  # seconds: our own previous walsender may still hold the slot


@dataclass
class CaptureConfig:
    """What to capture and how; the fields are ``pgcdc capture``'s options."""

    dsn: str
    slot: str
    publications: list[str]
    out: str
    create_slot: bool = False
    temporary: bool = False
    two_phase: bool = False
    protocol_version: int | None = None
    binary: bool = False
    streaming: str = "off"
    messages: bool = False
    origin: str | None = None
    start_lsn: int | None = None
    until_lsn: int | None = None
    idle_exit: float | None = None
    connect_attempts: int = 3
    status_interval: float = 10.0
    flush_interval: float = 1.0
    # with data flowing, a commit (fsync) as soon as this many records came since the last
    # one, not only every flush_interval (sync: a backlog reaches its cycles sooner)
    commit_records: int | None = None
    segment_bytes: int = 64 << 20
    segment_seconds: float = 600.0
    sql: bool = False
    batch_size: int = 10_000
    retained_wal_warning: int = 1 << 30
    heartbeat: float | None = None  # seconds between heartbeats (pgcdc.capture.heartbeat)
    metrics: str | None = None  # HOST:PORT or PORT to serve metrics on (pgcdc.capture.metrics)
    failover: bool = False  # a failover slot (PostgreSQL 17+)
    fsync: bool = True  # off only in tests
    # a file holding the LSN the slot may be confirmed up to at most (sync: what its tables
    # hold), read at each status update; see LogicalStream's confirm_limit
    confirm_limit: str | None = None
    # a restart's backlog, up to this many bytes of WAL, read with one peek before the
    # walsender streams (pgcdc.capture.catchup); 0: the walsender reads it all
    catch_up_bytes: int = 128 << 20

    def __post_init__(self):
        if isinstance(self.publications, str):
            self.publications = self.publications.split(",")
        self.publications = [p.strip() for p in self.publications if p.strip()]

    def check(self) -> None:
        """ValueError for options that cannot work together."""
        if not self.publications:
            raise ValueError("--publication needs at least one name")
        if self.temporary and not self.create_slot:
            raise ValueError("--temporary only makes sense with --create-slot")
        for name in ("status_interval", "flush_interval", "segment_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.connect_attempts < 1:
            raise ValueError("--connect-attempts must be at least 1")
        if self.heartbeat is not None and self.heartbeat <= 0:
            raise ValueError("--heartbeat must be positive (seconds between heartbeats)")
        if self.failover and self.temporary:
            raise ValueError("--failover cannot be used with --temporary (a temporary slot is "
                             "never synchronized to a standby)")  # fmt: skip
        if self.confirm_limit is not None and self.sql:
            raise ValueError("a confirm limit needs the walsender (not --sql)")
        if self.metrics is not None:
            parse_address(self.metrics)


def human_bytes(n: float) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.5 MB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class Capture:
    """The capture loop: a source (walsender stream or SQL reader) into a SegmentWriter."""

    def __init__(self, config: CaptureConfig, log: Log | None = None):
        self.args = config
        self.log = log or Log("auto")
        self.stop = False
        self.writer = SegmentWriter(
            config.out,
            max_bytes=config.segment_bytes,
            max_seconds=config.segment_seconds,
            fsync=config.fsync,
        )
        self.writer.slot = config.slot
        self.source = None
        self.done = False
        self._slot_created = False
        self.connected = False  # a session got as far as streaming at least once
        self._peek_failed = False  # a catch-up peek failed: the walsender reads backlogs
        self.catalog: CatalogRecorder | None = None  # records catalog.jsonl (capture.catalog)
        self.messages = self.bytes = 0  # received over all sessions
        self.reconnects = 0
        # heartbeats (--heartbeat) on a connection of their own, written from the loop
        self.heartbeat: Heartbeat | None = None
        if config.heartbeat is not None:
            self.heartbeat = Heartbeat(
                config.dsn,
                config.heartbeat,
                on_error=lambda text: self.log.event("warning", "heartbeat", text),
            )
        self.metrics = None  # capture.metrics.PipelineMetrics, when --metrics serves them
        self.metrics_server = None

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
            failover=a.failover,
            start_lsn=start_lsn,
            # a directory with a durable position: checked against this server before use
            resume_of=None if state is None else str(a.out),
            recorded_source=None if state is None else SourceIdentity.from_json(state.source),
        )
        if a.sql:
            return SqlSlotReader(a.dsn, a.slot, a.publications, batch_size=a.batch_size, **kw)
        return LogicalStream(
            a.dsn,
            a.slot,
            a.publications,
            status_interval=a.status_interval,
            auto_idle_ack=False,
            confirm_limit=None if a.confirm_limit is None else lsn_file(a.confirm_limit),
            **kw,
        )

    def session(self) -> None:
        """One connection's worth: recover the directory, connect, stream until stopped."""
        a, writer = self.args, self.writer
        state = writer.recover()
        if state is not None and state.slot not in (None, a.slot):
            raise CaptureError(
                f"{a.out} holds a capture of slot {state.slot!r}, not {a.slot!r} "
                "(fix: use the same --slot, or a new --out directory)"
            )
        start = state.lsn if state is not None else (a.start_lsn or 0)
        src = self.source = self._make_source(start, state)
        ready = False

        def before_stream(src) -> int | None:
            nonlocal ready
            self._ready(src, start, state)
            ready = True
            return self._catch_up(src)

        if not a.sql:
            src.before_stream = before_stream
        src.open()
        self.connected = True  # streaming: from now on a lost connection is retried forever
        try:
            if not ready:
                self._ready(src, start, state)
            # what start-up allocated lives as long as the process: keep the collector, which
            # the per-message objects of the hot path set off, from walking it again and again
            gc.freeze()
            self._pump(src, src.options)
        finally:
            self.source = None
            self.messages += src.stats.messages
            self.bytes += src.stats.bytes
            if self.metrics is not None:
                self.metrics.up = 0
            src.close()

    def _renamed(self, lsn: int, doc: dict, pairs: list) -> None:
        table = f"{doc['namespace']}.{doc['name']}"
        said = ", ".join(f"{a} to {b}" for a, b in pairs)
        self.log.event(
            "warning", "column_renamed",
            f"{table}: the columns {said} look renamed (or dropped and others added in "
            f"their place) at {format_lsn(lsn)}: pgoutput sends names only, so in tables "
            "built from this capture (pgcdc apply, pgcdc sync) the rows not changed since "
            "hold null there until the table's snapshot is taken again (pgcdc sync takes "
            "it by itself, but with --scd 2; after pgcdc apply, apply a new snapshot of it)",
            table=table, lsn=format_lsn(lsn), columns=[list(p) for p in pairs],
        )  # fmt: skip

    def _ready(self, src, start: int, state) -> None:
        """The session's source is checked: the catalog recorder on its messages, the
        warnings logged, the directory's segment open."""
        a, log, writer = self.args, self.log, self.writer
        self._slot_created = self._slot_created or src.created_slot is not None
        if src.created_slot is not None and state is not None:  # temporary: made anew
            log.event("warning", "slot_created", "the temporary slot was created again: "
                      "changes since the last session are not captured",
                      slot=a.slot)  # fmt: skip
        if self.catalog is None:
            self.catalog = CatalogRecorder(a.dsn, a.out, fsync=a.fsync)
            self.catalog.on_renamed = self._renamed
        catalog, opts = self.catalog, src.options
        src.on_relation = lambda lsn, payload, in_stream: catalog.on_relation_payload(
            lsn, payload, in_stream, opts
        )
        src.on_change = lambda lsn, payload, in_stream: catalog.on_change_payload(
            lsn, payload, in_stream, opts
        )
        src.watching = lambda: catalog.watching
        for warning in src.warnings:
            log.event("warning", "source", warning)
        health = src.health
        if health is not None and (
            health.wal_status == "unreserved"
            or (health.safe_wal_size is not None and health.safe_wal_size < a.retained_wal_warning)
        ):
            log.event("warning", "safe_wal_size", f"slot {a.slot} is "
                      f"{human_bytes(max(0, health.safe_wal_size or 0))} from being invalidated "
                      f"(safe_wal_size; wal_status {health.wal_status}): keep the capture "
                      "running, or raise max_slot_wal_keep_size", slot=a.slot)  # fmt: skip
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

    def _catch_up(self, src) -> int | None:
        """Read the backlog with one peek before the walsender streams
        (:mod:`pgcdc.capture.catchup`); the LSN to stream from, or None."""
        import psycopg

        span = None if self._peek_failed else catchup.catch_up_range(src, self.args.catch_up_bytes)
        if span is None:
            return None
        writer = self.writer
        durable = writer.state
        t0 = time.monotonic()
        try:
            got = catchup.peek_backlog(src, writer, *span, commit_every=self.args.commit_records,
                                       on_commit=lambda: self._commit(src))  # fmt: skip
            self.messages += got.messages
            self.bytes += got.bytes
        except psycopg.Error as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if e.sqlstate == SLOT_BUSY:
                # the slot is busy (a killed run's walsender may hold it a while): the session
                # is tried again, as when the walsender's own start finds it busy
                raise CaptureError(text, sqlstate=e.sqlstate, transient=True) from None
            self._peek_failed = True  # the walsender reads the backlog from now on
            if writer.pending or writer.state is not durable:
                raise CaptureError(f"catching up by a peek failed: {text}", transient=True)
            self.log.event("info", "catch_up", f"the walsender reads the backlog (a peek "
                           f"failed: {text})")  # fmt: skip
            return None
        self.log.event("info", "catch_up", f"read {got.messages:,} messages of the backlog "
                       f"with a peek in {time.monotonic() - t0:.2f}s",
                       lsn=format_lsn(got.end))  # fmt: skip
        return got.end

    def _pump(self, src, opts) -> None:
        a, log, writer = self.args, self.log, self.writer
        buf = writer.buf  # the source appends records here; the writer hands them to the OS
        read_records = src.read_records
        batch_bytes = writer.buffer_bytes
        flush_every = a.flush_interval
        commit_records = a.commit_records or float("inf")
        since = 0  # records read since the last commit
        # how long a read waits for data: the last transaction before a quiet moment is made
        # durable this long after it came (the idle branch), not a fixed half second later
        quiet = min(0.5, max(0.02, flush_every / 5))
        until = a.until_lsn
        now = time.monotonic()
        next_flush = now + flush_every
        next_report = now + (1.0 if log.tty else 10.0)
        last_data = now
        last_msgs, last_bytes, last_t = 0, 0, now
        warned_wal = False
        next_idle_commit = now
        hb = self.heartbeat
        m = self.metrics
        if m is not None:
            m.up = 1
        if until is not None and writer.state is not None and writer.state.lsn >= until:
            # durable that far already (a restart, or a catch-up peek): new WAL may be long
            log.event("info", "until_lsn", "reached --until-lsn", lsn=format_lsn(writer.state.lsn))
            self.done = True
            return
        while not self.stop:
            count, end, ack = read_records(buf, quiet, batch_bytes, until)
            now = time.monotonic()
            if hb is not None:
                hb.maybe_beat(now)
            if m is not None:
                self._update_metrics(m, src, count)
            if end >= 0:
                writer.mark(end, ack)
                last_data = now
                if until is not None and ack >= until:
                    self._commit(src)
                    log.event("info", "until_lsn", "reached --until-lsn", lsn=format_lsn(ack))
                    self.done = True
                    return
            if count:
                since += count
                if writer.marked and (now >= next_flush or since >= commit_records):
                    self._commit(src)
                    next_flush, since = now + flush_every, 0
                writer.maybe_write_out()
            else:  # idle
                if writer.marked:
                    self._commit(src)
                    next_flush, since = now + flush_every, 0
                writer.write_out()  # let readers see what is mid-transaction too
                idle = src.idle_lsn
                # the server's WAL end while nothing is open (from its keepalives, past the
                # heartbeats and other databases' WAL): durable and confirmed, so that an idle
                # slot holds back no WAL; at most once per --flush-interval (an fsync each)
                due = now >= next_idle_commit or (until is not None and idle is not None
                                                  and idle >= until)  # fmt: skip
                if idle is not None and not writer.pending and due:
                    self.writer.commit_position(idle)
                    src.ack(idle)
                    next_idle_commit = now + flush_every
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
                        f"{rate:,.0f} msgs/s  {human_bytes(brate)}/s  lag {human_bytes(lag)}"
                    )
                else:
                    log.event("info", "progress", "", lsn=format_lsn(st.received_lsn),
                              durable_lsn=format_lsn(durable), messages=st.messages,
                              msgs_per_s=round(rate), bytes_per_s=round(brate),
                              lag_bytes=lag)  # fmt: skip
                if held > a.retained_wal_warning and not warned_wal:
                    log.event("warning", "retained_wal", f"the slot holds back {human_bytes(held)} of "
                              "WAL not yet acknowledged", slot=a.slot,
                              flushed_lsn=format_lsn(src.flushed_lsn))  # fmt: skip
                    warned_wal = True
                elif held < a.retained_wal_warning // 2:
                    warned_wal = False
                next_report = now + (1.0 if log.tty else 10.0)
        if writer.marked:
            self._commit(src)
        idle = src.idle_lsn
        if idle is not None and not writer.pending:
            # stopping while idle: the server's WAL end is durable and confirmed (close()
            # sends a last status), not only the last transaction's end; a restart's
            # walsender then decodes from past a checkpoint's running-transactions record
            # logged after it rather than from before the last burst
            writer.commit_position(idle)
            src.ack(idle)

    def _update_metrics(self, m, src, count: int) -> None:
        """The metrics from what the loop holds (once per batch of records, not per message)."""
        st = src.stats
        m.messages = self.messages + st.messages
        m.bytes = self.bytes + st.bytes
        if count:
            m.last_message_time = time.time()
        m.received_lsn = st.received_lsn
        m.server_wal_lsn = st.server_wal_end
        m.confirmed_lsn = src.flushed_lsn
        durable = self.writer.state.lsn if self.writer.state is not None else 0
        m.durable_lsn = durable
        m.lag_bytes = max(0, st.server_wal_end - durable) if durable else 0
        m.reconnects = self.reconnects
        if self.heartbeat is not None:
            m.heartbeats = self.heartbeat.sent
            m.heartbeat_failures = self.heartbeat.failed

    def start_metrics(self) -> None:
        """Serve the metrics at ``config.metrics`` (OSError when the address is taken)."""
        self.metrics = PipelineMetrics("capture", self.args.slot)
        self.metrics_server = serve(self.metrics, self.args.metrics)

    def _commit(self, src) -> None:
        """Durable first (up to the last marked boundary), then tell the server. The catalog
        lines the data needs are durable before it (reg* names are asked for here)."""
        if self.catalog is not None:
            self.catalog.flush()
        state = self.writer.commit()
        if state is not None:
            src.ack(state.lsn)

    def run(self) -> int:
        """Capture until stopped; the exit code (0, or 2: cannot go on). Serves the metrics
        meanwhile when the config asks for them."""
        if self.args.metrics is not None and self.metrics_server is None:
            try:
                self.start_metrics()
            except (OSError, ModuleNotFoundError) as e:
                self.log.event("error", "metrics", f"cannot serve metrics at {self.args.metrics}: "
                               f"{e}")  # fmt: skip
                return 2
            host, port = self.metrics_server.address
            self.log.event("info", "metrics", f"metrics at http://{host}:{port}/metrics")
        try:
            return self._run()
        finally:
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None

    def _run(self) -> int:
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
            except SlotInvalidated as e:  # the server dropped the slot's WAL: a re-snapshot
                log.end_progress()
                log.event("error", "slot_invalidated", str(e), slot=self.args.slot,
                          reason=e.health.reason, wal_status=e.health.wal_status)  # fmt: skip
                return 2
            except ResumeRefused as e:  # another server or slot: retrying cannot help
                log.end_progress()
                log.event("error", "resume_refused", str(e))
                return 2
            except CaptureError as e:
                if self.stop:
                    return 0
                transient = e.transient
                busy = e.sqlstate == SLOT_BUSY  # connected, the slot held: SLOT_BUSY_PATIENCE
                if busy:  # maybe our own walsender from before
                    busy_since = busy_since or time.monotonic()
                    transient = time.monotonic() - busy_since < SLOT_BUSY_PATIENCE
                if not transient:
                    log.end_progress()
                    log.event("error", "fatal", str(e), sqlstate=e.sqlstate)
                    return 2
                if not self.connected and not busy and attempt + 1 >= self.args.connect_attempts:
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
                if self.connected:
                    self.reconnects += 1
                log.event("warning", "reconnect", f"{e}; reconnecting in {delay:g}s",
                          attempt=attempt)  # fmt: skip
                deadline = time.monotonic() + delay
                while not self.stop and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self.stop:
                    return 0
            finally:
                self.writer.close()
                if self.catalog is not None:
                    self.catalog.close()
                if self.heartbeat is not None:
                    self.heartbeat.close()  # reopened by the next beat

    def summary(self) -> str:
        """One line: what this capture received and how far it is durable."""
        durable = self.writer.state.lsn if self.writer.state is not None else None
        return (
            f"captured {self.messages:,} messages ({human_bytes(self.bytes)}) into {self.args.out}; "
            + (
                "nothing is durable yet"
                if durable is None
                else f"durable up to {format_lsn(durable)}"
            )
        )


def lsn_file(path) -> Callable[[], int | None]:
    """A function reading the LSN in ``path`` (text, as PostgreSQL prints it); None when
    the file is missing or unreadable."""

    def read() -> int | None:
        try:
            with open(path) as fh:
                return parse_lsn(fh.read().strip())
        except (OSError, ValueError):
            return None

    return read
