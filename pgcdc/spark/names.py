"""Column names from PostgreSQL to Spark and to the files of Delta Lake tables.

A quoted PostgreSQL identifier holds any character (but NUL) in up to 63 bytes, and ``"Id"``
and ``id`` are two columns. Two places cannot take such a name as it is:

- **Spark** parses a name given as an expression (``F.col``, a string in ``select``): a dot
  reaches into a struct, a backtick quotes. :func:`quoted` makes any name one identifier.
  Spark also resolves names regardless of case by default, so a table with ``"Id"`` and
  ``id`` is ambiguous to it: pgcdc's sessions set ``spark.sql.caseSensitive``
  (:func:`pgcdc.runtime.spark.local_session.session_conf`, and ``apply_changes`` on any session),
  as PostgreSQL's names are.
- **Delta Lake** without column mapping (delta-rs writes none) takes a table's names without
  regard to case: delta-rs refuses two names that differ only in case ("Duplicate field name
  (case-insensitive)", measured with deltalake 1.6), and Delta's protocol keeps the
  characters of :data:`DELTA_REFUSED` out of column names (Delta Lake's Spark writer refuses
  them; delta-rs and DuckDB's delta extension took every one of them, measured).

So a table's data files name a column by its *stored name* (:func:`stored_names`): its
PostgreSQL name with the characters of :data:`DELTA_REFUSED` and ``%`` percent-encoded (the
bytes of their UTF-8, ``%XX``), and, where that is equal but for case to a name the table
already has, with its letters encoded too, one at a time from the first, until it is not.
Percent-decoding a stored name (``urllib.parse.unquote``) gives the PostgreSQL name back, and
each renamed column also says it in its Delta schema field's metadata (:data:`FIELD_KEY`).
Stored names are kept from version to version: a column keeps the name the table gave it.
"""

from __future__ import annotations

__all__ = [
    "DELTA_REFUSED",
    "FIELD_KEY",
    "pg_names",
    "quoted",
    "stored_names",
]

# the characters Delta Lake keeps out of column names without column mapping
DELTA_REFUSED = " ,;{}()\n\t="
_ENCODED = set(DELTA_REFUSED) | {"%"}  # '%' too, so that every stored name decodes as one
FIELD_KEY = "pgcdc.name"  # a renamed column's PostgreSQL name, in its schema field's metadata


def quoted(name: str) -> str:
    """``name`` as one Spark SQL identifier, whatever it holds (dots, spaces, backticks)."""
    return "`" + name.replace("`", "``") + "`"


def _encoded(name: str, positions: set) -> str:
    return "".join(
        "".join(f"%{b:02X}" for b in ch.encode()) if i in positions or ch in _ENCODED else ch
        for i, ch in enumerate(name)
    )


def _stored_name(name: str, used: set) -> str:
    """``name``'s stored name: its characters of _ENCODED encoded, and its letters one by one
    while it is equal but for case to one of ``used`` (lowercase names)."""
    letters = [i for i, ch in enumerate(name) if ch.lower() != ch.upper()]
    for n in range(len(letters) + 1):
        out = _encoded(name, set(letters[:n]))
        if out.lower() not in used:
            return out
    # every letter encoded: only the encoding of another name can be equal to it, and
    # encodings of different names differ
    raise AssertionError(f"no stored name for column {name!r}")


def stored_names(columns, kept: dict | None = None, reserved=()) -> dict:
    """{PostgreSQL name: stored name} of ``columns``: those of ``kept`` (the table's
    {PostgreSQL name: stored name} so far) as they were, the others chosen in order apart
    from them and from ``reserved`` (pgcdc's own columns), regardless of case."""
    kept = kept or {}
    out = {c: kept[c] for c in columns if c in kept}
    used = {s.lower() for s in out.values()} | {r.lower() for r in reserved}
    for c in columns:
        if c not in out:
            out[c] = _stored_name(c, used)
            used.add(out[c].lower())
    return out


def pg_names(fields) -> dict:
    """{stored name: PostgreSQL name} of a schema's fields (Arrow's or delta-rs's: ``name``
    and ``metadata``), by the name each renamed field records (:data:`FIELD_KEY`)."""
    out = {}
    for f in fields:
        meta = f.metadata or {}
        name = meta.get(FIELD_KEY) or meta.get(FIELD_KEY.encode())
        out[f.name] = name.decode() if isinstance(name, bytes) else (name or f.name)
    return out
