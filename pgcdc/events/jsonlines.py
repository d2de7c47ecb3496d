"""Change events as JSON Lines, with Debezium's field names (what ``pgcdc changes`` prints).

One line per event::

    {"op":"u","before":{"id":1},"after":{"id":2,"note":"x"},"unchanged":[],
     "source":{"lsn":"0/1A2B3C8","commit_lsn":"0/1A2B4F0","tx_ordinal":1,
               "commit_time":"2024-05-06T07:08:09.123456+00:00","xid":750,"origin":null,
               "schema":"public","table":"t"}}

Values are rendered as PostgreSQL's ``to_jsonb(row)`` renders them (see ``pgcdc.values``).
``unchanged`` lists unchanged TOAST columns that are left out of ``after``. A truncate gives
one ``t`` event per table (with ``"truncate": {"cascade": .., "restart_identity": ..}``); a
logical message is ``m`` with ``"message": {"prefix", "content" (\\x hex), "transactional"}``.
Transaction events are ``{"status": "BEGIN"|"END", "id": xid, ...}`` lines. With
``columns=True`` each change line also carries its table's columns, with each type's name
(built-in types by name, others as the catalog or their Type message names them) and, for a
column added with a DEFAULT after rows existed, ``"default"``: the text of the value those
rows hold (PostgreSQL's attmissingval) though no change carries it. An event with ``errors``
(lenient reading) carries them as a list of strings.
"""

from __future__ import annotations

import fnmatch

import orjson

import pgoutput_codec as pgc

from pgcdc.tablekey import table_key
from pgcdc.values import dumps_images

_LOW = 0xFFFFFFFF


class EventRenderer:
    """Event -> one JSON line (bytes, no newline)."""

    def __init__(self, *, columns: bool = False, catalog=None):
        self._time_cache = (None, b"null")
        self._source_cache: tuple = (None, b"", b"")
        # columns: each change line also describes its table's columns (name, type name as
        # the stream described it, type OID, key), rendered once per relation version
        self._columns: dict[int, tuple[object, bytes]] | None = {} if columns else None
        # a column added with a DEFAULT: rows written before hold it without any change
        # saying so (the capture's catalog records it); "default" on the column says it
        self._missing = catalog.missing if catalog is not None else {}

    def columns(self, rel) -> bytes:
        """``[{"name", "type", "oid", "key"}, ...]`` of a relation version."""
        cached = self._columns.get(id(rel))
        if cached is not None and cached[0] is rel:
            return cached[1]
        keys = set(rel.key_indexes)
        missing = self._missing.get(rel.oid, {})
        described = []
        for i, (n, t, o) in enumerate(zip(rel.names, rel.type_names, rel.type_oids)):
            column = {"name": n, "type": t, "oid": o, "key": i in keys}
            if n in missing:
                column["default"] = missing[n]  # its text, as the server holds it
            described.append(column)
        text = orjson.dumps(described)
        self._columns[id(rel)] = (rel, text)
        return text

    def _time(self, micros) -> bytes:
        cached = self._time_cache
        if cached[0] == micros:
            return cached[1]
        text = b"null" if micros is None else orjson.dumps(pgc.pg_datetime(micros).isoformat())
        self._time_cache = (micros, text)
        return text

    def source(self, ev) -> bytes:
        # Only lsn and tx_ordinal change from one event of a transaction to the next: the
        # rest is rendered once per (transaction, relation) and reused.
        key = (ev.commit_lsn, ev.commit_time, ev.xid, ev.origin, ev.relation)
        cached = self._source_cache
        if cached[0] != key:
            rel = ev.relation
            commit_lsn = ev.commit_lsn
            middle = b'","commit_lsn":"%X/%X","tx_ordinal":' % (commit_lsn >> 32, commit_lsn & _LOW)
            tail = b"".join(
                (
                    b',"commit_time":',
                    self._time(ev.commit_time),
                    b',"xid":',
                    b"null" if ev.xid is None else str(ev.xid).encode(),
                    b',"origin":',
                    orjson.dumps(ev.origin),
                    b',"schema":',
                    b"null" if rel is None else orjson.dumps(rel.schema),
                    b',"table":',
                    b"null" if rel is None else orjson.dumps(rel.table),
                    b"}",
                )
            )
            cached = self._source_cache = (key, middle, tail)
        lsn = ev.lsn
        return b'{"lsn":"%X/%X%s%d%s' % (lsn >> 32, lsn & _LOW, cached[1], ev.tx_ordinal, cached[2])

    def render(self, ev) -> bytes:
        op = ev.op
        rel = ev.relation
        if op in ("c", "u", "d"):
            before, after = dumps_images(ev)
            parts = [
                b'{"op":"',
                op.encode(),
                b'","before":',
                b"null" if before is None else before,
                b',"after":',
                b"null" if after is None else after,
                b',"unchanged":',
                orjson.dumps(list(ev.unchanged)) if ev.unchanged else b"[]",
            ]
        elif op == "t":
            cascade, restart = ev.detail
            parts = [
                b'{"op":"t","before":null,"after":null,"truncate":',
                orjson.dumps({"cascade": cascade, "restart_identity": restart}),
            ]
        elif op == "m":
            prefix, content, transactional = ev.detail
            message = {
                "prefix": prefix,
                "content": "\\x" + bytes(content).hex(),
                "transactional": transactional,
            }
            parts = [b'{"op":"m","before":null,"after":null,"message":', orjson.dumps(message)]
        else:  # begin / end
            status = b"BEGIN" if op == "begin" else b"END"
            parts = [b'{"status":"', status, b'","id":', orjson.dumps(ev.xid)]
            if op == "end":
                parts += [b',"event_count":', str(ev.detail[0]).encode()]
        if self._columns is not None and rel is not None:
            parts += [b',"columns":', self.columns(rel)]
        if ev.errors:
            parts += [b',"errors":', orjson.dumps([str(e) for e in ev.errors])]
        parts += [b',"source":', self.source(ev), b"}"]
        return b"".join(parts)


def table_filter(patterns):
    """A predicate on relations: does its ``table`` or ``schema.table`` match one of the
    shell-glob ``patterns``? None when there are no patterns (everything is kept)."""
    if not patterns:
        return None
    cache: dict[int, bool] = {}

    def keep(rel) -> bool:
        hit = cache.get(id(rel))
        if hit is None:
            hit = table_matches(patterns, rel.schema, rel.table)
            cache[id(rel)] = hit
        return hit

    return keep


def table_matches(patterns, schema: str, table: str) -> bool:
    """``--table`` semantics: a shell glob on ``schema.table``, on ``table``, or on the
    table's key (:func:`pgcdc.tablekey.table_key`, its directory's name)."""
    names = (table, f"{schema}.{table}", table_key(schema, table))
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)
