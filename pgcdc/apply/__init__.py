"""Apply change events to Delta Lake tables: each table's current rows (SCD1) or its history
(SCD2), at ``OUT/<schema>.<table>/`` (``OUT`` a local path or ``s3://bucket/prefix``; the
key is ``schema.table`` with odd characters escaped: :mod:`pgcdc.tablekey`).

A run (:func:`pgcdc.apply.run.apply_changes`, the one entry point) goes through five steps,
each once: plan, operations, write, commit, state.

- **plan** (:mod:`pgcdc.apply.state`): the run summary ``OUT/_pgcdc_state.json``, the
  snapshot to load tables from (its contract is there), the source the captures come from
  (one server, database and slot per ``OUT``), then the change events of the captures from
  the summary's applied position (:mod:`pgcdc.spark.changes`), each table's key and its own
  applied position;
- **operations** (:mod:`pgcdc.apply.ops`): the changes as flat per-key operations (an upsert
  or a delete), with each table's last change, last truncate and unchanged TOAST columns
  gathered on the way; by Spark's tasks, or in the driver for a small run;
- **write**: each changed table's new data files, under ``pgcdc-<run>/`` in the table; by the
  driver with pyarrow where that is plainly the same result (:mod:`pgcdc.apply.driver`), else
  by Spark from the SCD frames (:mod:`pgcdc.apply.scd`, where the rules of SCD1, keyless
  tables, truncates, unchanged TOAST columns and SCD2 are). Keyed tables rewrite only the
  files that hold a changed key; a truncate, a keyless table or a changed column type
  rewrites the whole table;
- **commit** (:mod:`pgcdc.apply.delta`): one Delta version per changed table, with delta-rs,
  adding the new files and removing those they replace; it carries the table's applied
  position (the application transaction ``pgcdc-apply``, whose version is the last applied
  commit LSN) and ``pgcdc.commit_lsn``, ``pgcdc.tx_ordinal``, ``pgcdc.run`` and
  ``pgcdc.source`` (the PostgreSQL table's schema, name and OID) in its metadata;
- **state**: the summary, replaced once every table committed.

Positions: the truth is each table's own (its last commit); the summary's ``applied_lsn``
says every table is applied at least that far, so a run reads the captures from there and
applies to each table only the transactions after its own. Re-running over the same
captures changes nothing; a run killed at any point leaves every table at a consistent
version (files never committed are in no version); killed between two tables' commits, the
next run skips what the tables ahead hold and applies the rest, so they converge. Changes at
or before a table's snapshot point are in the snapshot, and not applied again.

Columns: the table's columns as of its latest Relation message, typed by
:mod:`pgcdc.spark.types`, a name Delta does not take stored percent-encoded
(:mod:`pgcdc.spark.names`), then ``_pg_text``, ``_commit_lsn`` and ``_tx_ordinal`` (and the
SCD2 columns). Timestamps are INT64 microseconds.

Beside a run: :mod:`pgcdc.apply.reshape` brings a table to new columns in one commit (what
``pgcdc sync`` does on a column's change with no row changed), :mod:`pgcdc.apply.vacuum`
deletes what a table no longer needs. The layout of version directories and links of pgcdc
0.2 (``format="parquet"``) was removed: Delta is the one layout.

The full description, with the summary's fields: docs/apply.md. Importing this package needs
neither pyspark nor pyarrow.
"""
