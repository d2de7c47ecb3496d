"""pgcdc on Spark: typed change-event DataFrames, applying them to Parquet state, the initial
snapshot and the streaming source.

- :mod:`pgcdc.spark.types`: PostgreSQL types -> Spark types, loaded values -> Spark values.
- :mod:`pgcdc.spark.changes`: change events of capture files as one DataFrame per table,
  over :mod:`pgcdc.spark.units` (the summary of each file and the plan of the units) and
  :mod:`pgcdc.spark.table_batches` (a unit's events as Arrow batches per table).
- :mod:`pgcdc.apply.run`: ``apply_changes``, the current state (SCD1) or history (SCD2).
- :mod:`pgcdc.spark.ship`: the packages zipped for executors that do not have them.

Importing this package needs neither pyspark nor pyarrow; its modules import them when used.
"""

import zipimport as _zipimport

if isinstance(__loader__, _zipimport.zipimporter):
    # shipped to an executor in a zip (pgcdc.spark.ship): the codecs' compiled accelerators
    # are in the zip too, and only an extracted copy of them can be loaded
    from pgcdc.spark.ship import install_zip_extension_finder

    install_zip_extension_finder()
