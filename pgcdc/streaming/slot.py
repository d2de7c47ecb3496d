"""A Structured Streaming source that reads a replication slot: ``format("pgcdc")``.

::

    from pgcdc.streaming.slot import PgcdcDataSource
    spark.dataSource.register(PgcdcDataSource)
    events = (spark.readStream.format("pgcdc")
              .option("dsn", "host=... dbname=app user=cdc")
              .option("slot", "cdc").option("publication", "app_pub")
              .load())
    events.writeStream.format("parquet").option("checkpointLocation", "chk/")
          .start("events/")

One row per change event (schema :func:`event_schema`, single stream for every table): ``op``
(c u d t, m with ``messages``), ``schema``, ``table``, ``before_json``/``after_json``
(the row as PostgreSQL's ``to_jsonb`` renders it, see :mod:`pgcdc.values`; ``before`` holds
the key only unless REPLICA IDENTITY FULL), ``unchanged`` (unchanged TOAST columns left out
of ``after_json``), ``detail_json`` (truncate options, logical message), ``lsn``,
``commit_lsn``, ``tx_ordinal``, ``commit_time``, ``xid``, ``errors`` (lenient mode).
``(commit_lsn, tx_ordinal)`` orders events (see :mod:`pgcdc.events.reader`).

Offsets are LSNs, ``{"lsn": "16/B374D848"}``. A batch ``(start, end]`` holds the transactions
whose commit record starts in ``[start, end)`` (a non-transactional message: the one whose
record does; its LSN is where the record ends, in ``(start, end]``), which is what
PostgreSQL's decoding gives for ``end``: a peek up to ``end`` stops after the first WAL
record ending at or past it (``pg_logical_slot_get_changes_guts``), and
a slot advanced to ``start`` skips the transactions whose commit record starts before it
(``SnapBuildXactNeedsSkip``). The WAL does not change, so the same offsets give the same
transactions every time they are read. ``initialOffset`` is the slot's
``confirmed_flush_lsn``. ``latestOffset`` does not decode anything: it is
``pg_current_wal_flush_lsn()`` (with ``AvailableNow``: the position when the query
started); when the slot's restart_lsn trails it by 1 MiB or more, it first logs a standby
snapshot, so that the batch's commit can move restart_lsn on
(:meth:`PgcdcStreamReader._restart_point`). Only with ``maxEventsPerTrigger`` does it peek
the slot (each message's LSN and tag, the payloads stay on the server) to cut the batch at
the last commit within that many messages, or at the flush position when they all fit. With
``messages`` a flush position on a WAL page boundary is no end either: the WAL writer flushes
whole pages, and a non-transactional message whose record straddles the boundary would be
in neither batch (:meth:`PgcdcStreamReader._maybe_inside_record`); a peek finds the last
record end before it.

``read`` runs in one Spark task per micro-batch (a slot is one ordered stream: splitting a
batch would decode its start again in every task). It streams the slot over the replication
protocol (``START_REPLICATION`` from ``start``, :class:`pgcdc.capture.logical.LogicalStream`):
the server skips what commits before ``start`` and sends each transaction as it decodes it,
so its decoding and this process's typing run at the same time; the stream ends at the first
transaction committing at or past ``end``, or when a keepalive (asked for when the stream is
quiet) says the server has decoded past ``end``. The only position it reports to the server
is ``start``, where Spark's checkpoint already is. In a running query (any trigger but
``AvailableNow``) the task then holds the stream in its Python worker for the next batch,
reading on while Spark commits and plans (:mod:`pgcdc.streaming.held`): the next batch's
task, when it starts where this one ended, takes it rather than opening one that decodes
from ``restart_lsn`` again. ``transport=peek`` reads
``pg_logical_slot_peek_binary_changes(slot, end, NULL, ...)`` instead (the server decodes the
whole batch before the first row comes). The records are read in chunks by
:class:`pgcdc.events.reader.EventReader` and the rows built a column at a time
(:func:`events_batch`).

``commit(end)`` advances the slot (``pg_replication_slot_advance``) only after Spark has
committed the batch to its checkpoint (with ``Trigger.AvailableNow``, ``latestOffset(start)``
does too: ``start`` is committed by then, and the run ends with the slot at its last batch's
end; a slot a held stream holds is left to that stream, which confirms the next batch's
start), so the slot never gets ahead of the checkpoint: a query killed at any moment restarts
from its checkpoint, re-runs the batch it had planned with the same offsets, and with an
idempotent sink (Parquet/Delta file sinks with a checkpoint) every change lands exactly once.

Options: ``dsn``, ``slot``, ``publication`` (comma-separated), ``protocol_version`` (default:
the server's highest), ``binary`` (false), ``messages`` (false), ``lenient`` (false),
``maxEventsPerTrigger`` (messages per micro-batch, at least one transaction),
``idleAdvanceBytes`` (16 MiB: with ``maxEventsPerTrigger``, or a running query's held stream
that says the WAL holds nothing published, how much such WAL moves the offset on),
``transport`` (``walsender``, or ``peek``), ``table`` (one table's events with typed columns
rather than JSON text: :mod:`pgcdc.streaming.typed`),
``holdSeconds`` (10: how long a running query's task holds its stream for the next batch; 0:
a stream per batch). The slot must exist
(``pgcdc snapshot`` or ``pgcdc capture --create-slot`` make one); transactions are read whole
(streaming off).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from operator import itemgetter

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pgcdc.errors import SetupError
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.streaming.held import QUIET_FRESH, quiet_reports, quiet_tag

__all__ = ["EVENT_COLUMNS", "event_schema", "PgcdcDataSource", "PgcdcStreamReader", "SourceError"]

EVENT_COLUMNS = (
    ("op", "string"),
    ("schema", "string"),
    ("table", "string"),
    ("before_json", "string"),
    ("after_json", "string"),
    ("unchanged", "array<string>"),
    ("detail_json", "string"),
    ("lsn", "long"),
    ("commit_lsn", "long"),
    ("tx_ordinal", "long"),
    ("commit_time", "timestamp"),
    ("xid", "long"),
    ("errors", "array<string>"),
)


def event_schema():
    """The source's Spark schema (a StructType of :data:`EVENT_COLUMNS`)."""
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "long": T.LongType(), "timestamp": T.TimestampType()}
    fields = [
        T.StructField(
            name,
            T.ArrayType(T.StringType(), True) if kind == "array<string>" else simple[kind],
            True,
        )
        for name, kind in EVENT_COLUMNS
    ]
    return T.StructType(fields)


