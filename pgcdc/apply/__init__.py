"""Apply change events to tables: each table's current rows (SCD1) or its history (SCD2).

- :mod:`pgcdc.apply.run`: :func:`~pgcdc.apply.run.apply_changes`, the one entry point;
- :mod:`pgcdc.apply.ops`: the flat per-key operations the event tasks build;
- :mod:`pgcdc.apply.driver`: a small run applied in the driver, without a Spark job;
- :mod:`pgcdc.apply.delta`: Delta tables written by Spark tasks, committed with delta-rs;
- :mod:`pgcdc.apply.reshape`: a Delta table brought to new columns in one commit;
- :mod:`pgcdc.apply.vacuum`: what a Delta table no longer needs, deleted.

Importing this package needs neither pyspark nor pyarrow.
"""
