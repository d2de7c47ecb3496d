"""What apply keeps beside its tables, and what it reads before it writes: the run summary
``OUT/_pgcdc_state.json``, the applied position, the source the tables come from, the
snapshot contract, and apply's errors and report.

The summary is written after every table of a run committed (:func:`write_state`: a local
file renamed into place, or one PUT): ``layout: "delta"``, the run's applied position
(``applied_lsn``: every table is applied at least that far), each table's Delta version, key,
columns, rows and what its last commit removed and added, the last run, the source (server,
database, slot), and what a later run needs to read newer captures alone: each table's
latest Relation message (``relations``) and the catalog of the types that are not built in
(``catalog``). Each table's own position rides on its commits (:mod:`pgcdc.apply.delta`);
the summary may be behind them, never ahead.

Snapshot contract (what ``--snapshot DIR`` / ``apply_changes(snapshot=DIR)`` reads; the
initial snapshot writer, :mod:`pgcdc.snapshot.job`, follows it):

- ``DIR/<schema>.<table>/`` is a Delta table (Parquet files Spark wrote into it, committed
  by :func:`pgcdc.apply.delta.commit_parquet_dir`) or a plain Parquet dataset
  (``spark.read.parquet`` of it works): the table's columns under their own names (a Delta
  table's may be stored names: :mod:`pgcdc.spark.names`), typed by
  :func:`pgcdc.spark.types.spark_type` (values converted by
  :func:`pgcdc.spark.types.value_converter`), plus
- ``_pg_text`` (``map<string,string>``, :data:`pgcdc.spark.types.SPECIAL_COLUMN`, optional):
  column name -> PostgreSQL text of values the typed column holds as null (infinity, NaN, ...);
- ``_commit_lsn`` (LongType): the slot's consistent point, the same on every row;
- ``_tx_ordinal`` (LongType): 0 on every row (a snapshot row is op 'r').
- ``DIR/_snapshot.json`` (optional): ``{"consistent_point": "16/B374D848", "keys":
  {"<schema>.<table>": ["id", ...]}, "oids": {...}}``; keys are needed only for tables that
  have snapshot rows but whose Relation messages never appear in the captures.

Change events at or before (``_commit_lsn``, 0) of a table's snapshot are not applied to it:
the snapshot already contains them (:func:`applied_before`).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from pgcdc.errors import DataError, SetupError
from pgcdc.apply import delta
from pgcdc.capture.segments import source_identity
from pgcdc.durable import write_json
from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.spark.units import record_from_json, record_to_json
from pgcdc.values import Catalog

__all__ = [
    "STATE_FILE",
    "STATE_FORMAT",
    "ApplyError",
    "ApplyReport",
    "SourceMismatch",
    "applied_before",
    "applied_lsn",
    "table_of",
]

STATE_FILE = "_pgcdc_state.json"
STATE_FORMAT = "pgcdc-apply-state"


class ApplyError(DataError, ValueError):
    """The changes cannot be applied as they are (says which table, row and LSN)."""


class SourceMismatch(SetupError, ApplyError):
    """Captures of another server, database or slot than the state (or than each other)."""


class ApplyReport(dict):
    """{table: rows written} of one run; ``run`` says what it read (``units_read``,
    ``units_skipped``: units whose transactions were all applied before, ``files_read``);
    ``errors`` (lenient runs): {table: [(LSN, message)...]} of the values kept raw (their
    text in ``_pg_text``), the first ERRORS_KEPT of each table."""

    run: dict = {}
    errors: dict = {}


def table_of(error: BaseException) -> str | None:
    """The table :func:`pgcdc.apply.run.apply_changes` was writing when ``error`` was raised,
    or None."""
    return getattr(error, "pgcdc_table", None)


# --- the positions ------------------------------------------------------------------------------


def applied_lsn(out) -> str | None:
    """The commit LSN (text) a state directory is applied up to, or None."""
    try:
        if delta.is_remote(str(out)):
            fs, path = delta.filesystem(str(out))
            with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
                doc = json.loads(f.read())
        else:
            doc = json.loads((Path(out) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("applied_lsn") or None


def applied_before(point: int | None) -> int | None:
    """The applied position a snapshot taken at ``point`` stands for: the slot sends every
    transaction whose commit record starts at or after its consistent point, the snapshot
    holds those before it, so one committing exactly at the point is still to apply."""
    return None if point is None else point - 1


# --- the summary --------------------------------------------------------------------------------


def read_state(root: str) -> dict:
    """The run summary of an output (``_pgcdc_state.json``), or an empty one."""
    fs, path = delta.filesystem(root)
    try:
        with fs.open_input_stream(f"{path}/{STATE_FILE}") as f:
            doc = json.loads(f.read())
    except (FileNotFoundError, OSError) as e:
        if isinstance(e, FileNotFoundError) or "not exist" in str(e) or "NoSuchKey" in str(e):
            return {"format": STATE_FORMAT, "layout": "delta", "version": 1,
                    "applied_lsn": None, "tables": {}}  # fmt: skip
        raise ApplyError(delta.redact(f"{root}: reading {STATE_FILE}: {e}")) from None
    if doc.get("format") != STATE_FORMAT:
        raise ApplyError(f"{root}/{STATE_FILE}: not a pgcdc apply state file")
    if doc.get("layout") != "delta":
        raise ApplyError(
            f"{root} holds the parquet layout of pgcdc 0.2, which apply no longer writes: "
            "apply to a new --out (Delta Lake tables)"
        )
    return doc


def write_state(root: str, doc: dict) -> None:
    """Replace the run summary: a local file written aside, fsynced and renamed; on object
    storage one PUT (all or nothing)."""
    if not delta.is_remote(root):
        write_json(Path(delta._local(root)) / STATE_FILE, doc)
        return
    fs, path = delta.filesystem(root)
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    try:
        with fs.open_output_stream(f"{path}/{STATE_FILE}") as f:
            f.write(data)
    except OSError as e:
        raise ApplyError(delta.redact(f"{root}: writing {STATE_FILE}: {e}")) from None


def learnt(doc: dict) -> dict:
    """change_events' ``known`` and ``catalog`` from what earlier runs recorded in the state."""
    known = [record_from_json(r) for r in doc.get("relations", ())]
    catalog = Catalog.from_doc(doc["catalog"]) if doc.get("catalog") else None
    return {"known": known, "catalog": catalog}