# pgoutput tags: where transactions begin and end, and a logical message
_COMMIT, _PREPARE, _COMMIT_PREPARED, _ROLLBACK_PREPARED = ord("C"), ord("P"), ord("K"), ord("r")
_BEGIN, _BEGIN_PREPARE, _MESSAGE = ord("B"), ord("b"), ord("M")
_IDLE_ADVANCE_BYTES = 16 << 20
# how far the slot's restart_lsn may trail the WAL when a batch is planned before a standby
# snapshot is logged (each batch's walsender decodes again from restart_lsn; _restart_point)
_RESTART_LAG_BYTES = 1 << 20


class SourceError(SetupError, RuntimeError):
    """A slot that cannot be read, with the slot and what to do."""


_SLOT_BUSY = "55006"  # the slot is in use by another process
HOLD_SECONDS = 10.0  # option holdSeconds: how long a task holds its stream for the next batch
SLOT_BUSY_PATIENCE = 60.0  # seconds: a killed query's backend may hold the slot a moment


def _wait_if_busy(e, deadline: float, slot: str, what: str) -> None:
    """After peek ``what`` failed with ``e``: wait a moment and return while the slot is busy
    (a killed run's backend may still hold it until the server notices the closed
    connection) and ``deadline`` (``time.monotonic()``) is ahead; else raise SourceError."""
    import time

    if getattr(e, "sqlstate", None) == _SLOT_BUSY and time.monotonic() < deadline:
        time.sleep(0.5)
        return
    raise SourceError(f"slot {slot!r}: {what}: {str(e).strip()}") from None


def _execute_peek(conn, query: str, params, slot: str, what: str):
    """Run a peek, waiting while the slot is busy (:func:`_wait_if_busy`)."""
    import time

    import psycopg

    deadline = time.monotonic() + SLOT_BUSY_PATIENCE
    while True:
        try:
            return conn.execute(query, params)
        except psycopg.Error as e:
            _wait_if_busy(e, deadline, slot, what)
            if not conn.autocommit:
                conn.rollback()


def _quiet_tag(opts: dict, protocol_version: int) -> str:
    """The :func:`~.held_stream.quiet_tag` of the stream these options read: one place, so
    the driver and the tasks that report to it name the same stream."""
    return quiet_tag(opts["slot"], opts["publications"], protocol_version, opts["binary"],
                     opts["messages"])  # fmt: skip


class PgcdcDataSource(DataSource):
    """The ``pgcdc`` data source: a streaming reader of a logical replication slot."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def schema(self):
        opts = _options(dict(self.options))
        if opts["table"]:
            from pgcdc.streaming.typed import spark_schema

            return spark_schema(_describe(opts))
        return event_schema()

    def streamReader(self, schema) -> DataSourceStreamReader:
        reader = PgcdcStreamReader(dict(self.options))
        if reader.opts["table"]:
            from pgcdc.streaming.typed import spark_schema

            doc = reader.opts["table_doc"] = _describe(reader.opts)
            if spark_schema(doc) != schema:
                raise SourceError(
                    f"table {reader.opts['table']!r} changed while the query started "
                    "(fix: start the query again)"
                )
        return reader


def _describe(opts: dict) -> dict:
    """The option ``table``'s table as the server publishes it now."""
    import psycopg

    from pgcdc.snapshot.server import SnapshotError
    from pgcdc.streaming.typed import TableNotPublished, describe_table

    try:
        return describe_table(opts["dsn"], opts["publications"], opts["table"])
    except (TableNotPublished, SnapshotError) as e:
        raise SourceError(str(e)) from None
    except psycopg.Error as e:
        raise SourceError(
            f"cannot read the columns of {opts['table']!r}: {str(e).strip()}"
        ) from None


class _Batch(InputPartition):
    """One micro-batch: the transactions committing in (start, end]. ``keep``: its task
    holds its stream for the next batch (:mod:`pgcdc.streaming.held`)."""

    keep = False

    def __init__(self, start: int, end: int, keep: bool = False):
        super().__init__((start, end))
        self.start, self.end, self.keep = start, end, keep


def _options(given: dict) -> dict:
    # Spark hands options over case-insensitively (as lower-case keys)
    opts = {str(k).lower(): v for k, v in given.items()}
    missing = [k for k in ("dsn", "slot", "publication") if not opts.get(k)]
    if missing:
        raise SourceError(f"format('pgcdc') needs the option(s) {', '.join(missing)}")

    def flag(name: str) -> bool:
        value = str(opts.get(name, "false")).lower()
        if value not in ("true", "false"):
            raise SourceError(f"option {name} must be true or false, got {value!r}")
        return value == "true"

    max_events = opts.get("maxeventspertrigger")
    transport = str(opts.get("transport", "walsender")).lower()
    if transport not in ("walsender", "peek"):
        raise SourceError(f"option transport must be walsender or peek, got {transport!r}")
    return {
        "dsn": opts["dsn"],
        "slot": opts["slot"],
        "publications": tuple(p.strip() for p in opts["publication"].split(",") if p.strip()),
        "protocol_version": int(opts["protocol_version"]) if opts.get("protocol_version") else None,
        "binary": flag("binary"),
        "messages": flag("messages"),
        "lenient": flag("lenient"),
        "max_events": int(max_events) if max_events else None,
        "idle_advance": int(opts.get("idleadvancebytes", _IDLE_ADVANCE_BYTES)),
        "transport": transport,
        "table": opts.get("table") or None,
        "hold_seconds": float(opts.get("holdseconds", HOLD_SECONDS)),
    }


class PgcdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, planning and slot advances run on the driver; :meth:`read` in a task."""

    def __init__(self, options: dict):
        self.opts = _options(options)
        self._conn = None
        self._target: int | None = None  # Trigger.AvailableNow: read no further than this
        self._log_snapshots = True  # until the server refuses pg_log_standby_snapshot()
        self._block_size: int | None = None  # the server's WAL page size
        self.plugin_options = self._plugin_options()
        self._quiet_tag = _quiet_tag(self.opts, int(dict(self.plugin_options)["proto_version"]))

    def __getstate__(self):  # pickled to the tasks: without the driver's connection
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # -- driver side --------------------------------------------------------------------------

    def _connection(self):
        import psycopg

        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(
                    self.opts["dsn"], autocommit=True, application_name="pgcdc stream"
                )
            except psycopg.Error as e:
                raise SourceError(f"cannot connect: {str(e).strip()}") from None
        return self._conn

    def _plugin_options(self) -> list[tuple[str, str]]:
        from pgcdc.capture.options import PluginOptions, max_protocol_version

        major = self._connection().info.server_version // 10000
        pv = self.opts["protocol_version"] or max_protocol_version(major)
        plugin = PluginOptions(
            self.opts["publications"], pv, binary=self.opts["binary"],
            messages=self.opts["messages"],
        )  # fmt: skip
        try:
            plugin.check(major)
        except ValueError as e:
            raise SourceError(str(e)) from None
        return plugin.as_list()

    def _confirmed(self) -> int:
        row = (
            self._connection()
            .execute(
                "SELECT confirmed_flush_lsn::text, plugin::text FROM pg_replication_slots"
                " WHERE slot_name = %s",
                [self.opts["slot"]],
            )
            .fetchone()
        )
        if row is None:
            raise SourceError(
                f"replication slot {self.opts['slot']!r} does not exist (fix: create it with "
                "pgcdc snapshot or pgcdc capture --create-slot, or check the slot option)"
            )
        if row[1] != "pgoutput":
            raise SourceError(f"slot {self.opts['slot']!r} uses plugin {row[1]}, not pgoutput")
        return parse_lsn(row[0])

    def initialOffset(self) -> dict:
        return {"lsn": format_lsn(self._confirmed())}

    def prepareForTriggerAvailableNow(self) -> None:
        confirmed = self._confirmed()
        target = self._flush_lsn(confirmed)
        if target > confirmed and self._maybe_inside_record(target):
            target = self._last_boundary(confirmed, target, None)
        self._target = target

    def _flush_lsn(self, begin: int | None = None) -> int:
        """The server's WAL flush position; with ``begin`` (the next batch's start), first a
        restart point for the slot when it needs one (:meth:`_restart_point`)."""
        flush, restart = self._positions()
        return flush if begin is None else self._after_restart_point(begin, flush, restart)

    def _positions(self) -> tuple[int, int | None]:
        """The server's WAL flush position and the slot's restart_lsn (None: not yet)."""
        row = (
            self._connection()
            .execute(
                "SELECT pg_current_wal_flush_lsn()::text, (SELECT restart_lsn::text FROM"
                " pg_replication_slots WHERE slot_name = %s)",
                [self.opts["slot"]],
            )
            .fetchone()
        )
        return parse_lsn(row[0]), parse_lsn(row[1]) if row[1] else None

    def _after_restart_point(self, begin: int, flush: int, restart: int | None) -> int:
        """``flush``, or after a restart point when the slot needs one: the flush then."""
        # what the batch after this one would decode again, unless restart_lsn moves
        if restart is not None and flush > begin:
            if flush - restart >= _RESTART_LAG_BYTES and self._restart_point():
                return self._positions()[0]
        return flush

    def _quiet(self, begin: int, upto: int) -> bool:
        """Whether a held stream (:mod:`.held_stream`) says that nothing of the slot's
        publication commits in ``(begin, upto]``, or said so a moment ago at ``begin`` (then
        what came since would have taken it back), while less than ``idleAdvanceBytes`` of
        WAL lies between: then no batch yet, as with ``maxEventsPerTrigger``'s peek."""
        if upto - begin >= self.opts["idle_advance"]:
            return False
        for p, w, age in quiet_reports(self._connection(), self._quiet_tag):
            if p <= begin and (w >= upto or (p == begin and age < QUIET_FRESH)):
                return True
        return False

    def _restart_point(self) -> bool:
        """Log a standby snapshot (``pg_log_standby_snapshot()``, PostgreSQL 16+), so that
        the slot's restart_lsn can move up to this batch once it is committed.

        Every batch opens a walsender of its own, which decodes the WAL again from the slot's
        restart_lsn (what it skips is decoded too, only not sent). restart_lsn moves only to a
        running-transactions record that decoding passed before a confirmed position, and the
        server logs one every 15 s of activity (or at a checkpoint): in a burst or a steady
        flow, batch after batch decoded up to that much again. Logged here, before the batch's
        end is read, the record falls inside the batch, and ``commit`` (the slot advanced past
        it) moves restart_lsn to about where the next batch starts (to the record before, when
        a transaction was open across this one: it pins the restart point). The function needs a
        superuser or ``GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO ...``; without
        it (or before PostgreSQL 16, or on a standby) nothing changes but the decoding again.
        """
        import psycopg

        if not self._log_snapshots:
            return False
        try:
            self._connection().execute("SELECT pg_log_standby_snapshot()")
        except psycopg.Error:
            self._log_snapshots = False  # refused, or no such function: once is enough
            return False
        return True

    def _commit_planned_from(self, start: dict) -> None:
        """With ``Trigger.AvailableNow``: the slot advanced to ``start``, which Spark has
        committed already.

        Spark calls ``commit(end)`` only when it plans the batch after the one ending at
        ``end``, so the last batch of a run is committed back to the slot by the next run,
        and a scheduled job's slot holds one interval of WAL between its runs (and counts it
        against ``max_slot_wal_keep_size``). Under AvailableNow a query runs one batch at a
        time, synchronously: ``latestOffset(start)`` is asked for only once the batch ending
        at ``start`` is in the checkpoint's commit log (a planned batch that a crash left
        uncommitted is run again without asking), or with the initial offset, which the slot
        holds already. Asynchronous progress tracking, whose commit log may trail its
        planning, refuses AvailableNow. Other triggers wait for ``commit``."""
        self.commit(start)

    def getDefaultReadLimit(self):
        if self.opts["max_events"]:
            return ReadMaxRows(self.opts["max_events"])
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit=None) -> dict:
        begin = parse_lsn(start["lsn"])
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._target is not None:
            self._commit_planned_from(start)
            upto = self._target
        else:
            flush, restart = self._positions()
            if flush <= begin or (self._holds() and self._quiet(begin, flush)):
                return start  # nothing to read (the WAL moved for other tables): no batch yet
            upto = self._after_restart_point(begin, flush, restart)
        if upto <= begin:
            return start
        if max_rows is None and not self._maybe_inside_record(upto):
            # no peek: a peek (or a stream) up to `upto` gives exactly the transactions whose
            # commit record starts before it, every time it is asked (see the docstring)
            return {"lsn": format_lsn(upto)}
        return {"lsn": format_lsn(self._last_boundary(begin, upto, max_rows))}

    def _maybe_inside_record(self, lsn: int) -> bool:
        """Whether ``lsn``, a flush position, may lie inside a WAL record that a
        non-transactional message of this slot's output started before it.

        The server flushes up to the end of a record, except the WAL writer and a full WAL
        buffer, which flush whole pages: a page boundary may fall inside a record. A
        transaction is the batch's whose commit record starts before the end, which holds
        there too. But a message straddling it would be lost: its LSN is where its record
        ends, so it is not this batch's, and the next batch's decoding, started at the end,
        skips a record that starts before it. Only with ``messages`` (pgoutput sends none
        otherwise)."""
        return self.opts["messages"] and lsn % self._wal_block_size() == 0

    def _wal_block_size(self) -> int:
        if self._block_size is None:
            row = self._connection().execute("SELECT current_setting('wal_block_size')::int")
            self._block_size = row.fetchone()[0]
        return self._block_size

    def _last_boundary(self, begin: int, upto: int, max_rows: int | None) -> int:
        """Where a batch starting at ``begin`` ends: ``upto`` when the slot's output after
        ``begin`` up to there holds at most ``max_rows`` messages (any number when None),
        else the end of the last commit within them (at least one transaction); ``begin``
        when there is nothing to read and less than ``idleAdvanceBytes`` of WAL to skip.

        When ``upto`` may lie inside a record (:meth:`_maybe_inside_record`), it is not an
        end: the last record end the peek saw is (a commit's, a non-transactional
        message's: the one straddling ``upto`` too, which a peek reads whole, waiting for the
        server to flush the rest of it), or ``begin`` when it saw none."""
        from pgcdc.streaming.held import end_holder

        end_holder(self._connection(), self.opts["slot"])  # a peek needs the slot free
        args = "".join(", %s, %s" for _ in self.plugin_options)
        params = [self.opts["slot"], format_lsn(upto)]
        params += [x for kv in self.plugin_options for x in kv]
        cur = _execute_peek(
            self._connection(),
            "SELECT (lsn - '0/0'::pg_lsn)::int8, get_byte(data, 0) FROM"
            f" pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL{args})",
            params,
            self.opts["slot"],
            f"peek up to {format_lsn(upto)}",
        )
        if max_rows is None:
            max_rows = float("inf")
        best, seen, pending, prepared, after = begin, 0, 0, 0, 0
        in_txn, record_end = False, begin  # the last record end seen after begin
        for lsn, tag in cur:
            pending += 1
            after += lsn > begin
            boundary = False
            if tag in (_BEGIN, _BEGIN_PREPARE):
                in_txn = True
            elif tag == _COMMIT:
                boundary, in_txn = True, False
            elif tag == _PREPARE:  # held by the reader until COMMIT/ROLLBACK PREPARED
                prepared, in_txn = prepared + 1, False
            elif tag in (_COMMIT_PREPARED, _ROLLBACK_PREPARED):
                prepared, boundary = max(0, prepared - 1), True
            elif tag == _MESSAGE and not in_txn and not prepared and lsn > begin:
                record_end = lsn
            # a non-transactional message is no boundary: it goes with what follows it
            if not boundary or prepared:
                continue
            if lsn > begin:
                if best > begin and seen + pending > max_rows:
                    return best
                seen += pending
                best = record_end = lsn
            pending = 0
        inside = self._maybe_inside_record(upto)
        if after == 0 and (inside or upto - begin < self.opts["idle_advance"]):
            return begin  # nothing to read: no empty batch for a little WAL
        if prepared or (best > begin and seen + pending > max_rows):
            return best
        return record_end if inside else upto

    def _holds(self) -> bool:
        """Whether a batch's task holds its stream for the next batch: a running query's.
        Not AvailableNow's (its last batch has no next), nor with maxEventsPerTrigger (each
        batch's end is found by a peek, which needs the slot free: the held stream would be
        ended every batch), nor with holdSeconds 0 or the peek transport."""
        return (
            self._target is None
            and self.opts["hold_seconds"] > 0
            and not self.opts["max_events"]
            and self.opts["transport"] == "walsender"
        )

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        return [_Batch(lo, hi, keep=self._holds())] if hi > lo else []

    def commit(self, end: dict) -> None:
        """Spark has committed every batch up to ``end``: the slot may forget them."""
        from pgcdc.streaming.held import end_holder, holder

        lsn = parse_lsn(end["lsn"])
        if lsn <= self._confirmed():
            return
        pid = holder(self._connection(), self.opts["slot"])
        if pid is not None:
            if self._target is None:
                return  # the next batch's task confirms it on the stream it takes
            end_holder(self._connection(), self.opts["slot"], pid=pid)  # another query's, idle
        _execute_peek(
            self._connection(),
            "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
            [self.opts["slot"], format_lsn(lsn)],
            self.opts["slot"],
            f"advance to {format_lsn(lsn)}",
        )

    def stop(self) -> None:
        """The query stops: a stream a task holds for its next batch is ended (the slot is
        free for whoever comes next at once, rather than when the stream times out). Spark
        stops this process soon after: the end is not waited for."""
        from pgcdc.streaming.held import end_holder

        if self._target is None:
            try:
                end_holder(self._connection(), self.opts["slot"], wait=False)
            except Exception:  # noqa: BLE001 - the server away: the stream ends on its own
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- task side ----------------------------------------------------------------------------

    def read(self, partition: _Batch) -> Iterator:
        yield from read_batch(
            self.opts, self.plugin_options, partition.start, partition.end, batch_rows=10_000,
            keep=partition.keep,
        )  # fmt: skip


