"""One SparkSession per test run for the Spark tests (skipped when pyspark is not installed).

Test modules import the fixture: `from tests.fix_spark import spark  # noqa: F401`.
"""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pgcdc.runtime.spark import local_spark_session  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    session = local_spark_session("codec-tests", cores=2)
    yield session
    session.stop()


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
