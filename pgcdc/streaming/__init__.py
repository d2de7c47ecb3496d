"""Spark Structured Streaming sources.

- :mod:`pgcdc.streaming.slot`: ``format("pgcdc")``, a replication slot read by Spark tasks;
- :mod:`pgcdc.streaming.typed`: ``option("table", ...)``, one table's events with typed columns;
- :mod:`pgcdc.streaming.held`: a walsender stream held in a task's worker for the next batch;
- :mod:`pgcdc.streaming.json_runs`: runs of changes rendered from the server's text, in Arrow;
- :mod:`pgcdc.streaming.directory`: ``format("pgcdc_capture")``, a capture directory.

Importing this package needs neither pyspark nor pyarrow.
"""