def read_batch(opts: dict, plugin_options, start: int, end: int, *, batch_rows: int = 10_000,
               keep: bool = False):  # fmt: skip
    """Arrow batches of the events whose transaction's commit record starts in
    [start, end), read from the slot without consuming (see the module docstring).
    ``keep``: the stream is held for a batch starting at ``end``."""
    from pgcdc.events.gcpause import paused

    with paused():  # a fifth of the read was the cycle collector walking new events
        yield from _read_batch(opts, plugin_options, start, end, batch_rows, keep)


def _read_batch(opts: dict, plugin_options, start: int, end: int, batch_rows: int,
                keep: bool = False):  # fmt: skip
    from pgcdc.events.reader import (
        RawRun,
    )  # here: the driver's offsets do not need it (0.05 s a query)

    typed = None
    if opts.get("table_doc"):
        from pgcdc.streaming.typed import TypedBatches

        typed = TypedBatches(opts["table_doc"])
    # runs of changes are taken raw: typed by Arrow from their text, or rendered as JSON
    if opts.get("transport", "walsender") == "walsender":
        parts = _streamed_parts(opts, plugin_options, start, end, raw_runs=True, keep=keep)
    else:
        parts = _peeked_parts(opts, plugin_options, start, end, raw_runs=True)
    if typed is None:
        from pgcdc.streaming import json_runs

        make, mine, run_batch = events_batch, None, partial(json_runs.run_batch,
                                                           schema=_arrow_schema())  # fmt: skip
    else:
        make, mine, run_batch = typed.batch, typed.mine, typed.run_batch
    out = _Batches(make, batch_rows)
    for part in parts:
        if type(part) is RawRun:
            if part.txn[0] < start or (typed is not None and not typed.mine_run(part)):
                continue
            made = run_batch(part) if part.m >= _RAW_RUN_ROWS else None
            if made is not None:
                yield from out.add_batch(made)
                continue
            part = part.events()  # a value for the exact path: loaded, as events
        # a transaction whose commit record starts before `start` (a non-transactional
        # message that ends at or before it) was in an earlier batch; its Relation messages
        # were still fed to the reader
        if part[0].commit_lsn <= start or part[-1].commit_lsn <= start:
            part = [ev for ev in part if not _before(ev, start)]
            if not part:
                continue
        if mine is not None:
            part = mine(part)
        yield from out.add_events(part)
    yield from out.finish()


