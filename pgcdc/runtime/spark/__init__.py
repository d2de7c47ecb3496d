"""The Spark side of every generated codec: decode_messages, the row mapping, local sessions.

A generated ``<package>.spark`` module binds one :class:`SparkCodec` to its codec and imports
the rest from here. The parts, each importable alone:

- ``codec``: :class:`SparkCodec` (decode_messages, with_context, message_to_row / row_to_message);
- ``plan``: each struct's columns and their roles, compiled from the generated table;
- ``batches``: the mapInArrow engine (the codec's own decoder over Arrow batches), which
  builds its columns with ``buffers`` (the C accelerator's Arrow buffers), ``columns`` (its
  per-column lists) or ``arrow`` (decoded objects);
- ``jvm``: the JVM engine (the generated Java decoder over the hand-written Java runtime in
  ``java/``, compiled once with javac);
- ``rows``: the same mapping as ``arrow`` in plain Python, one message at a time;
- ``session`` and ``quiet``: quiet local SparkSessions;
- ``pyworker``: the interpreter those sessions give Spark's Python processes
  (``pgcdc-spark-python``: pyspark imported compiled, not from Spark's zip).

Importing this package needs neither pyspark nor pyarrow.
"""

from __future__ import annotations

from pgcdc.runtime.spark.codec import ERROR_COLUMN, MESSAGE_COLUMN, MODES, SparkCodec
from pgcdc.runtime.spark.local_session import local_spark_conf, local_spark_session

__all__ = [
    "ERROR_COLUMN",
    "MESSAGE_COLUMN",
    "MODES",
    "SparkCodec",
    "local_spark_conf",
    "local_spark_session",
]
