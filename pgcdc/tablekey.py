"""A table's name in the lake and in pgcdc's state: one string per (schema, table) that never
collides, that a person can read, and that every file system, object store, Hadoop path and
Spark glob takes as it is.

A PostgreSQL identifier may hold any character but NUL, so ``schema.table`` alone collides:
``public."weird.name"`` and ``"public.weird".name`` are both ``public.weird.name``. The key
escapes, in each part, every character that is not a letter, a digit (of any script), ``_`` or
``-`` as ``~`` and two hex digits per UTF-8 byte, then joins the parts with the one unescaped
dot. Ordinary names are unchanged (``public.orders``); ``public."weird.name"`` is
``public.weird~2Ename``, ``"public.weird".name`` is ``public~2Eweird.name``, ``"my table"``
is ``my~20table``. ``~`` rather than ``%``: object-store URLs decode ``%2E`` back into a dot.

A part's leading ``_`` is escaped too (``_staging.t`` is ``~5Fstaging.t``): names beginning
with ``_`` or ``.`` are pgcdc's own files beside the tables, and Spark and Hadoop hide them.
A key longer than :data:`MAX_BYTES` (two 63-byte names, mostly escaped) is cut and ends with a
hash of the whole; :func:`split_key` then answers None, and the table's metadata
(``pgcdc.schema``, ``pgcdc.table``) says the names.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

__all__ = ["MAX_BYTES", "split_key", "table_key"]

ESCAPE = "~"
# a file or object name: 255 bytes on most file systems; room for a suffix pgcdc adds
MAX_BYTES = 200


def _escape(part: str) -> str:
    out = []
    for i, ch in enumerate(part):
        if (ch.isalnum() or ch in "_-") and not (i == 0 and ch == "_"):
            out.append(ch)
        else:
            out.extend(f"{ESCAPE}{b:02X}" for b in ch.encode())
    return "".join(out)


def _unescape(part: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(part):
        if part[i] == ESCAPE:
            raw.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            raw += part[i].encode()
            i += 1
    return raw.decode()


@lru_cache(maxsize=1 << 16)  # asked per run of changes on hot paths
def table_key(schema: str, table: str) -> str:
    """The table's key: its directory under an output root, its name in state files."""
    key = f"{_escape(schema)}.{_escape(table)}" if schema else _escape(table)
    if len(key.encode()) <= MAX_BYTES:
        return key
    digest = hashlib.sha256(f"{schema}\0{table}".encode()).hexdigest()[:16]
    head = key.encode()[: MAX_BYTES - 18].decode(errors="ignore")
    cut = head.rfind(ESCAPE, len(head) - 2)  # not inside an escape
    head = head[:cut] if cut >= 0 else head
    return f"{head}{ESCAPE}{ESCAPE}{digest}"


def split_key(key: str) -> tuple[str, str] | None:
    """(schema, table) of a key :func:`table_key` made; None for a cut key or a string that
    is none (a key of an older pgcdc, when it held a character escaped now)."""
    if ESCAPE + ESCAPE in key or key.count(".") != 1:
        return None
    schema, _, table = key.partition(".")
    try:
        names = _unescape(schema), _unescape(table)
    except (ValueError, UnicodeDecodeError):
        return None
    return names if table_key(*names) == key else None
