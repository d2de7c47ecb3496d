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

One row per change event (schema :func:`pgcdc.streaming.event_rows.event_schema`, single stream for
every table): ``op``
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

This module is the driver's side: the offsets, the planning and the slot's advances.
``read`` runs in one Spark task per micro-batch, in :mod:`pgcdc.streaming.read`: it streams
the slot over the replication protocol from ``start`` to ``end``, and in a running query (any
trigger but ``AvailableNow``) holds the stream in its Python worker for the next batch,
reading on while Spark commits and plans (:mod:`pgcdc.streaming.held`); the rows are built
a column at a time (:mod:`pgcdc.streaming.event_rows`).

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
(streaming off). A slot that cannot be read raises :class:`pgcdc.streaming.SlotError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pgoutput_codec as pgc
import psycopg
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

from pgcdc.capture.options import PluginOptions, max_protocol_version
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.snapshot.server import SnapshotError
from pgcdc.streaming.held import (
    QUIET_FRESH,
    SlotError,
    end_holder,
    execute_peek,
    holder,
    quiet_reports,
    stream_tag,
)
from pgcdc.streaming.event_rows import event_schema
from pgcdc.streaming.typed import TableNotPublished, describe_table, spark_schema

__all__ = ["PgcdcDataSource", "PgcdcStreamReader"]

# pgoutput tags: where transactions begin and end, and a logical message
_COMMIT, _PREPARE = ord(pgc.Commit.TAG), ord(pgc.Prepare.TAG)
_COMMIT_PREPARED, _ROLLBACK_PREPARED = ord(pgc.CommitPrepared.TAG), ord(pgc.RollbackPrepared.TAG)
_BEGIN, _BEGIN_PREPARE = ord(pgc.Begin.TAG), ord(pgc.BeginPrepare.TAG)
_MESSAGE = ord(pgc.Message.TAG)


_IDLE_ADVANCE_BYTES = 16 << 20


# how far the slot's restart_lsn may trail the WAL when a batch is planned before a standby
# snapshot is logged (each batch's walsender decodes again from restart_lsn; _restart_point)
_RESTART_LAG_BYTES = 1 << 20


HOLD_SECONDS = 10.0  # option holdSeconds: how long a task holds its stream for the next batch


class PgcdcDataSource(DataSource):
    """The ``pgcdc`` data source: a streaming reader of a logical replication slot."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def schema(self):
        opts = _options(dict(self.options))
        if opts["table"]:
            return spark_schema(_describe(opts))
        return event_schema()

    def streamReader(self, schema) -> DataSourceStreamReader:
        reader = PgcdcStreamReader(dict(self.options))
        if reader.opts["table"]:
            doc = reader.opts["table_doc"] = _describe(reader.opts)
            if spark_schema(doc) != schema:
                raise SlotError(
                    f"table {reader.opts['table']!r} changed while the query started "
                    "(fix: start the query again)"
                )
        return reader


def _describe(opts: dict) -> dict:
    """The option ``table``'s table as the server publishes it now."""
    try:
        return describe_table(opts["dsn"], opts["publications"], opts["table"])
    except (TableNotPublished, SnapshotError) as e:
        raise SlotError(str(e)) from None
    except psycopg.Error as e:
        raise SlotError(f"cannot read the columns of {opts['table']!r}: {str(e).strip()}") from None


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
        raise SlotError(f"format('pgcdc') needs the option(s) {', '.join(missing)}")

    def flag(name: str) -> bool:
        value = str(opts.get(name, "false")).lower()
        if value not in ("true", "false"):
            raise SlotError(f"option {name} must be true or false, got {value!r}")
        return value == "true"

    max_events = opts.get("maxeventspertrigger")
    transport = str(opts.get("transport", "walsender")).lower()
    if transport not in ("walsender", "peek"):
        raise SlotError(f"option transport must be walsender or peek, got {transport!r}")
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
        self._quiet_tag = stream_tag(self.opts, int(dict(self.plugin_options)["proto_version"]))

    def __getstate__(self):  # pickled to the tasks: without the driver's connection
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    # -- driver side --------------------------------------------------------------------------

    def _connection(self):
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(
                    self.opts["dsn"], autocommit=True, application_name="pgcdc stream"
                )
            except psycopg.Error as e:
                raise SlotError(f"cannot connect: {str(e).strip()}") from None
        return self._conn

    def _plugin_options(self) -> list[tuple[str, str]]:
        major = self._connection().info.server_version // 10000
        pv = self.opts["protocol_version"] or max_protocol_version(major)
        plugin = PluginOptions(
            self.opts["publications"], pv, binary=self.opts["binary"],
            messages=self.opts["messages"],
        )  # fmt: skip
        try:
            plugin.check(major)
        except ValueError as e:
            raise SlotError(str(e)) from None
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
            raise SlotError(
                f"replication slot {self.opts['slot']!r} does not exist (fix: create it with "
                "pgcdc snapshot or pgcdc capture --create-slot, or check the slot option)"
            )
        if row[1] != "pgoutput":
            raise SlotError(f"slot {self.opts['slot']!r} uses plugin {row[1]}, not pgoutput")
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
        end_holder(self._connection(), self.opts["slot"])  # a peek needs the slot free
        args = "".join(", %s, %s" for _ in self.plugin_options)
        params = [self.opts["slot"], format_lsn(upto)]
        params += [x for kv in self.plugin_options for x in kv]
        cur = execute_peek(
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
        lsn = parse_lsn(end["lsn"])
        if lsn <= self._confirmed():
            return
        pid = holder(self._connection(), self.opts["slot"])
        if pid is not None:
            if self._target is None:
                return  # the next batch's task confirms it on the stream it takes
            end_holder(self._connection(), self.opts["slot"], pid=pid)  # another query's, idle
        execute_peek(
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
        from pgcdc.streaming.read import read_batch  # lazy: the driver needs no reader (0.05 s)

        yield from read_batch(
            self.opts, self.plugin_options, partition.start, partition.end, batch_rows=10_000,
            keep=partition.keep,
        )  # fmt: skip