_RAW_RUN_ROWS = 64  # a shorter raw run is loaded as events: a batch of its own costs more


class _Batches:
    """RecordBatches of ``batch_rows`` rows (the last one fewer) in stream order, from lists
    of events (made a batch by ``make``) and batches made already (raw runs)."""

    def __init__(self, make, batch_rows: int):
        self.make, self.batch_rows = make, batch_rows
        self.rows: list = []  # events not made yet, after every batch in `made`
        self.made: list = []  # RecordBatches, fewer than batch_rows rows in all
        self.count = 0  # rows in made

    def add_events(self, events: list):
        rows = self.rows
        rows += events
        while self.count + len(rows) >= self.batch_rows:
            take = self.batch_rows - self.count
            self.made.append(self.make(rows[:take]))
            del rows[:take]
            yield self._emit()

    def add_batch(self, batch):
        self._make_rows()
        self.made.append(batch)
        self.count += batch.num_rows
        while self.count >= self.batch_rows:
            yield self._emit()

    def finish(self):
        self._make_rows()
        if self.count:
            yield self._emit()

    def _make_rows(self) -> None:
        """The events not made yet, made a batch after the others (order kept)."""
        if self.rows:
            self.made.append(self.make(self.rows))
            self.count += len(self.rows)
            self.rows = []

    def _emit(self):
        """One batch of the first batch_rows rows made (or all of them), the rest kept."""
        import pyarrow as pa

        if len(self.made) == 1 and self.count <= self.batch_rows:
            (batch,), self.made, self.count = self.made, [], 0
            return batch
        table = pa.Table.from_batches(self.made)
        head, rest = table.slice(0, self.batch_rows), table.slice(self.batch_rows)
        self.made = rest.to_batches() if rest.num_rows else []
        self.count = rest.num_rows
        return head.combine_chunks().to_batches()[0]


class _SideConnection:
    """A plain connection, opened when first asked: the catalog's questions (types that are
    not built in, a binary slot's reg* OIDs) while the slot streams on another. Autocommit:
    it stays open while a stream is held between batches, and one idle in a transaction holds
    its locks on the catalog and is ended by ``idle_in_transaction_session_timeout``."""

    NAME = "pgcdc stream catalog"

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.conn = None

    def _open(self):
        import psycopg

        from pgcdc.capture.walsender import PINNED_GUCS, quote_literal

        if self.conn is None:
            self.conn = psycopg.connect(self.dsn, autocommit=True, application_name=self.NAME)
            for name, value in PINNED_GUCS.items():
                self.conn.execute(f"SET {name} = {quote_literal(value)}")
        return self.conn

    def query(self, sql: str, params):
        return self._open().execute(sql, params).fetchall()

    def set_name(self, name: str | None) -> None:
        """Its ``application_name`` (None: :data:`NAME`): a held stream's quiet report
        (:mod:`.held_stream`)."""
        self._open().execute("SELECT set_config('application_name', %s, false)",
                             [name or self.NAME])  # fmt: skip

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _open_stream(opts: dict, protocol_version: int, start: int, held: bool = False):
    """A walsender stream of the slot from ``start``, waiting while the slot is busy; one
    that may be ``held`` (:mod:`.held_stream`) says so by its application_name. A slot that
    another worker's held stream holds is taken from it."""
    import time

    from pgcdc.capture.logical import LogicalStream
    from pgcdc.capture.walsender import CaptureError
    import psycopg

    from pgcdc.streaming.held import HELD_APP, end_holder

    dsn = opts["dsn"]
    if held:
        from psycopg.conninfo import make_conninfo

        dsn = make_conninfo(dsn, application_name=HELD_APP)
    deadline = time.monotonic() + SLOT_BUSY_PATIENCE
    conn = None  # to end a held stream that holds the slot: one for all the tries
    try:
        while True:
            stream = LogicalStream(
                dsn, opts["slot"], list(opts["publications"]),
                protocol_version=protocol_version, binary=opts["binary"],
                messages=opts["messages"], start_lsn=start, auto_idle_ack=False,
            )  # fmt: skip
            try:
                return stream.open()
            except CaptureError as e:
                busy = e.sqlstate == _SLOT_BUSY or "is active for PID" in str(e)
                if not busy or time.monotonic() >= deadline:
                    raise SourceError(f"slot {opts['slot']!r}: stream from "
                                      f"{format_lsn(start)}: {str(e).strip()}") from None  # fmt: skip
            if conn is None:
                conn = psycopg.connect(opts["dsn"], autocommit=True,
                                       application_name="pgcdc stream")  # fmt: skip
            ended = end_holder(conn, opts["slot"])
            time.sleep(0.05 if ended else 0.5)
    finally:
        if conn is not None:
            conn.close()


