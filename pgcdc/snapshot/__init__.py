"""The initial snapshot of a slot's published tables.

- :mod:`pgcdc.snapshot.server`: the PostgreSQL side (published tables, ranges, COPY);
- :mod:`pgcdc.snapshot.job`: the snapshot on Spark, into Parquet and Delta tables;
- :mod:`pgcdc.snapshot.binary_copy`: a range read in binary COPY and typed in C, into Arrow.

Importing this package needs neither pyspark nor pyarrow.
"""
