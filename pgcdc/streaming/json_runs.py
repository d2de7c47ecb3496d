"""The JSON source's rows of a run of changes rendered from the server's text, in Arrow.

The ``format("pgcdc")`` source without ``table`` gives each change's row as JSON text
(``before_json``/``after_json``). A run of one table's Inserts, Updates or Deletes that the
accelerator decoded (:class:`pgcdc.events.reader.RawRun`) holds each value as the text the server
sent. For the common types that text is already the value's JSON, or close: an integer's or
a numeric's digits, a string to quote, a timestamp to put a ``T`` in. Rendered here a column
at a time, no value is loaded in Python: the read's Python time on a 200,000-insert burst
falls by about half, the time the worker now leaves to Spark's JVM and the server on two
cores.

Every value must take that way, or the whole run is rendered by the exact path (its events
loaded, then :func:`pgcdc.streaming.event_rows.events_batch`), which these rows equal byte for byte:
``tests/streaming/test_streaming_source_rows.py`` checks both on the same runs.
"""

from __future__ import annotations

from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US

# type OIDs whose text is rendered here; any other column sends its run to the exact path
_INTS = {20, 21, 23}  # int8, int2, int4
_NUMERIC = 1700
_STRINGS = {25, 1042, 1043, 19, 2950}  # text, bpchar, varchar, name, uuid
_BOOL = 16
_FLOATS = {700, 701}
_TIMESTAMPTZ, _TIMESTAMP, _DATE = 1184, 1114, 1082
HANDLED = _INTS | _STRINGS | _FLOATS | {_NUMERIC, _BOOL, _TIMESTAMPTZ, _TIMESTAMP, _DATE}

_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?"  # years 1000-9999, as datetime writes
_ESCAPED = r'["\\\x00-\x1f]'  # what orjson escapes in a string: " \ and C0 controls


def quoted_strings(texts, pa, pc):
    """Each string of ``texts`` (an Arrow string array) as orjson writes it: quoted, and
    those holding a character orjson escapes dumped by orjson one by one."""
    quoted = pc.binary_join_element_wise('"', texts, '"', "")
    escaped = pc.match_substring_regex(texts, _ESCAPED)
    if pc.any(escaped).as_py():
        import orjson

        flags = escaped.to_pylist()
        dumped = [orjson.dumps(v).decode() for v, e in zip(texts.to_pylist(), flags) if e]
        quoted = pc.replace_with_mask(quoted, escaped.fill_null(False), pa.array(dumped))
    return quoted


class _Exact(Exception):
    """A value this module does not render as the exact path would."""


def run_batch(run, schema):
    """The RecordBatch of ``schema`` (the source's JSON rows) for ``run``, a
    :class:`pgcdc.events.reader.RawRun`; None when a value needs the exact path."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rel = run.rel
    commit_lsn, commit_time, xid, _origin = run.txn
    if commit_time is None or rel.type_oids != rel.value_type_oids:
        return None
    if run.op == "d" and run.before_is_key:
        at, names = rel.key_indexes, rel.key_names
    else:
        at, names = range(len(rel.names)), rel.names
    try:
        image = _objects(run, at, names, pa, pc)
    except (_Exact, pa.ArrowException, UnicodeDecodeError):
        return None
    m = run.m
    nothing = pa.nulls(m, pa.string())
    arrays = [
        pa.array([run.op] * m, type=pa.string()),
        pa.array([rel.schema] * m, type=pa.string()),
        pa.array([rel.table] * m, type=pa.string()),
        image if run.op == "d" else nothing,
        nothing if run.op == "d" else image,
        pa.array([()] * m, type=schema.field(5).type),
        nothing,
        pa.array(run.lsns, type=pa.int64()),
        pa.array([commit_lsn] * m, type=pa.int64()),
        pa.array(range(run.first, run.first + m), type=pa.int64()),
        pa.array([commit_time + PG_EPOCH_UNIX_US] * m, type=pa.int64()).cast(schema.field(10).type),
        pa.array([xid] * m, type=pa.int64()),
        pa.nulls(m, schema.field(12).type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _objects(run, at, names, pa, pc):
    """The JSON object of each change's row (its columns ``at``, named ``names``) as a
    string array."""
    import orjson

    w, m = run.width, run.m
    kinds, values = run.kinds, run.values
    parts = []
    for j, (i, name) in enumerate(zip(at, names)):
        column_kinds = kinds[i::w]
        if column_kinds.count("t") + column_kinds.count("n") != m:
            raise _Exact  # binary
        oid = run.rel.type_oids[i]
        if oid not in HANDLED:
            raise _Exact
        texts = pa.array(values[i::w], pa.binary()).cast(pa.string())  # refuses bad UTF-8
        key = (b"{" if j == 0 else b",") + orjson.dumps(name) + b":"
        parts.append(pa.scalar(key.decode(), type=pa.string()))
        parts.append(_fragment(texts, oid, pa, pc).fill_null("null"))
    if not parts:
        return pa.array(["{}"] * m, type=pa.string())
    parts.append(pa.scalar("}", type=pa.string()))
    return pc.binary_join_element_wise(*parts, "")


def _all(pc, texts, pattern: str) -> bool:
    """Whether every non-NULL text matches ``pattern`` whole."""
    return pc.all(pc.match_substring_regex(texts, f"^(?:{pattern})$")).as_py() is not False


def _fragment(texts, oid: int, pa, pc):
    """Each text's JSON, as the exact path writes the value the text loads as."""
    if oid in _INTS:
        if not _all(pc, texts, r"-?\d+"):
            raise _Exact
        return texts
    if oid == _NUMERIC:  # a finite Decimal: its digits as they are
        if not _all(pc, texts, r"-?\d+(\.\d+)?"):
            raise _Exact  # NaN, Infinity: strings there
        return texts
    if oid == _BOOL:
        if not _all(pc, texts, "[tf]"):
            raise _Exact
        return pc.if_else(pc.equal(texts, "t"), "true", "false")
    if oid in _FLOATS:
        # the server writes the shortest digits that read back, as orjson does; a float
        # without a fraction gets ".0" there; exponents are written otherwise there
        if not _all(pc, texts, r"-?\d+(\.\d+)?"):
            raise _Exact  # (the server's plain digits stop at 1e15, before repr's do)
        whole = pc.invert(pc.match_substring(texts, "."))
        return pc.if_else(whole, pc.binary_join_element_wise(texts, ".0", ""), texts)
    if oid in _STRINGS:
        return quoted_strings(texts, pa, pc)
    if oid == _TIMESTAMPTZ:  # in UTC, as the capture's session writes it
        if not _all(pc, texts, _TIME + r"\+00"):
            raise _Exact
        texts = pc.replace_substring(texts, " ", "T", max_replacements=1)
        return pc.binary_join_element_wise('"', texts, ':00"', "")
    if oid == _TIMESTAMP:
        if not _all(pc, texts, _TIME):
            raise _Exact
        texts = pc.replace_substring(texts, " ", "T", max_replacements=1)
        return pc.binary_join_element_wise('"', texts, '"', "")
    if oid == _DATE:
        if not _all(pc, texts, r"\d{4}-\d\d-\d\d"):
            raise _Exact
        return pc.binary_join_element_wise('"', texts, '"', "")
    raise _Exact
