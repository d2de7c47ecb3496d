"""The capture's read loop in C (:mod:`pgcdc.runtime._copyread`), given libpq's own functions.

psycopg has no call that takes every CopyData message libpq holds at once, and a Python loop
over them took about 2 microseconds a message. The C loop calls ``PQgetCopyData`` itself, so it
needs the very libpq psycopg's connection lives in: the one psycopg loaded, found among the
process's mapped files, and checked on the connection (its backend PID and socket through that
library equal psycopg's). Anything else (no accelerator, another platform, a mismatch) leaves
the Python loop, which reads the same records.
"""

from __future__ import annotations

import functools
import os

try:
    from pgcdc.runtime import _copyread
except ImportError:  # built without a C compiler: the Python loop
    _copyread = None

__all__ = ["c_records"]

#: tests turn the C loop off to compare the two
ENABLED = os.environ.get("PGCDC_COPYREAD", "c") != "python"


@functools.lru_cache(maxsize=1)
def _libpq():
    """(PQgetCopyData, PQfreemem, PQbackendPID, PQsocket) of the libpq psycopg uses, or None."""
    import ctypes

    from psycopg import pq

    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(None, 5) for line in maps]
        paths = {f[5].strip() for f in fields if len(f) == 6}
    except OSError:
        return None
    libs = sorted(p for p in paths if "/libpq" in p and ".so" in p)
    if pq.__impl__ == "binary":  # psycopg_binary bundles its own
        libs = [p for p in libs if "psycopg" in p]
    else:
        libs = [p for p in libs if "psycopg" not in p]
    if len(libs) != 1:
        return None
    try:
        lib = ctypes.CDLL(libs[0])
        get, free = lib.PQgetCopyData, lib.PQfreemem
        pid, sock = lib.PQbackendPID, lib.PQsocket
    except (OSError, AttributeError):
        return None
    for f in (pid, sock):
        f.argtypes, f.restype = [ctypes.c_void_p], ctypes.c_int
    addr = ctypes.cast(get, ctypes.c_void_p).value, ctypes.cast(free, ctypes.c_void_p).value
    return addr, pid, sock


def c_records(pgconn):
    """``records(out, limit, version, flags, python)`` of :mod:`pgcdc.runtime._copyread` bound
    to psycopg's ``pgconn``, or None when the C loop cannot be used for it."""
    if not ENABLED:
        return None
    if _copyread is None:
        return None
    found = _libpq()
    ptr = getattr(pgconn, "pgconn_ptr", None)
    if found is None or not ptr:
        return None
    (get, free), pid, sock = found
    if pid(ptr) != pgconn.backend_pid or sock(ptr) != pgconn.socket:
        return None
    return functools.partial(_copyread.records, get, free, ptr)