_STREAM_CHUNK = 4 << 20  # bytes of records read from the stream before they are typed
_STREAM_GATHER = 1 << 20  # ... at least, while the server keeps sending


def _streamed_parts(opts: dict, plugin_options, start: int, end: int, raw_runs: bool = False,
                    keep: bool = False):  # fmt: skip
    """The events of the transactions committing in [start, end), in lists (or raw runs),
    streamed by a walsender from ``start``: the server skips what commits before ``start``
    and sends each transaction as it decodes it, while this process types the ones before.
    Ends at the first event committing at or past ``end``, or once the server says it has
    sent everything before ``end`` (a keepalive, asked for when the stream is quiet).

    ``keep``: the stream, and what was read past ``end``, are held for a batch starting at
    ``end`` (:mod:`.held_stream`); a stream held for ``start`` is taken rather than opened."""
    from collections import deque
    from itertools import chain

    from pgcdc.events.reader import EventReader, RawRun
    from pgcdc.capture.files import raw_chunks
    from pgcdc.values import LiveCatalog
    from pgcdc.streaming.held import HeldStream, take

    pv = int(dict(plugin_options)["proto_version"])
    key = (opts["dsn"], opts["slot"], opts["publications"], pv, opts["binary"],
           opts["messages"], opts["lenient"], raw_runs)  # fmt: skip
    held = take(key, start) if keep else None
    if held is not None:
        stream, reader, side, queue = held.stream, held.reader, held.side, held.queue
        # what a new stream from `start` would tell the server: Spark has the batches before
        stream.flushed_lsn = max(stream.flushed_lsn, start)
        try:
            stream.send_status()
        except Exception:  # noqa: BLE001 - it broke since its thread last read: a new one
            held.close()
            held = None
    if held is None:
        side = _SideConnection(opts["dsn"])
        stream = _open_stream(opts, pv, start, held=keep)
        reader = EventReader(lenient=opts["lenient"], catalog=LiveCatalog(side.query))
        queue = deque()  # iterators of parts read and not yet given, in stream order

    def parse(records: bytes):
        # a generator: nothing is read until its turn comes (the reader's state is in order)
        yield from reader.read_chunk_parts(raw_chunks(records), raw_runs)

    done = False
    try:
        while True:
            cut = False
            while queue and not cut:
                parts = queue[0]
                for part in parts:
                    if type(part) is RawRun:  # one transaction's changes
                        if part.txn[0] >= end:
                            queue[0], cut = chain([part], parts), True
                            break
                        yield part
                        continue
                    events = part if type(part) is list else list(part)
                    # commits are in order: only a part whose last event commits at or past
                    # the end is looked through, event by event
                    if events and events[-1].commit_lsn >= end:
                        at = next((i for i, ev in enumerate(events) if not _before(ev, end)),
                                  None)  # fmt: skip
                        if at is not None:
                            if at:
                                yield events[:at]
                            queue[0], cut = chain([events[at:]], parts), True
                            break
                    if events:
                        yield events
                else:
                    queue.popleft()
            if cut or stream.stats.server_wal_end >= end:
                done = True
                return
            out = bytearray()
            n, _, _ = stream.read_records(out, 0.2, _STREAM_CHUNK, end)
            while n and len(out) < _STREAM_GATHER and stream.stats.server_wal_end < end:
                # messages flowing: gather more before typing (a column is typed at once)
                n, _, _ = stream.read_records(out, 0.01, _STREAM_CHUNK - len(out), end)
            if out:
                queue.append(parse(bytes(out)))
            elif n == 0:
                stream.send_status(reply_requested=True)
    finally:
        if done and keep:
            tag = _quiet_tag(opts, pv)
            HeldStream(key, stream, reader, side, end, queue, parse, tag).hold(opts["hold_seconds"])
        else:
            stream.close()
            side.close()


def _before(ev, lsn: int) -> bool:
    """Whether ``ev`` belongs to a batch that ends at ``lsn``: its transaction's commit record
    starts before it, or (a non-transactional message, ``tx_ordinal`` -1) its own record
    does. A message's LSN is where its record ends, so a message ending exactly at a
    batch's end is that batch's: the next batch's walsender, started there, skips it."""
    return ev.commit_lsn <= lsn if ev.tx_ordinal == -1 else ev.commit_lsn < lsn


_PEEK_ROWS = 10_000  # a peek's rows taken at a time, and typed together


