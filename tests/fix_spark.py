"""pytest plugin (tests/conftest.py registers it): one local SparkSession per test process
(per xdist worker), started by the first test that asks for ``spark`` and stopped at the end.

pyspark is imported only then, so that the fast tier never loads it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pgcdc.runtime.spark import local_spark_session

    session = local_spark_session("codec-tests", cores=2)
    yield session
    session.stop()
