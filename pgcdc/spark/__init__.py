"""pgcdc on Spark: typed change-event DataFrames, applying them to Parquet state, the initial
snapshot and the streaming source.

- :mod:`pgcdc.spark.types`: PostgreSQL types -> Spark types, loaded values -> Spark values.
- :mod:`pgcdc.spark.changes`: change events of capture files as one DataFrame per table.
- :mod:`pgcdc.spark.apply`: ``apply_changes``, the current state (SCD1) or history (SCD2).

Importing this package needs neither pyspark nor pyarrow; its modules import them when used.
"""