def _peeked_parts(opts: dict, plugin_options, start: int, end: int, raw_runs: bool = False):
    """The events, in lists (or raw runs, as :func:`_streamed_parts` gives them), of
    ``pg_logical_slot_peek_binary_changes(slot, end, ...)``: its rows streamed in binary
    (libpq's chunked rows, no hex to parse), each ``_PEEK_ROWS`` of them laid out as capture
    records (no stream flags: a peek does not stream) and read in chunks."""
    import time

    import psycopg

    from pgcdc.capture.walsender import PINNED_GUCS, quote_literal
    from pgcdc.events.reader import EventReader
    from pgcdc.runtime.capture_file import RECORD_HEADER
    from pgcdc.values import LiveCatalog

    pv = int(dict(plugin_options)["proto_version"])
    args = "".join(", %s, %s" for _ in plugin_options)
    params = [opts["slot"], format_lsn(end)] + [x for kv in plugin_options for x in kv]
    query = (
        "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM"
        f" pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL{args})"
    )
    pack = RECORD_HEADER.pack

    def rows(conn):
        """The peek's rows, waiting while the slot is busy (:func:`_wait_if_busy`; that is
        said before any row)."""
        deadline = time.monotonic() + SLOT_BUSY_PATIENCE
        while True:
            try:
                yield from conn.cursor(binary=True).stream(query, params, size=_PEEK_ROWS)
                return
            except psycopg.Error as e:
                _wait_if_busy(e, deadline, opts["slot"], f"peek up to {format_lsn(end)}")

    # types that are not built in, and a binary slot's reg* OIDs: asked on a connection of
    # their own, as the rows stream on this one
    side = _SideConnection(opts["dsn"])
    reader = EventReader(lenient=opts["lenient"], catalog=LiveCatalog(side.query))
    try:
        with psycopg.connect(opts["dsn"], autocommit=True,
                             application_name="pgcdc stream read") as conn:  # fmt: skip
            conn.execute("; ".join(f"SET {k} = {quote_literal(v)}"
                                   for k, v in PINNED_GUCS.items()))  # fmt: skip
            records, n = bytearray(), 0
            for lsn, data in rows(conn):
                records += pack(pv, 0, lsn, len(data))
                records += data
                n += 1
                if n == _PEEK_ROWS:
                    yield from _parts_of(reader, records, raw_runs)
                    records, n = bytearray(), 0
            if records:
                yield from _parts_of(reader, records, raw_runs)
    finally:
        side.close()


def _parts_of(reader, records: bytearray, raw_runs: bool):
    """The parts of ``records`` (capture records) as :func:`_streamed_parts` gives them."""
    from pgcdc.events.reader import RawRun
    from pgcdc.capture.files import raw_chunks

    for part in reader.read_chunk_parts(raw_chunks(bytes(records)), raw_runs):
        if type(part) is RawRun:
            yield part
            continue
        events = list(part)
        if events:
            yield events


_SCHEMA = None


def _arrow_schema():
    global _SCHEMA
    if _SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _SCHEMA = to_arrow_schema(event_schema(), timezone="UTC")
    return _SCHEMA


