"""The SCD frames: a table's new rows as Spark DataFrames, from its rows now and the run's
operations (:mod:`pgcdc.apply.ops`). No I/O here: :mod:`pgcdc.apply.run` reads the rows
and writes what these return.

Current state (SCD1), per table, in ``(commit_lsn, tx_ordinal)`` order:

- tables with a key (REPLICA IDENTITY DEFAULT with a primary key, or USING INDEX; the key is
  that of the latest such Relation message): the latest change per key wins; a delete
  removes the row; an update whose old key differs from its new key (``before``) removes the
  old row and writes the new one; unchanged TOAST columns ('u') keep the value of the key's
  previous version (the existing state, or an earlier change in the run); with REPLICA
  IDENTITY FULL the old row already supplies them. A 'u' column whose previous value is not
  known (the row came under this key by a key change in the same run) is an error naming the
  table, column and LSN, never a silent NULL;
- tables without a key (REPLICA IDENTITY FULL without a key in any version, or NOTHING):
  rows are a multiset: an insert adds its row, a delete removes one row equal to its old
  image, an update does both. The server refuses UPDATE/DELETE on a published table with
  REPLICA IDENTITY NOTHING, so such tables are insert-only; a delete or update without an
  old image, or one removing a row the state does not have, is an error;
- a truncate removes every row ordered before it (the existing state and earlier changes).

History (SCD2): every version of a row with ``_valid_from_lsn``/``_valid_from_time`` (its
change's commit LSN and time), ``_valid_to_lsn``/``_valid_to_time`` (the change that replaced
or deleted it, or the truncate; null while current) and ``_is_current``. Keyed tables only.
A table's first version from a snapshot holds every snapshot row as current from the
snapshot's point (``_valid_from_time`` null: the snapshot does not say when a row was
written). Closed versions take the table's columns as they are now (a column added since is
null in them, a dropped one goes).

Columns of the state: the table's columns as of its latest Relation message (a dropped column
is dropped; an added one holds its DEFAULT, or null, in rows written before it existed),
typed by :mod:`pgcdc.spark.types`, then ``_pg_text``, ``_commit_lsn`` and ``_tx_ordinal``
(the change that wrote the row), and the SCD2 columns.

Every function takes ``F``, ``pyspark.sql.functions``, from its caller: importing this module
needs no pyspark.
"""

from __future__ import annotations

from pgcdc.apply.ops import special_column, value_column
from pgcdc.apply.state import ApplyError
from pgcdc.lsn import format_lsn
from pgcdc.spark import types as pgtypes
from pgcdc.spark.names import quoted

__all__ = [
    "META",
    "SCD2_META",
    "SPECIAL",
    "base_rows",
    "key_parts",
    "seq_after",
    "state_columns",
    "table_ops",
    "table_state",
]

META = ("_commit_lsn", "_tx_ordinal")
SPECIAL = pgtypes.SPECIAL_COLUMN
SCD2_META = ("_valid_from_lsn", "_valid_from_time", "_valid_to_lsn", "_valid_to_time")


def state_columns(columns, scd: int) -> list[str]:
    cols = [*columns, SPECIAL, *META]
    if scd == 2:
        cols += [*SCD2_META, "_is_current"]
    return cols


def seq_after(F, lsn_col, ord_col, lsn, ordinal):
    return (F.col(lsn_col) > F.lit(lsn)) | (
        (F.col(lsn_col) == F.lit(lsn)) & (F.col(ord_col) > F.lit(ordinal))
    )


def key_parts(keys) -> list[str]:
    """The columns a key is compared by: each key column's typed value (_k0, ...) and its
    PostgreSQL text where the type cannot hold it (_kt0, ...: 'infinity', NaN), so keys that
    are all null typed stay apart."""
    n = len(keys or ())
    return [f"_k{i}" for i in range(n)] + [f"_kt{i}" for i in range(n)]


def table_ops(F, ops, number: int, ts, keys, columns):
    """One table's operations (see :mod:`pgcdc.apply.ops`) under the table's column names:
    key columns _k0... and _kt0... (see :func:`key_parts`), ``columns`` (null where the
    table never had one), then _pg_text, _commit_lsn, _tx_ordinal, _sub, _upsert, _bad,
    _moved, _unchanged and _commit_time."""
    names = ts.names

    def col(name):
        if name not in names:
            return F.lit(None).cast("string")
        return F.col(value_column(number, names.index(name)))

    return ops.where(F.col("_t") == number).select(
        *[col(k).alias(f"_k{i}") for i, k in enumerate(keys or ())],
        *[
            F.col(special_column(number))[k].alias(f"_kt{i}")  # a key the type cannot hold
            for i, k in enumerate(keys or ())
        ],
        *[col(c).alias(c) for c in columns],
        F.col(special_column(number)).alias(SPECIAL),
        *META,
        "_sub",
        "_upsert",
        "_bad",
        "_moved",
        "_unchanged",
        "_commit_time",
    )


