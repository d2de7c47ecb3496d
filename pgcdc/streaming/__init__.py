"""Spark Structured Streaming sources.

- :mod:`pgcdc.streaming.slot`: ``format("pgcdc")``, a replication slot: the driver's offsets,
  planning and slot advances;
- :mod:`pgcdc.streaming.read`: its tasks: a micro-batch's events streamed from the slot;
- :mod:`pgcdc.streaming.event_rows`: the event schema, and events made Arrow batches of it;
- :mod:`pgcdc.streaming.typed`: ``option("table", ...)``, one table's events with typed columns;
- :mod:`pgcdc.streaming.held`: a walsender stream held in a task's worker for the next batch,
  and what the driver and the tasks share about the slot (:class:`SlotError`);
- :mod:`pgcdc.streaming.json_runs`: runs of changes rendered from the server's text, in Arrow;
- :mod:`pgcdc.streaming.directory`: ``format("pgcdc_capture")``, a capture directory.

Importing this package needs neither pyspark nor pyarrow.
"""

from pgcdc.streaming.held import SlotError

__all__ = ["SlotError"]