def close_run(report, ce, captures, doc: dict, new_doc: dict, *, changed: bool, stats: dict
              ) -> bool:  # fmt: skip
    """Say in ``report.run`` what this run read (incremental runs skip the units of applied
    transactions); when it wrote a table or moved the applied position, record that and the
    captures in ``new_doc`` and return True: the state is to be written."""
    report.run = {
        "units_read": len(ce.units),
        "units_skipped": ce.skipped_units,
        "files_read": ce.files_read(),
    }
    report.errors = {n: [(format_lsn(lsn), m) for lsn, m in st["errors"]]
                     for n, st in stats.items() if st["errors"]}  # fmt: skip
    if report.errors:
        report.run["errors"] = {n: len(e) for n, e in report.errors.items()}
    if not changed and new_doc.get("applied_lsn") == doc.get("applied_lsn"):
        return False
    new_doc["captures"] = [str(c) for c in captures]
    finished = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    new_doc["last_run"] = {**report.run, "finished_at": finished}
    # what a later run needs to read newer captures alone (older ones pruned): each table's
    # latest Relation message, and the catalog of the types that are not built in
    new_doc["relations"] = [record_to_json(ts.record) for ts in ce.tables.values() if ts.record]
    if ce.catalog is not None:
        new_doc["catalog"] = ce.catalog.to_doc()
    return True


# --- the source ---------------------------------------------------------------------------------

_SOURCE_KEYS = ("system_id", "database", "slot")


def one_source(captures, applied: dict | None, out) -> dict | None:
    """The source (server, database, slot) of the capture directories among ``captures``,
    checked to be one, and the one the state was applied from; None when none records it
    (capture files, directories made before pgcdc recorded it). Changes of two sources
    cannot be ordered by LSN: mixing them would skip or corrupt rows."""

    def key(doc):
        return tuple(doc.get(k) for k in _SOURCE_KEYS)

    found = applied
    where = f"{out} (the applied state)" if applied else None
    for c in captures:
        if not Path(c).is_dir():
            continue
        doc = source_identity(c)
        if doc is None:
            continue
        if found is not None and key(doc) != key(found):
            raise SourceMismatch(
                f"{c} comes from system {doc['system_id']} database {doc['database']} slot "
                f"{doc['slot']}, but {where} from system {found['system_id']} database "
                f"{found['database']} slot {found['slot']}: apply one source per --out "
                "directory (use a new --out for this one)"
            )
        if found is None:
            found, where = {k: doc.get(k) for k in _SOURCE_KEYS}, str(c)
    return None if found is None else {k: found.get(k) for k in _SOURCE_KEYS}


# --- the snapshot -------------------------------------------------------------------------------


def read_snapshot(snapshot) -> dict:
    """A snapshot directory (the contract above): {"tables": {name: path}, "keys", "oids",
    "lsn": its consistent point or None}."""
    root = Path(snapshot)
    meta = {}
    if (root / "_snapshot.json").exists():
        meta = json.loads((root / "_snapshot.json").read_text())
    tables = {
        p.name: str(p)
        for p in sorted(root.iterdir())
        if p.is_dir() and not p.name.startswith(("_", "."))
    }
    lsn = parse_lsn(meta["consistent_point"]) if meta.get("consistent_point") else None
    return {"tables": tables, "keys": meta.get("keys", {}), "oids": meta.get("oids", {}),
            "lsn": lsn}  # fmt: skip


def snapshot_rows(spark, path: str):
    """A snapshot table's rows: a Delta table (committed by
    :func:`pgcdc.apply.delta.commit_parquet_dir`) or a plain Parquet dataset."""
    if delta.is_delta_table(path):
        return delta.read_rows(spark, path)
    return spark.read.parquet(path)


def snapshot_row_count(path: str) -> int:
    """Rows of a snapshot table, from its log or its files' footers (no Spark job)."""
    import pyarrow.parquet as pq  # lazy: pyarrow

    if delta.is_delta_table(path):
        return sum(r or 0 for _p, _s, r in delta.current_files(path))
    return sum(pq.read_metadata(p).num_rows for p in Path(path).rglob("*.parquet"))


def table_keys(name: str, ts, doc: dict, snap) -> list | None:
    """A table's key: its latest Relation message's, else the summary's, else the
    snapshot's."""
    keys = (ts.key_names if ts else None) or doc["tables"].get(name, {}).get("keys")
    if keys is None and snap is not None:
        keys = snap["keys"].get(name)
    return list(keys) if keys else None
