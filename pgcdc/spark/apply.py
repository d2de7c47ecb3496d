"""Apply change events to Parquet: the current state of each table (SCD1), or its history
(SCD2), under ``OUT/<schema>.<table>/``.

Snapshot contract (what ``--snapshot DIR`` / ``apply_changes(snapshot=DIR)`` reads; the initial
snapshot writer follows it):

- ``DIR/<schema>.<table>/`` is a plain Parquet dataset (``spark.read.parquet`` of it works):
  the table's columns under their own names, typed by :func:`pgcdc.spark.types.spark_type`
  (values converted by :func:`pgcdc.spark.types.value_converter`), plus
- ``_pg_text`` (``map<string,string>``, :data:`pgcdc.spark.types.SPECIAL_COLUMN`, optional):
  column name -> PostgreSQL text of values the typed column holds as null (infinity, NaN, ...);
- ``_commit_lsn`` (LongType): the slot's consistent point, the same on every row;
- ``_tx_ordinal`` (LongType): 0 on every row (a snapshot row is op 'r').
- ``DIR/_snapshot.json`` (optional): ``{"consistent_point": "16/B374D848", "keys":
  {"<schema>.<table>": ["id", ...]}}``; keys are needed only for tables that have snapshot
  rows but whose Relation messages never appear in the captures.

Change events at or before (``_commit_lsn``, 0) of a table's snapshot are not applied to it:
the snapshot already contains them.
"""
