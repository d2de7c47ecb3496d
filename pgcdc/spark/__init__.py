"""Spark plumbing: change events of capture files as Spark DataFrames, and what every
Spark-side product of pgcdc (:mod:`pgcdc.apply`, :mod:`pgcdc.snapshot`,
:mod:`pgcdc.streaming`) shares.

- :mod:`pgcdc.spark.changes`: change events of capture files as one DataFrame per table,
  over :mod:`pgcdc.spark.units` (the summary of each file and the plan of the units) and
  :mod:`pgcdc.spark.table_batches` (a unit's events as Arrow batches per table).
- :mod:`pgcdc.spark.types`: PostgreSQL types -> Spark types, loaded values -> Spark values;
  :mod:`pgcdc.spark.text_arrow`: a column of PostgreSQL text made an Arrow array by Arrow's
  casts.
- :mod:`pgcdc.spark.names`: column names from PostgreSQL to Spark and to Delta's files.
- :mod:`pgcdc.spark.ship`: the packages zipped for executors that do not have them.
- :mod:`pgcdc.spark.session`: the SparkSession ``pgcdc apply`` and ``pgcdc sync`` run on, the
  settings apply needs, a quiet stop; :mod:`pgcdc.spark.later`: a session that starts in the
  background.

Importing this package needs neither pyspark nor pyarrow; its modules import them when used.
"""

import zipimport as _zipimport

if isinstance(__loader__, _zipimport.zipimporter):
    # shipped to an executor in a zip (pgcdc.spark.ship): the codecs' compiled accelerators
    # are in the zip too, and only an extracted copy of them can be loaded
    from pgcdc.spark.ship import install_zip_extension_finder

    install_zip_extension_finder()
