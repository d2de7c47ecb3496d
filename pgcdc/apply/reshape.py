"""A Delta table brought to its table's new columns in one commit, without a change of it:
what ``pgcdc sync`` does when the server's catalog says a column was added with a constant
DEFAULT (or none), dropped or widened, and no change of the table has come since
(:mod:`pgcdc.sync.drift`).

The rows are those apply would write at the table's next change, whose Relation message
brings the same columns (:func:`pgcdc.apply.scd.base_rows`): a column added holds its
``attmissingval`` (the catalog's ``missing``) or null, a dropped one goes, a widened one takes
its new type, in the columns' order of the Relation message. Under SCD2 the current rows are
those; the closed versions hold null in a column added since and lose a dropped one, as
apply's own run does. The table's applied position (its ``pgcdc-apply`` transaction) is
kept: no change is applied here. One commit replaces every file: a reader sees the table
before or after, and time travel keeps the version before.
"""

from __future__ import annotations

from pgcdc.apply import delta
from pgcdc.apply.scd import SCD2_META, base_rows, state_columns

__all__ = ["reshape"]


def reshape(spark, uri: str, ts, scd: int, metadata: dict) -> int:
    """Rewrite the Delta table at ``uri`` with the columns of ``ts`` (a
    :class:`pgcdc.spark.units.TableSchema` whose latest version is the table's columns now);
    ``metadata``: the commit's. Returns the new version."""
    from pyspark.sql import functions as F  # lazy: pyspark

    base = delta.read_rows(spark, uri)
    columns = list(ts.latest)
    if scd == 2:
        meta = (*SCD2_META, "_is_current")
        state = base_rows(F, base.where(F.col("_is_current")), columns, ts, meta)
        closed = base.where(~F.col("_is_current"))
        have = set(closed.columns)
        closed = closed.select(*[
            (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in state.schema.fields
        ])  # fmt: skip
        state = state.unionByName(closed)
    else:
        state = base_rows(F, base, columns, ts)
    state = state.select(*state_columns(columns, scd))
    run = delta.run_id()
    written = delta.write_files(state, uri, delta.attempt_dir(run))
    return delta.commit(uri, written, delta.arrow_schema(state.schema), overwrite=True,
                        app_version=delta.position(uri), metadata={**metadata, "pgcdc.run": run},
                        log_cleanup=False)  # fmt: skip
