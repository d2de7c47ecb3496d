"""A Spark start that prints nothing unless something is wrong.

Spark's JVM logs warnings through its default log4j profile and announces its log level on
every start; the JDK adds a notice for the incubator module Spark 4 loads. The first two are
set by :data:`LOG4J_PROPERTIES` (pass :func:`driver_java_options` when the session is built);
the JDK's notice cannot be turned off, so :func:`quiet_jvm_start` gives the JVM a stderr that
drops that one line and forwards everything else.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from pathlib import Path

LOG4J_PROPERTIES = Path(__file__).with_name("log4j2-quiet.properties")

# Lines the JVM prints at start whatever its logging says.
_NOISE = (b"WARNING: Using incubator modules: jdk.incubator.vector",)


def driver_java_options() -> str:
    return f"-Dlog4j2.configurationFile={LOG4J_PROPERTIES.as_uri()}"


def _forward(read_fd: int, write) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            out = b"".join(line + b"\n" for line in lines if line.rstrip() not in _NOISE)
            if out:
                write(out)
        if pending and pending.rstrip() not in _NOISE:
            write(pending)


@contextlib.contextmanager
def quiet_jvm_start(sink=None):
    """Start Spark inside this block: the JVM (and the Python workers it starts) inherit a
    stderr that filters the JDK's start-up notice; this process's stderr is restored after.
    ``sink``: a callable the JVM's lines go to (bytes) rather than this process's stderr."""
    try:
        sys.stderr.flush()
        original = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreter): nothing to filter
        yield
        return
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    write = sink or functools.partial(os.write, original)
    threading.Thread(target=_forward, args=(read_fd, write), daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # `original` stays open: the forwarder writes the JVM's lines to it
