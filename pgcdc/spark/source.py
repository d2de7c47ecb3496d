"""A Structured Streaming source that reads a replication slot: ``format("pgcdc")``.

::

    from pgcdc.spark.source import PgcdcDataSource
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
``(commit_lsn, tx_ordinal)`` orders events (see :mod:`pgcdc.events`).

Offsets are LSNs, ``{"lsn": "16/B374D848"}``, always at a transaction boundary: the end of a
commit record (or, when the slot has nothing to send for a long stretch of WAL, a position
where nothing is pending). ``initialOffset`` is the slot's ``confirmed_flush_lsn``.
``latestOffset`` asks the server: it peeks the slot up to ``pg_current_wal_flush_lsn()``
fetching only each message's LSN and tag (the server decodes, nothing else crosses the wire)
and picks the last boundary, within ``maxEventsPerTrigger`` messages when set.

``read`` runs in one Spark task per micro-batch (a slot is one ordered stream: a peek always
starts at the slot's position, so splitting a batch would decode its start again in every
task). It peeks ``pg_logical_slot_peek_binary_changes(slot, end, NULL, ...)``, which does not
consume, decodes with ``pgoutput_codec``, builds events with :class:`pgcdc.events.EventReader`
and yields Arrow batches of the events whose transaction commits inside the batch's offsets.
A peek up to a commit's end returns exactly the transactions committed up to there, so the
same batch re-read after a crash gives the same rows.

``commit(end)`` advances the slot (``pg_replication_slot_advance``) only after Spark has
committed the batch to its checkpoint, so the slot never gets ahead of the checkpoint: a query
killed at any moment restarts from its checkpoint, re-runs the batch it had planned with the
same offsets, and with an idempotent sink (Parquet/Delta file sinks with a checkpoint) every
change lands exactly once.

Options: ``dsn``, ``slot``, ``publication`` (comma-separated), ``protocol_version`` (default:
the server's highest), ``binary`` (false), ``messages`` (false), ``lenient`` (false),
``maxEventsPerTrigger`` (messages per micro-batch, at least one transaction),
``idleAdvanceBytes`` (16 MiB). The slot must exist (``pgcdc snapshot`` or ``pgcdc capture
--create-slot`` make one); transactions are read whole (streaming off).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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

from ..lsn import format_lsn, parse_lsn
from ..runtime.semantics import PG_EPOCH_UNIX_US

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


# pgoutput tags: where transactions start and end
_BEGIN, _COMMIT, _MESSAGE = ord("B"), ord("C"), ord("M")
_BEGIN_PREPARE, _PREPARE, _COMMIT_PREPARED, _ROLLBACK_PREPARED = (
    ord("b"),
    ord("P"),
    ord("K"),
    ord("r"),
)
_IDLE_ADVANCE_BYTES = 16 << 20


class SourceError(RuntimeError):
    """A slot that cannot be read, with the slot and what to do."""


_SLOT_BUSY = "55006"  # the slot is in use by another process
SLOT_BUSY_PATIENCE = 60.0  # seconds: a killed query's backend may hold the slot a moment


def _execute_peek(conn, query: str, params, slot: str, what: str, cursor=None):
    """Run a peek, waiting while the slot is busy (a killed run's backend may still hold it
    until the server notices the closed connection)."""
    import time

    import psycopg

    deadline = time.monotonic() + SLOT_BUSY_PATIENCE
    while True:
        try:
            if cursor is not None:
                cursor.execute(query, params)
                return cursor
            return conn.execute(query, params)
        except psycopg.Error as e:
            if getattr(e, "sqlstate", None) == _SLOT_BUSY and time.monotonic() < deadline:
                if not conn.autocommit:
                    conn.rollback()
                time.sleep(0.5)
                continue
            raise SourceError(f"slot {slot!r}: {what}: {str(e).strip()}") from None


class PgcdcDataSource(DataSource):
    """The ``pgcdc`` data source: a streaming reader of a logical replication slot."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def schema(self):
        return event_schema()

    def streamReader(self, schema) -> DataSourceStreamReader:
        return PgcdcStreamReader(dict(self.options))


class _Batch(InputPartition):
    """One micro-batch: the transactions committing in (start, end]."""

    def __init__(self, start: int, end: int):
        super().__init__((start, end))
        self.start, self.end = start, end


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
    }


class PgcdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, planning and slot advances run on the driver; :meth:`read` in a task."""

    def __init__(self, options: dict):
        self.opts = _options(options)
        self._conn = None
        self._target: int | None = None  # Trigger.AvailableNow: read no further than this
        self.plugin_options = self._plugin_options()

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
        from ..capture.options import PluginOptions, max_protocol_version

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
        self._target = self._flush_lsn()

    def _flush_lsn(self) -> int:
        (lsn,) = self._connection().execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        return parse_lsn(lsn)

    def getDefaultReadLimit(self):
        if self.opts["max_events"]:
            return ReadMaxRows(self.opts["max_events"])
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit=None) -> dict:
        begin = parse_lsn(start["lsn"])
        upto = self._flush_lsn() if self._target is None else self._target
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self._last_boundary(begin, upto, max_rows)
        return {"lsn": format_lsn(end)}

    def _last_boundary(self, begin: int, upto: int, max_rows: int | None) -> int:
        """The last transaction boundary after ``begin`` in the slot's output up to ``upto``
        (within ``max_rows`` messages past ``begin`` when given, but at least one
        transaction); ``begin`` when there is none."""
        if upto <= begin:
            return begin
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
        best, seen, pending, in_txn, prepared, after = begin, 0, 0, False, 0, 0
        for lsn, tag in cur:
            pending += 1
            after += lsn > begin
            boundary = False
            if tag in (_BEGIN, _BEGIN_PREPARE):
                in_txn = True
            elif tag == _COMMIT:
                in_txn, boundary = False, True
            elif tag == _PREPARE:  # held by the reader until COMMIT/ROLLBACK PREPARED
                in_txn, prepared = False, prepared + 1
            elif tag in (_COMMIT_PREPARED, _ROLLBACK_PREPARED):
                prepared, boundary = max(0, prepared - 1), True
            elif tag == _MESSAGE and not in_txn:
                boundary = True  # a non-transactional message is its own unit
            if not boundary or prepared:
                continue
            if lsn > begin:
                if max_rows is not None and best > begin and seen + pending > max_rows:
                    break
                seen += pending
                best = lsn
            pending = 0
        if best == begin and after == 0 and upto - begin >= self.opts["idle_advance"]:
            best = upto  # nothing to send in a long stretch of WAL: let the slot move on
        return best

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        return [_Batch(lo, hi)] if hi > lo else []

    def commit(self, end: dict) -> None:
        """Spark has committed every batch up to ``end``: the slot may forget them."""
        lsn = parse_lsn(end["lsn"])
        if lsn <= self._confirmed():
            return
        self._connection().execute(
            "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
            [self.opts["slot"], format_lsn(lsn)],
        )

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- task side ----------------------------------------------------------------------------

    def read(self, partition: _Batch) -> Iterator:
        yield from read_batch(
            self.opts, self.plugin_options, partition.start, partition.end, batch_rows=10_000
        )


def read_batch(opts: dict, plugin_options, start: int, end: int, *, batch_rows: int = 10_000):
    """Arrow batches of the events committed in (start, end], peeked from the slot."""
    import psycopg
    import pyarrow as pa

    from ..capture.walsender import PINNED_GUCS, quote_literal
    from ..events import EventReader
    from ..values import LiveCatalog

    pv = int(dict(plugin_options)["proto_version"])
    args = "".join(", %s, %s" for _ in plugin_options)
    params = [opts["slot"], format_lsn(end)] + [x for kv in plugin_options for x in kv]
    with psycopg.connect(opts["dsn"], application_name="pgcdc stream read") as conn:
        for name, value in PINNED_GUCS.items():
            conn.execute(f"SET {name} = {quote_literal(value)}")
        with conn.cursor(name="pgcdc_peek") as cur:
            cur.itersize = 5000
            _execute_peek(
                conn,
                "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM"
                f" pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL{args})",
                params,
                opts["slot"],
                f"peek up to {format_lsn(end)}",
                cursor=cur,
            )
            # types that are not built in, and a binary slot's reg* OIDs: asked as they come
            catalog = LiveCatalog(lambda q, p: conn.execute(q, p).fetchall())
            reader = EventReader(lenient=opts["lenient"], catalog=catalog)
            rows = _EventRows()
            for ev in _peeked_events(reader, cur, pv):
                op = ev.op
                # a transaction committed up to `start` was in an earlier batch; its Relation
                # messages were still fed to the reader above
                if ev.tx_ordinal < 0:
                    if ev.commit_lsn <= start:
                        continue
                elif ev.commit_lsn < start:
                    continue
                if op in ("begin", "end"):
                    continue
                rows.add(ev)
                if rows.count >= batch_rows:
                    yield rows.batch(pa)
                    rows = _EventRows()
            if rows.count:
                yield rows.batch(pa)


def _peeked_events(reader, cursor, protocol_version: int, group: int = 5000):
    """The events of peeked (lsn, data) rows: each group of rows laid out as capture records
    (no stream flags: a peek does not stream) and read in chunks."""
    from ..runtime.capture import RECORD_HEADER
    from ..sources import raw_chunks

    pack = RECORD_HEADER.pack
    while rows := cursor.fetchmany(group):
        records = bytearray()
        for lsn, data in rows:
            records += pack(protocol_version, 0, lsn, len(data))
            records += data
        yield from reader.read_chunks(raw_chunks(bytes(records)))


class _EventRows:
    """Columns of :func:`event_schema`, filled event by event."""

    def __init__(self):
        self.cols = [[] for _ in range(13)]
        self.count = 0

    def add(self, ev) -> None:
        from pgcdc.values import dumps_images

        rel = ev.relation
        c = self.cols
        detail = None
        before, after = dumps_images(ev)
        if ev.op == "t":
            detail = _json({"cascade": ev.detail[0], "restart_identity": ev.detail[1]})
        elif ev.op == "m":
            prefix, content, transactional = ev.detail
            detail = _json(
                {
                    "prefix": prefix,
                    "content": "\\x" + bytes(content).hex(),
                    "transactional": transactional,
                }
            )
        c[0].append(ev.op)
        c[1].append(None if rel is None else rel.schema)
        c[2].append(None if rel is None else rel.table)
        c[3].append(_text(before))
        c[4].append(_text(after))
        c[5].append(list(ev.unchanged))
        c[6].append(detail)
        c[7].append(ev.lsn)
        c[8].append(ev.commit_lsn)
        c[9].append(ev.tx_ordinal)
        c[10].append(None if ev.commit_time is None else ev.commit_time + PG_EPOCH_UNIX_US)
        c[11].append(ev.xid)
        c[12].append([str(e) for e in ev.errors] or None)
        self.count += 1

    def batch(self, pa):
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(event_schema(), timezone="UTC")
        arrays = [pa.array(col, type=f.type) for col, f in zip(self.cols, schema)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _text(data) -> str | None:
    if data is None:
        return None
    return data.decode() if isinstance(data, (bytes, bytearray)) else data


def _json(obj) -> str:
    from pgcdc.values import dumps

    return _text(dumps(obj))