def table_state(F, scd, ce, name, base, changes, keys, columns, truncate, unchanged, ts):
    """The table's new state: ``base`` with ``changes`` applied as SCD ``scd`` (1 or 2)."""
    if scd == 1:
        lsn_of = _lsn_finder(F, ce, name)
        return _scd1(F, name, base, changes, keys, columns, truncate, unchanged, ts, lsn_of)
    if not keys:
        raise ApplyError(f"{name}: SCD2 needs a key; the table has none")
    return _scd2(F, name, base, changes, keys, columns, truncate, unchanged, ts)


def _scd1(F, name, base, changes, keys, columns, truncate, unchanged, ts, lsn_of=None):
    from pyspark.sql import Window

    if not keys:
        return _bag(F, name, base, changes, columns, truncate, ts, lsn_of)
    ops = _history(F, name, base, changes, keys, columns, truncate, unchanged, ts)
    if ops is None:
        return base_rows(F, base, columns, ts).limit(0)
    w = Window.partitionBy(*key_parts(keys)).orderBy(
        F.col("_commit_lsn").desc(), F.col("_tx_ordinal").desc(), F.col("_sub").desc()
    )
    latest = ops.withColumn("_rn", F.row_number().over(w)).where(
        (F.col("_rn") == 1) & F.col("_upsert")
    )
    if unchanged:
        _check_resolved(F, name, latest, keys)
    return latest.select(*_cols(F, columns), SPECIAL, *META)


def _scd2(F, name, base, changes, keys, columns, truncate, unchanged, ts):
    from pyspark.sql import Window

    history = base
    current = None
    if base is not None and "_is_current" not in base.columns:
        # a snapshot's rows (a table's first version): its state at the snapshot's point,
        # every row current from there (``_valid_from_time`` unknown: null)
        history, current = None, base
    elif base is not None:
        closed = base.where(~F.col("_is_current"))
        current = base.where(F.col("_is_current")).drop(
            "_valid_from_lsn", "_valid_to_lsn", "_valid_to_time", "_is_current"
        )
        history = closed
    ops = _history(F, name, current, changes, keys, columns, None, unchanged, ts)
    w = Window.partitionBy(*key_parts(keys)).orderBy("_commit_lsn", "_tx_ordinal", "_sub")
    nxt = F.lead(F.struct("_commit_lsn", "_commit_time")).over(w)
    rows = ops.withColumn("_next", nxt).where(F.col("_upsert"))
    if unchanged:
        _check_resolved(F, name, rows, keys)
    valid_to_lsn = F.col("_next._commit_lsn")
    valid_to_time = F.col("_next._commit_time")
    if truncate is not None:
        t_lsn, t_ord = truncate["commit_lsn"], truncate["tx_ordinal"]
        before_t = ~seq_after(F, "_commit_lsn", "_tx_ordinal", t_lsn, t_ord)
        ends_after_t = valid_to_lsn.isNull() | (valid_to_lsn > F.lit(t_lsn))
        cut = before_t & ends_after_t
        valid_to_lsn = F.when(cut, F.lit(t_lsn)).otherwise(valid_to_lsn)
        valid_to_time = F.when(cut, F.lit(None).cast("timestamp")).otherwise(valid_to_time)
    out = rows.select(
        *_cols(F, columns),
        SPECIAL,
        *META,
        F.col("_commit_lsn").alias("_valid_from_lsn"),
        F.col("_commit_time").alias("_valid_from_time"),
        valid_to_lsn.alias("_valid_to_lsn"),
        valid_to_time.alias("_valid_to_time"),
    ).withColumn("_is_current", F.col("_valid_to_lsn").isNull())
    if history is not None:
        # closed versions in the table's columns now: a column added since is null in them,
        # a dropped one goes, a widened one takes its new type (as the current rows do)
        have = set(history.columns)
        out = history.select(*[
            (F.col(quoted(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in out.schema.fields
        ]).unionByName(out)  # fmt: skip
    return out


def _bag(F, name, base, changes, columns, truncate, ts, lsn_of=None):
    """Tables without a key: rows as a multiset (see the module docstring)."""
    parts = []
    if base is not None and truncate is None:
        parts.append(base_rows(F, base, columns, ts).withColumn("_n", F.lit(1)))
    if changes is not None:
        ch = changes
        if truncate is not None:
            ch = ch.where(
                seq_after(
                    F, "_commit_lsn", "_tx_ordinal", truncate["commit_lsn"], truncate["tx_ordinal"]
                )
            )
        bad = ch.where(F.col("_bad")).select(*META).head()
        if bad is not None:
            op, lsn = lsn_of(bad["_commit_lsn"], bad["_tx_ordinal"])
            raise ApplyError(
                f"{name}: {'an update' if op == 'u' else 'a delete'} at LSN {lsn} "
                "has no old row image, and the table has no key to match it by"
            )
        # an insert or update adds its new row, an update or delete removes its old one
        parts.append(
            ch.select(
                *_cols(F, columns),
                SPECIAL,
                *META,
                F.when(F.col("_upsert"), F.lit(1)).otherwise(F.lit(-1)).alias("_n"),
            )
        )
    if not parts:
        return None
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p.select(*_cast_like(F, rows)))
    group = [*_cols(F, columns), F.to_json(F.col(SPECIAL)).alias("_special_key")]
    agg = rows.groupBy(*group).agg(
        F.sum("_n").alias("_n"),
        F.first(SPECIAL).alias(SPECIAL),
        F.max(F.struct("_commit_lsn", "_tx_ordinal")).alias("_seq"),
    )
    bad = agg.where(F.col("_n") < 0).head()
    if bad is not None:
        raise ApplyError(
            f"{name}: {-bad['_n']} delete(s)/update(s) remove a row the state does not hold "
            f"(last at commit LSN {format_lsn(bad['_seq']['_commit_lsn'])})"
        )
    return (
        agg.where(F.col("_n") > 0)
        .withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col("_n").cast("int"))))
        .select(
            *_cols(F, columns),
            SPECIAL,
            F.col("_seq._commit_lsn").alias("_commit_lsn"),
            F.col("_seq._tx_ordinal").alias("_tx_ordinal"),
        )
    )