def events_batch(events: list):
    """The RecordBatch of :func:`event_schema` for ``events`` (change events, and logical
    messages), column by column: JSON images rendered a column at a time for runs of
    events of one table and shape (:func:`_image_column`), as :func:`pgcdc.values.dumps_images`
    renders them one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = _arrow_schema()
    if not events:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in schema], schema=schema
        )
    # the events' fields as lists (zip(*events) takes longer)
    columns = [list(map(itemgetter(i), events)) for i in range(len(events[0]))]
    (ops, rels, _, _, unchanged, lsns, commits, ordinals, times, xids, _, _, details,
     errors) = columns  # fmt: skip
    n = len(events)
    schemas = [None if r is None else r.schema for r in rels]
    tables = [None if r is None else r.table for r in rels]
    before, after = _image_column(events, columns, pa, pc)
    detail = [None] * n
    for i, op in enumerate(ops):
        if op == "t" or op == "m":
            detail[i] = _detail(events[i])
    stamp = pa.array(times, type=pa.int64())
    if stamp.null_count < n:
        stamp = pc.add(stamp, PG_EPOCH_UNIX_US)
    arrays = [
        pa.array(ops, type=pa.string()),
        pa.array(schemas, type=pa.string()),
        pa.array(tables, type=pa.string()),
        before,
        after,
        pa.array(unchanged, type=schema.field(5).type),
        pa.array(detail, type=pa.string()),
        pa.array(lsns, type=pa.int64()),
        pa.array(commits, type=pa.int64()),
        pa.array(ordinals, type=pa.int64()),
        stamp.cast(schema.field(10).type),
        pa.array(xids, type=pa.int64()),
        pa.array([[str(e) for e in x] if x else None for x in errors], type=schema.field(12).type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_BULK_RUN = 16  # shorter runs of one shape are rendered event by event


def _image_column(events: list, columns, pa, pc):
    """``before_json`` and ``after_json`` of ``events`` (``columns``: the events
    transposed) as Arrow string arrays."""
    ops = columns[0]
    before_parts, after_parts = [], []
    for lo, hi in _shape_runs(columns):
        run = events[lo:hi]
        op, partial_row = ops[lo], bool(columns[4][lo])
        bulk = None
        whole = op in ("c", "u", "d") and not partial_row and run[0].relation is not None
        if whole and len(run) >= _BULK_RUN:
            try:
                bulk = _bulk_images(run, pa, pc)
            except Exception:  # the event by event path says what is wrong, or agrees
                bulk = None
        if bulk is None:
            from pgcdc.values import dumps_images

            images = [dumps_images(ev) for ev in run]
            bulk = (
                pa.array([b for b, _ in images], type=pa.binary()),
                pa.array([a for _, a in images], type=pa.binary()),
            )
        before_parts.append(bulk[0])
        after_parts.append(bulk[1])
    return tuple(
        (pa.concat_arrays(parts) if len(parts) > 1 else parts[0]).cast(pa.string())
        for parts in (before_parts, after_parts)
    )


def _shape_runs(columns) -> list[tuple[int, int]]:
    """(start, end) of each run of events of one shape: relation, op, whether ``before`` is
    the key, unchanged columns or not, ``before`` and ``after`` present or not. Found with
    numpy, a column at a time (a Python groupby over each event's shape took a seventh of a
    batch)."""
    from itertools import repeat
    from operator import is_not

    import numpy as np

    ops, rels, befores, afters, unchanged = columns[:5]
    n = len(ops)
    if n == 0:
        return []
    change = np.zeros(n, bool)
    for values in (
        np.fromiter(map(id, rels), np.int64, n),
        np.frombuffer("".join(ops).encode(), np.uint8) if sum(map(len, ops)) == n else None,
        np.fromiter(map(bool, columns[11]), bool, n),
        np.fromiter(map(bool, unchanged), bool, n),
        np.fromiter(map(is_not, befores, repeat(None)), bool, n),
        np.fromiter(map(is_not, afters, repeat(None)), bool, n),
    ):
        if values is None:  # an op of more than one letter (begin, end): by each op
            values = np.unique(np.asarray(ops, dtype=object), return_inverse=True)[1]
        change[1:] |= values[1:] != values[:-1]
    cuts = [0, *np.flatnonzero(change).tolist(), n]
    return list(zip(cuts, cuts[1:]))


def _bulk_images(run: list, pa, pc):
    rel = run[0].relation
    ev = run[0]
    n = len(run)
    if ev.before is None:
        before = pa.nulls(n, type=pa.binary())
    elif ev.before_is_key:
        before = _json_objects([e.before for e in run], rel.key_names, rel.key_type_oids, pa, pc)
    else:
        before = _json_objects([e.before for e in run], rel.names, rel.value_type_oids, pa, pc)
    if ev.after is None:
        after = pa.nulls(n, type=pa.binary())
    else:
        after = _json_objects([e.after for e in run], rel.names, rel.value_type_oids, pa, pc)
    return before, after


def _json_objects(rows: list, names, type_oids, pa, pc):
    """``dumps_row(names, row, type_oids)`` of every row, as a binary array: each column's
    values rendered by themselves (:func:`_fragments`), then joined with the keys row by
    row in Arrow (orjson writes a value the same inside an object as alone)."""
    import orjson

    from pgcdc.values import _json

    columns = list(zip(*rows))
    if len(columns) != len(names):
        raise ValueError("a row of another length")
    renders = dict(_json._plan(type_oids))
    parts = []
    for j, (name, values) in enumerate(zip(names, columns)):
        render = renders.get(j)
        if render in (_json._float, _json._float4) and _plain_floats(values, pa, pc):
            render = None  # orjson writes these as to_jsonb does
        if render is not None:
            values = [None if v is None else render(v) for v in values]
        key = (b"{" if j == 0 else b",") + orjson.dumps(name) + b":"
        parts.append(pa.scalar(key, type=pa.binary()))
        parts.append(_fragments(values, pa, pc))
    if not parts:
        return pa.array([b"{}"] * len(rows), type=pa.binary())
    parts.append(pa.scalar(b"}", type=pa.binary()))
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", type=pa.binary()))


def _plain_floats(values, pa, pc) -> bool:
    """Whether every float is finite and below 2**53 (where repr's digits are float8out's)."""
    from pgcdc.values._pgtext import REPR_EXACT

    try:
        floats = pa.array(values, type=pa.float64())
        plain = pc.and_(pc.is_finite(floats), pc.less(pc.abs(floats), REPR_EXACT))
        return pc.all(plain).as_py() is not False
    except (pa.ArrowException, TypeError):
        return False


def _fragments(values, pa, pc):
    """The JSON of each value, as :func:`pgcdc.values.dumps` writes it, as a binary array.
    A column of one type (NULLs aside) is done in Arrow: integers, strings (those holding a
    character orjson escapes dumped one by one), finite Decimals, datetimes of years 1000 to
    9999; any other in one ``dumps`` of the whole column split at its commas, when no value
    holds one; else a value at a time."""
    from datetime import datetime
    from decimal import Decimal

    import orjson

    from pgcdc.values import _json

    dump = partial(orjson.dumps, default=_json._orjson_default, option=_json._OPTIONS)
    kinds = set(map(type, values))
    kinds.discard(type(None))
    kind = kinds.pop() if len(kinds) == 1 else None
    null = pa.scalar(b"null", type=pa.binary())
    try:
        if kind is int:
            texts = pa.array(values, type=pa.int64()).cast(pa.string())
            return texts.cast(pa.binary()).fill_null(null)
        if kind is str:
            from pgcdc.streaming.json_runs import quoted_strings

            texts = pa.array(values, type=pa.string())
            return quoted_strings(texts, pa, pc).cast(pa.binary()).fill_null(null)
        if kind is Decimal:  # the default hook writes a finite one as format(d, "f")
            texts = [None if d is None else format(d, "f") for d in values]
            texts = pa.array(texts, type=pa.string())
            if not pc.any(pc.match_substring_regex(texts, "[^-0-9.]")).as_py():
                return texts.cast(pa.binary()).fill_null(null)
        elif kind is datetime:
            return _datetime_texts(values, pa, pc).fill_null(null)
    except (pa.ArrowException, OverflowError, _NotVectorised):
        pass
    if values:
        parts = dump(list(values))[1:-1].split(b",")
        if len(parts) == len(values):  # no value's JSON holds a comma: these are the values
            return pa.array(parts, type=pa.binary())
    return pa.array(list(map(dump, values)), type=pa.binary())


class _NotVectorised(Exception):
    pass


def _datetime_texts(values, pa, pc):
    """``xsd_datetime`` of each datetime, quoted: ISO 8601, the fraction without trailing
    zeros, an aware one in UTC (``+00:00``)."""
    aware = next(v for v in values if v is not None).tzinfo is not None
    if any((v.tzinfo is None) == aware for v in values if v is not None):
        raise _NotVectorised  # aware and naive mixed
    stamps = pa.array(values, type=pa.timestamp("us", tz="UTC" if aware else None))
    stamps = stamps.cast(pa.timestamp("us"))  # an aware one as its UTC time
    years = pc.year(stamps)
    if pc.min(years).as_py() < 1000 or pc.max(years).as_py() > 9999:
        raise _NotVectorised
    texts = stamps.cast(pa.string())  # 2024-01-01 00:00:01.500000
    texts = pc.replace_substring(texts, " ", "T", max_replacements=1)
    texts = pc.replace_substring_regex(texts, r"\.?0+$", "")  # trailing zeros of the fraction
    tail = '+00:00"' if aware else '"'
    return pc.binary_join_element_wise('"', texts, tail, "").cast(pa.binary())


def _detail(ev) -> str | None:
    if ev.op == "t":
        from pgcdc.streaming.typed import truncate_detail

        return truncate_detail(ev)
    prefix, content, transactional = ev.detail
    return _json(
        {"prefix": prefix, "content": "\\x" + bytes(content).hex(), "transactional": transactional}
    )


def _text(data) -> str | None:
    if data is None:
        return None
    return data.decode() if isinstance(data, (bytes, bytearray)) else data


def _json(obj) -> str:
    from pgcdc.values import dumps

    return _text(dumps(obj))
