"""Spark's collected values made comparable with the codec's rows."""

from __future__ import annotations

import datetime as dt


def normalize(value):
    """A collected value in the form message_to_row produces, for comparing the two.

    Rows become dicts, bytearray becomes bytes, and naive datetimes (PySpark returns
    TimestampType in the Python process's local time zone) become aware UTC datetimes.
    """
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=False)
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc) if value.tzinfo is None else value
    return value