def _history(F, name, base, changes, keys, columns, truncate, unchanged, ts):
    """All per-key operations (existing state as upserts first), 'u' columns filled."""
    from pyspark.sql import Window

    ops = _ops(F, changes, keys, columns, truncate) if changes is not None else None
    part = key_parts(keys)
    if base is not None and truncate is None:
        # SCD2's current rows keep their start time (their change is not in this run)
        timed = "_valid_from_time" in base.columns
        b = base_rows(F, base, columns, ts, ("_valid_from_time",) if timed else ()).select(
            *[F.col(quoted(k)).alias(f"_k{i}") for i, k in enumerate(keys)],
            *[F.col(SPECIAL)[k].alias(f"_kt{i}") for i, k in enumerate(keys)],
            F.lit(1).alias("_sub"),
            F.lit(True).alias("_upsert"),
            *_cols(F, columns),
            SPECIAL,
            *META,
            F.array().cast("array<string>").alias("_unchanged"),
            (F.col("_valid_from_time") if timed else F.lit(None).cast("timestamp")).alias(
                "_commit_time"
            ),
            F.lit(False).alias("_moved"),
        )
        if ops is None:
            ops = b
        else:
            ops = b.unionByName(ops.select(*_cast_like(F, b)))
    if ops is None:
        return None
    fill = [c for c in unchanged if c in columns]
    if fill:
        w = (
            Window.partitionBy(*part)
            .orderBy("_commit_lsn", "_tx_ordinal", "_sub")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        sel = []
        missing = []
        for c in columns:
            if c not in fill:
                sel.append(F.col(quoted(c)))
                continue
            is_u = F.array_contains("_unchanged", c)
            typ = ops.schema[c].dataType
            # what the key's history knows of c: a value, or that a delete ended the row;
            # an upsert with c unchanged says nothing (null: skipped by last(ignorenulls))
            known = F.when(
                ~F.col("_upsert"),
                F.struct(F.lit(None).cast(typ).alias("v"), F.lit(True).alias("gone")),
            ).when(~is_u, F.struct(F.col(quoted(c)).alias("v"), F.lit(False).alias("gone")))
            prev = F.last(known, ignorenulls=True).over(w)
            ok = prev.isNotNull() & ~prev["gone"]
            now = F.col(quoted(c))
            sel.append(F.when(F.col("_upsert") & is_u, prev["v"]).otherwise(now).alias(c))
            missing.append(F.when(F.col("_upsert") & is_u & ~ok, F.lit(c)))
        rest = [c for c in ops.columns if c not in columns]  # pgcdc's own names: no quotes
        ops = ops.select(*sel, *rest, F.array_compact(F.array(*missing)).alias("_unresolved"))
    else:
        ops = ops.withColumn("_unresolved", F.array().cast("array<string>"))
    return ops


def _check_resolved(F, name, rows, keys):
    part = [F.col(f"_k{i}").alias(k) for i, k in enumerate(keys)]
    bad = (
        rows.where(F.size("_unresolved") > 0)
        .select(F.struct(*part).alias("_key"), "_unresolved", "_commit_lsn")
        .head()
    )
    if bad is not None:
        raise ApplyError(
            f"{name}: the change at commit LSN {format_lsn(bad['_commit_lsn'])} to key "
            f"{bad['_key'].asDict()} leaves column(s) {bad['_unresolved']} unchanged (TOAST), and "
            "no earlier value of the row is known under this key (it moved here by a key "
            "change, or the state was built without it): use REPLICA IDENTITY FULL, or apply "
            "from a snapshot that holds the row"
        )


def _ops(F, changes, keys, columns, truncate):
    """Per-key operations of a table's changes after its last truncate (upserts with _sub
    1, deletes 0), in the rows _history unions with the existing state."""
    if truncate is not None:
        changes = changes.where(
            seq_after(
                F, "_commit_lsn", "_tx_ordinal", truncate["commit_lsn"], truncate["tx_ordinal"]
            )
        )
    return changes.select(
        *key_parts(keys),
        "_sub",
        "_upsert",
        *_cols(F, columns),
        SPECIAL,
        *META,
        "_unchanged",
        "_commit_time",
        "_moved",
    )


def base_rows(F, base, columns, ts, keep=()):
    """The existing state as rows of the new shape (new columns null, types of the events);
    ``keep``: more columns of ``base`` to carry along."""
    from pyspark.sql.types import MapType, StringType

    cols = []
    defaults = ts.default_values() if ts is not None else {}
    texts = []  # (column, text) of defaults a typed column cannot hold
    for c in columns:
        if c in base.columns:
            col = F.col(quoted(c))
            if ts is not None and c in ts.names:
                col = col.cast(ts.spark_type(c))
            cols.append(col.alias(c))
        else:
            # a column new to the state: rows from before it hold its DEFAULT, if it had one
            typ = ts.spark_type(c) if ts is not None and c in ts.names else StringType()
            value, text = defaults.get(c, (None, None))
            cols.append(_literal(F, value, typ).alias(c))
            if text is not None:
                texts.append((c, text))
    special = (
        F.col(SPECIAL)
        if SPECIAL in base.columns
        else F.lit(None).cast(MapType(StringType(), StringType()))
    )
    if texts:
        added = F.create_map(*[F.lit(x) for pair in texts for x in pair])
        special = F.when(special.isNull(), added).otherwise(F.map_concat(special, added))
    return base.select(
        *cols,
        special.alias(SPECIAL),
        F.col("_commit_lsn").cast("long").alias("_commit_lsn"),
        F.col("_tx_ordinal").cast("long").alias("_tx_ordinal"),
        *keep,
    )


def _literal(F, value, typ):
    """A Spark column holding ``value`` (a converted value: pgcdc.spark.types) as ``typ``."""
    from pyspark.sql.types import ArrayType, StructType

    if value is None:
        return F.lit(None).cast(typ)
    if isinstance(typ, StructType):
        return F.struct(
            *[_literal(F, value.get(f.name), f.dataType).alias(f.name) for f in typ.fields]
        )
    if isinstance(typ, ArrayType):
        return F.array(*[_literal(F, v, typ.elementType) for v in value]).cast(typ)
    return F.lit(value).cast(typ)


def _cols(F, columns) -> list:
    """Spark columns of the table's columns by name (PostgreSQL's: quoted, see :mod:`.names`)."""
    return [F.col(quoted(c)) for c in columns]


def _cast_like(F, like) -> list:
    """Columns of a DataFrame with ``like``'s columns, cast to ``like``'s types (for a union)."""
    return [F.col(quoted(f.name)).cast(f.dataType).alias(f.name) for f in like.schema.fields]


def _lsn_finder(F, ce, name: str):
    """(op, LSN text) of a table's change, by (commit_lsn, tx_ordinal), for an error
    message: the operations do not hold them, so this decodes the captures again."""

    def lsn_of(commit_lsn: int, tx_ordinal: int) -> tuple[str, str]:
        row = (
            ce.table(name)
            .where((F.col("commit_lsn") == commit_lsn) & (F.col("tx_ordinal") == tx_ordinal))
            .select("op", "source.lsn")
            .head()
        )
        return row["op"], row["lsn"]

    return lsn_of
