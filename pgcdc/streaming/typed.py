"""``format("pgcdc")`` with ``option("table", ...)``: one table's change events with typed
images: the columns of the JSON mode (``pgcdc.streaming.event_rows.EVENT_COLUMNS``) less
``schema`` and ``table``, with ``before`` and ``after`` structs of the table's columns typed
by :func:`pgcdc.spark.types.spark_type` (types that are not built in from the server's
catalog) plus ``_pg_text`` (the PostgreSQL text of a value the Spark type cannot hold), and
``before_is_key`` (``before`` holds the key columns only).

The columns are the table's as the publication publishes it when the query starts (a Spark
schema is fixed for the life of a query). A change made under a later Relation message
whose column the schema lacks, or whose type the schema types otherwise (``ALTER TABLE``
while the query runs), loses nothing and stops nothing: the column's PostgreSQL text goes
into ``_pg_text`` and the event's ``errors`` say to restart the query, which then reads the
table's columns anew (Delta Lake's streaming source asks the same of a schema change).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from types import SimpleNamespace

from pgcdc.errors import SetupError
from pgcdc.spark import types as pgtypes
from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US
from pgcdc.snapshot import server as pgsnap
from pgcdc.spark.table_batches import TableBuffer, image_columns, text_image
from pgcdc.spark.units import TableSchema
from pgcdc.values import dumps

__all__ = ["TypedBatches", "describe_table", "spark_schema"]

# the JSON mode's columns, with the images typed (and no schema/table: one table)
TYPED_COLUMNS = (
    "op",
    "before",
    "after",
    "before_is_key",
    "unchanged",
    "detail_json",
    "lsn",
    "commit_lsn",
    "tx_ordinal",
    "commit_time",
    "xid",
    "errors",
)


_RELATION = attrgetter("relation")


class _StandIn(SimpleNamespace):
    """A relation of the columns a schema holds (batches put relations in sets)."""

    __hash__ = object.__hash__


class TableNotPublished(SetupError, ValueError):
    pass


def describe_table(dsn: str, publications, name: str) -> dict:
    """The table ``name`` (``schema.table``, or a table name that is unique among those
    published) as ``publications`` publish it now: its columns, their types, its key and
    the catalog entries of types that are not built in."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc stream schema") as conn:
        tables = pgsnap.list_published_tables(conn, publications)
        found = [t for t in tables if name in (t.qualified_name, t.table)]
        if "." in name:
            found = [t for t in found if t.qualified_name == name]
        if len(found) != 1:
            published = ", ".join(sorted(t.qualified_name for t in tables)) or "none"
            what = "is published by more than one schema" if found else "is not published"
            raise TableNotPublished(
                f"table {name!r} {what} by {', '.join(publications)} (tables: {published}; "
                "fix: name it as schema.table, or add it to the publication)"
            )
        (t,) = found
        return {
            "schema": t.schema,
            "table": t.table,
            "names": list(t.names),
            "type_oids": list(t.type_oids),
            "typmods": [c.type_modifier for c in t.columns],
            "key": list(t.key),
            "catalog": pgsnap.catalog_docs(conn, [t]),
        }


def _table_schema(doc: dict):
    return TableSchema(
        doc["schema"],
        doc["table"],
        names=list(doc["names"]),
        type_oids=list(doc["type_oids"]),
        typmods=list(doc["typmods"]),
        key_names=tuple(doc["key"]) or None,
        latest=tuple(doc["names"]),
        catalog=pgsnap.make_catalog(doc["catalog"]),
    )


def spark_schema(doc: dict):
    """The Spark schema of the table ``doc`` (:func:`describe_table`) describes."""
    from pyspark.sql import types as T

    images = _table_schema(doc).columns_struct()
    texts = T.ArrayType(T.StringType(), True)
    kinds = {
        "op": T.StringType(), "before": images, "after": images,
        "before_is_key": T.BooleanType(), "unchanged": texts, "detail_json": T.StringType(),
        "lsn": T.LongType(), "commit_lsn": T.LongType(), "tx_ordinal": T.LongType(),
        "commit_time": T.TimestampType(), "xid": T.LongType(), "errors": texts,
    }  # fmt: skip
    return T.StructType([T.StructField(n, kinds[n], True) for n in TYPED_COLUMNS])


