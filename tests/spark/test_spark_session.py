"""The driver JVM a local session starts (pgcdc.runtime.spark.local_session.driver_jvm_options): on
two cores or fewer it runs the serial garbage collector, as the JVM itself reports."""

from __future__ import annotations

import os

from pgcdc.runtime.spark.quiet import driver_java_options
from pgcdc.runtime.spark.local_session import driver_jvm_options


def test_the_serial_collector_only_on_two_cores_or_fewer():
    quiet = driver_java_options()
    for cpus in (1, 2):
        assert driver_jvm_options(cpus).split() == [*quiet.split(), "-XX:+UseSerialGC"]
    for cpus in (3, 64):
        assert driver_jvm_options(cpus) == quiet  # the JVM's own choice


def test_a_local_sessions_jvm_runs_the_collector_chosen(spark):  # noqa: F811
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    names = {bean.getName() for bean in beans.getGarbageCollectorMXBeans()}
    if (os.cpu_count() or 1) <= 2:
        assert names == {"Copy", "MarkSweepCompact"}, names  # the serial collector's
    else:
        assert "G1 Young Generation" in names, names