class TypedBatches:
    """Arrow batches of :func:`spark_schema` from a stream's events (a task's)."""

    def __init__(self, doc: dict):
        from pyspark.sql.pandas.types import to_arrow_schema

        self.ts = ts = _table_schema(doc)
        self.names = (ts.schema, ts.table)
        self.schema = to_arrow_schema(spark_schema(doc), timezone="UTC")
        self.buf = TableBuffer(ts, 0, self.schema.field("after").type)
        self.fits: dict[int, tuple] = {}  # id(relation) -> (relation, its fit): kept alive
        self.fitting: set[int] = set()  # ids of those the schema holds as they are

    def mine(self, events: list) -> list:
        """The table's changes among ``events``."""
        schema, table = self.names
        return [
            ev
            for ev in events
            if ev.relation is not None
            and ev.relation.table == table
            and ev.relation.schema == schema
            and ev.op in "cudt"
        ]

    def batch(self, events: list):
        """The RecordBatch of ``events`` (this table's changes, :meth:`mine`); None if none."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not events:
            return None
        texts: list = [None] * len(events)
        if not self._all_fit(events):
            events = [self._fitted(ev, texts, i) for i, ev in enumerate(events)]
        # the events' fields as lists (zip(*events) takes longer)
        (ops, rels, befores, afters, unchanged, lsns, commits, ordinals, times, xids, _,
         keyed) = [list(map(itemgetter(i), events)) for i in range(12)]  # fmt: skip
        before = image_columns(self.buf, befores, rels, keyed, "before")
        after = image_columns(self.buf, afters, rels, keyed, "after")
        if any(texts):
            before = _with_texts(before, [t and t[0] for t in texts], pa)
            after = _with_texts(after, [t and t[1] for t in texts], pa)
        schema = self.schema
        detail = (
            [truncate_detail(ev) if ev.op == "t" else None for ev in events] if "t" in ops else None
        )
        stamp = pa.array(times, type=pa.int64())
        if stamp.null_count < len(events):
            stamp = pc.add(stamp, PG_EPOCH_UNIX_US)
        arrays = {
            "op": pa.array(ops, type=pa.string()),
            "before": before,
            "after": after,
            "before_is_key": pa.array(keyed, type=pa.bool_()),
            "unchanged": pa.array(unchanged, type=schema.field("unchanged").type),
            "detail_json": pa.array(detail or [None] * len(events), type=pa.string()),
            "lsn": pa.array(lsns, type=pa.int64()),
            "commit_lsn": pa.array(commits, type=pa.int64()),
            "tx_ordinal": pa.array(ordinals, type=pa.int64()),
            "commit_time": stamp.cast(schema.field("commit_time").type),
            "xid": pa.array(xids, type=pa.int64()),
            "errors": pa.array(
                [[str(e) for e in x] if x else None for x in map(itemgetter(13), events)],
                type=schema.field("errors").type,
            ),
        }
        return pa.RecordBatch.from_arrays([arrays[n] for n in TYPED_COLUMNS], schema=schema)

    def run_batch(self, run):
        """The RecordBatch of a :class:`pgcdc.events.reader.RawRun` of this table's changes, typed
        from their text by Arrow (:func:`pgcdc.spark.table_batches.text_image`), no event made;
        None when a value needs the exact path (the caller loads the run's events)."""
        import pyarrow as pa

        if self._fit(run.rel)[1] is not None:
            return None
        keyed = run.op == "d" and run.before_is_key
        image = text_image(self.buf, run.rel, keyed, run.kinds, run.values)
        if image is None:
            return None
        m = run.m
        nothing = pa.nulls(m, image.type)
        commit_lsn, commit_time, xid, _origin = run.txn
        schema = self.schema
        arrays = {
            "op": pa.array([run.op] * m, type=pa.string()),
            "before": image if run.op == "d" else nothing,
            "after": nothing if run.op == "d" else image,
            "before_is_key": pa.array([run.before_is_key] * m, type=pa.bool_()),
            "unchanged": pa.array([()] * m, type=schema.field("unchanged").type),
            "detail_json": pa.nulls(m, pa.string()),
            "lsn": pa.array(run.lsns, type=pa.int64()),
            "commit_lsn": pa.array([commit_lsn] * m, type=pa.int64()),
            "tx_ordinal": pa.array(range(run.first, run.first + m), type=pa.int64()),
            "commit_time": pa.array([commit_time + PG_EPOCH_UNIX_US] * m, type=pa.int64()).cast(
                schema.field("commit_time").type
            ),
            "xid": pa.array([xid] * m, type=pa.int64()),
            "errors": pa.nulls(m, schema.field("errors").type),
        }
        return pa.RecordBatch.from_arrays([arrays[n] for n in TYPED_COLUMNS], schema=schema)

    def mine_run(self, run) -> bool:
        """Whether a raw run is of this table."""
        rel = run.rel
        return (rel.schema, rel.table) == self.names

    def _all_fit(self, events: list) -> bool:
        ids = set(map(id, map(_RELATION, events)))
        if ids <= self.fitting:
            return True
        for ev in events:
            if id(ev.relation) not in self.fitting and self._fit(ev.relation)[1] is not None:
                return False
        return True

    def _fit(self, rel) -> tuple:
        """(rel, None) when the schema holds every column of ``rel`` as typed; else (rel,
        (a stand-in relation of the columns it holds, their positions in ``rel``, the other
        columns' (position, name, type OID)))."""
        got = self.fits.get(id(rel))
        if got is not None and got[0] is rel:
            return got
        ts = self.ts
        keep, other = [], []
        for i, (n, oid, mod) in enumerate(zip(rel.names, rel.type_oids, rel.type_modifiers)):
            same = n in ts.names and pgtypes.spark_type(oid, mod, ts.catalog) == ts.spark_type(n)
            (keep if same else other).append(i if same else (i, n, oid))
        if not other:
            got = (rel, None)
            self.fitting.add(id(rel))
        else:
            names = tuple(rel.names[i] for i in keep)
            stand_in = _StandIn(
                schema=rel.schema, table=rel.table, names=names,
                type_oids=tuple(rel.type_oids[i] for i in keep),
                type_modifiers=tuple(rel.type_modifiers[i] for i in keep),
                key_names=tuple(n for n in rel.key_names if n in names),
            )  # fmt: skip
            got = (rel, (stand_in, keep, other))
        self.fits[id(rel)] = got
        return got

    def _fitted(self, ev, texts: list, i: int):
        rel, fit = self._fit(ev.relation)
        if fit is None:
            return ev
        stand_in, keep, other = fit
        lost = []
        images = []
        for which, values in (("before", ev.before), ("after", ev.after)):
            if values is None:
                images.append((None, None))
                continue
            if which == "before" and ev.before_is_key:
                names = rel.key_names
                where = {n: j for j, n in enumerate(names)}
                kept = tuple(values[where[n]] for n in stand_in.key_names)
                spots = [(where[n], n, oid) for _, n, oid in other if n in where]
            else:
                kept = tuple(values[j] for j in keep)
                spots = other
            text = {}
            for j, n, oid in spots:
                v = values[j]
                if v is not None and v is not pgtypes.UNCHANGED:
                    text[n] = pgtypes.text_converter(oid)(v)
                lost.append(n)
            images.append((kept, text or None))
        texts[i] = (images[0][1], images[1][1])
        note = (
            f"column(s) {', '.join(sorted(set(lost)))} of {rel.schema}.{rel.table} are not in "
            "this query's schema as typed (the table changed after the query started): their "
            "text is in _pg_text; restart the query to read them typed"
        )
        return ev._replace(
            relation=stand_in,
            before=images[0][0],
            after=images[1][0],
            unchanged=tuple(n for n in ev.unchanged if n in stand_in.names),
            errors=(*ev.errors, note),
        )


def truncate_detail(ev) -> str:
    """A truncate's options as ``detail_json`` (both modes) holds them."""

    text = dumps({"cascade": ev.detail[0], "restart_identity": ev.detail[1]})
    return text.decode() if isinstance(text, (bytes, bytearray)) else text


def _with_texts(images, texts: list, pa):
    """``images`` (a StructArray of columns + ``_pg_text``) with ``texts`` (per row: {column:
    PostgreSQL text} or None) added to ``_pg_text``."""
    fields = list(images.type)
    children = images.flatten()
    merged = []
    for had, more in zip(children[-1].to_pylist(), texts):
        if more:
            had = list({**dict(had or ()), **more}.items())
        merged.append(had)
    children[-1] = pa.array(merged, type=fields[-1].type)
    return pa.StructArray.from_arrays(children, fields=fields, mask=images.is_null())
