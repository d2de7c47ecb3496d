"""Where a pipeline stands: a capture directory's durable position and source, an apply state's
applied position and tables, and (given a connection) the slot on the server: its confirmed
position, the WAL it holds back, how close it is to being invalidated, and the lag of each
stage behind the server's WAL.

    from pgcdc.status import pipeline_status
    doc = pipeline_status(capture_dir="cap", state_dir="tables", dsn="host=db ...")

Everything is read, nothing is written: it is safe beside a running capture or apply.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pgcdc.capture.checks import slot_health
from pgcdc.errors import SetupError
from pgcdc.capture.runner import human_bytes as _human
from pgcdc.capture.runner import lsn_file
from pgcdc.capture.segments import STATE_FILE as CAPTURE_STATE
from pgcdc.capture.segments import list_segments, read_state
from pgcdc.lsn import format_lsn, parse_lsn

STATE_FILE = "_pgcdc_state.json"  # pgcdc.apply.state.STATE_FILE, read here without Spark
APP_ID = "pgcdc-apply"  # pgcdc.apply.delta.APP_ID: the transaction a table's commits carry
LOW_HEADROOM = 1 << 30  # warn when the slot is less than this from being invalidated
SYNC_CAPTURE = "_capture"  # pgcdc sync's capture directory, inside its output directory
# pgcdc sync's tables set aside (pgcdc.sync.aside): {table: {"reason", "column", "since"}}
SET_ASIDE = "_set_aside.json"
RESNAPSHOT = "_resnapshot"  # pgcdc resnapshot's requests: a file per table asked for
SYNC_LOG = "_sync.log"  # pgcdc sync's log file: its warnings, errors and their tracebacks
# pgcdc sync's position: every change up to it is in the tables (pgcdc.sync.config.APPLIED)
SYNC_APPLIED = "_applied.lsn"


class StatusError(SetupError, ValueError):
    """A directory that is neither what it was named as, nor readable."""


def capture_status(directory) -> dict:
    """The durable position, source and options of a capture directory, its segments, and
    when it was last made durable."""
    path = Path(directory)
    if not path.is_dir():
        raise StatusError(f"{path}: no such capture directory")
    state = read_state(path)
    segs = list_segments(path)
    doc = {
        "directory": str(path),
        "segments": len(segs),
        "bytes": sum(s.stat().st_size for s in segs),
        "durable_lsn": None,
        "slot": None,
        "source": None,
        "options": None,
        "durable_at": None,
    }
    if state is not None:
        doc.update(
            durable_lsn=format_lsn(state.lsn),
            slot=state.slot,
            source=state.source,
            options=state.info or None,
            durable_at=_mtime(path / CAPTURE_STATE),
        )
    return doc


def apply_status(directory) -> dict:
    """The applied position of an apply state directory, its tables (version, rows), and its
    last run."""
    path = Path(directory)
    try:
        doc = json.loads((path / STATE_FILE).read_text())
    except FileNotFoundError:
        raise StatusError(f"{path}: no {STATE_FILE} (not an apply state, or nothing applied yet)")
    except (OSError, ValueError) as e:
        raise StatusError(f"{path / STATE_FILE}: {e}") from None
    tables = {
        name: {
            "version": t.get("version"),
            "rows": t.get("rows"),
            "keys": t.get("keys"),
            "applied_lsn": _table_position(path, name) if doc.get("layout") == "delta" else None,
        }
        for name, t in sorted(doc.get("tables", {}).items())
    }
    aside = set_aside(path)
    for name, t in aside.items():
        tables.setdefault(name, {"version": None, "rows": None, "keys": None,
                                 "applied_lsn": None})["set_aside"] = True  # fmt: skip
    # sync's own position covers every table it holds (not those set aside): past the last
    # commit applied when the WAL since held nothing of theirs (a snapshot, then quiet)
    covered = lsn_file(path / SYNC_APPLIED)()
    if covered is not None:
        for t in tables.values():
            if not t.get("set_aside") and t["applied_lsn"] is not None:
                t["applied_lsn"] = format_lsn(max(parse_lsn(t["applied_lsn"]), covered))
    applied = doc.get("applied_lsn")
    if covered is not None and (applied is None or parse_lsn(applied) < covered):
        applied = format_lsn(covered)
    out = {
        "directory": str(path),
        "applied_lsn": applied,
        "scd": doc.get("scd"),
        "source": doc.get("source"),
        "tables": dict(sorted(tables.items())),
        "last_run": doc.get("last_run"),
        "applied_at": _mtime(path / STATE_FILE),
    }
    if aside:
        out["set_aside"] = aside
    return out


def set_aside(directory) -> dict:
    """``pgcdc sync``'s tables set aside in ``directory`` (not applied until a snapshot
    takes them up again: :mod:`pgcdc.sync.aside`): {table: {"reason", "column" (or None),
    "since", "requested": whether ``pgcdc resnapshot`` asked for its snapshot}}."""
    try:
        doc = json.loads((Path(directory) / SET_ASIDE).read_text())
    except (OSError, ValueError):
        doc = {}
    asked = resnapshot_requests(directory)
    return {name: {"reason": t.get("reason"), "column": t.get("column"),
                   "since": t.get("since"), "requested": name in asked}
            for name, t in sorted(doc.items())}  # fmt: skip


def resnapshot_requests(directory) -> dict[str, Path]:
    """{table: its request file} of the snapshots ``pgcdc resnapshot`` asked for in a
    ``pgcdc sync`` directory and no sync has taken yet."""
    asked = {}
    root = Path(directory) / RESNAPSHOT
    for p in sorted(root.glob("*.json")) if root.is_dir() else ():
        try:
            asked[json.loads(p.read_text())["table"]] = p
        except (OSError, ValueError, KeyError, TypeError):
            continue  # (one being written: its rename has not happened)
    return asked


def planned_offset(checkpoint: Path, batch_id: int) -> dict:
    """The end offset a Structured Streaming checkpoint's offset log holds for ``batch_id``
    (a version line, the batch's metadata, then the one source's end offset). Raises
    OSError, ValueError or IndexError for a log that is not there or not that."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    return json.loads(lines[2])


def query_status(directory) -> dict | None:
    """``pgcdc sync --engine streaming``'s query, from its checkpoint (``DIR/_checkpoint``):
    the last batch committed, when, and the capture position it applied up to; None when
    the directory has no such checkpoint."""
    commits = Path(directory) / "_checkpoint" / "commits"
    if not commits.is_dir():
        return None
    done = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=None)
    if done is None:
        return {"checkpoint": str(commits.parent), "batch": None}
    end = None
    try:
        end = planned_offset(commits.parent, done)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "checkpoint": str(commits.parent),
        "batch": done,
        "committed_at": _mtime(commits / str(done)),
        "end_lsn": (end or {}).get("lsn"),
    }


def _table_position(root: Path, name: str) -> str | None:
    """The commit LSN a Delta table is applied up to (its own commit says it; the summary's
    applied_lsn is the lowest of them), or None when it cannot be read here."""
    try:
        from deltalake import DeltaTable

        lsn = DeltaTable(str(root / name)).transaction_version(APP_ID)
    except Exception:  # deltalake missing, or the table unreadable: the summary stands
        return None
    return None if lsn is None else format_lsn(lsn)


def sync_layout(directory) -> tuple[str, str] | None:
    """(capture directory, apply state directory) of a ``pgcdc sync`` directory (its
    ``_capture/`` beside the tables), or None for another directory."""
    path = Path(directory)
    if (path / SYNC_CAPTURE).is_dir():
        return str(path / SYNC_CAPTURE), str(path)
    return None


def slot_status(dsn: str, slot: str) -> dict:
    """The slot on the server (``pg_replication_slots``) and the server's WAL position."""
    import psycopg

    sql = (
        "SELECT pg_current_wal_lsn()::text, s.active, s.confirmed_flush_lsn::text, "
        "s.restart_lsn::text, s.wal_status, s.safe_wal_size, "
        "(pg_current_wal_lsn() - s.restart_lsn)::bigint, s.plugin, s.temporary "
        "FROM pg_replication_slots s WHERE s.slot_name = %s"
    )
    with psycopg.connect(dsn, autocommit=True, application_name="pgcdc status") as conn:
        row = conn.execute(sql, [slot]).fetchone()
        if row is None:
            (wal,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            return {"slot": slot, "exists": False, "wal_lsn": wal}
        # why it was invalidated, read the same way on 15-18 (17+ also cuts slots for
        # idle_replication_slot_timeout and rows_removed, without wal_status lost)
        health = slot_health(lambda q: conn.execute(q).fetchall(), slot)
    wal, active, confirmed, restart, wal_status, safe, retained, plugin, temporary = row
    return {
        "slot": slot,
        "exists": True,
        "wal_lsn": wal,
        "active": active,
        "plugin": plugin,
        "temporary": temporary,
        "confirmed_flush_lsn": confirmed,
        "restart_lsn": restart,
        "retained_wal_bytes": retained,
        "wal_status": wal_status,
        "safe_wal_size": safe,  # None: no max_slot_wal_keep_size, the slot is never cut
        "invalidation_reason": health.reason,
    }


def pipeline_status(capture_dir=None, state_dir=None, dsn: str | None = None, slot=None) -> dict:
    """All of the above that was asked for, with the lag of each stage in bytes of WAL and
    the warnings a person should act on."""
    doc: dict = {"warnings": []}
    if capture_dir is not None:
        doc["capture"] = capture_status(capture_dir)
        slot = slot or doc["capture"]["slot"]
    if state_dir is not None:
        doc["apply"] = apply_status(state_dir)
        query = query_status(state_dir)
        if query is not None:
            doc["query"] = query
    if dsn is not None:
        if not slot:
            raise StatusError("which slot? give --slot, or a capture directory that records it")
        doc["server"] = server = slot_status(dsn, slot)
        wal = parse_lsn(server["wal_lsn"])
        lag = {}
        if server.get("confirmed_flush_lsn"):
            lag["slot_bytes"] = max(0, wal - parse_lsn(server["confirmed_flush_lsn"]))
        if doc.get("capture", {}).get("durable_lsn"):
            lag["capture_bytes"] = max(0, wal - parse_lsn(doc["capture"]["durable_lsn"]))
        if doc.get("apply", {}).get("applied_lsn"):
            lag["apply_bytes"] = max(0, wal - parse_lsn(doc["apply"]["applied_lsn"]))
            # how long the tables have been behind: since the last run that caught up
            applied_at = doc["apply"]["applied_at"]
            if lag["apply_bytes"] and applied_at:
                lag["apply_seconds"] = max(0, int(time.time() - _epoch(applied_at)))
            else:
                lag["apply_seconds"] = 0
        for t in doc.get("apply", {}).get("tables", {}).values():
            at = t.get("applied_lsn") or doc["apply"].get("applied_lsn")
            t["lag_bytes"] = max(0, wal - parse_lsn(at)) if at and not t.get("set_aside") else None
        doc["lag"] = lag
        doc["warnings"] += _slot_warnings(server)
    for name, t in doc.get("apply", {}).get("set_aside", {}).items():
        if t["requested"]:
            then = "its snapshot is asked for (pgcdc resnapshot): sync takes it at its next look"
        else:
            then = f"once the cause is fixed: pgcdc resnapshot --out {state_dir} {name}"
        doc["warnings"].append(f"table {name} is set aside since {t['since']} ({t['reason']}): "
                               f"its changes are not applied; {then}")  # fmt: skip
    if "capture" in doc and "apply" in doc:
        a, c = doc["apply"].get("source"), doc["capture"].get("source")
        keys = ("system_id", "database", "slot")
        if a and c and any(a.get(k) != c.get(k) for k in keys):
            doc["warnings"].append(
                "the apply state comes from another source than the capture directory"
            )
    return doc


def _slot_warnings(server: dict) -> list[str]:
    if not server["exists"]:
        return [
            f"slot {server['slot']} does not exist: changes since the applied position are "
            "not kept by the server (take a new snapshot)"
        ]
    out = []
    if server["wal_status"] == "lost" or server.get("invalidation_reason"):
        reason = server.get("invalidation_reason") or "wal_removed"
        setting = {
            "wal_removed": "raise max_slot_wal_keep_size",
            "idle_timeout": "raise idle_replication_slot_timeout, or keep a consumer running",
        }.get(reason, "see the server's log")
        out.append(
            f"slot {server['slot']} was invalidated ({reason}, wal_status "
            f"{server['wal_status']}): the changes since the applied position are gone; "
            f"{setting} and take a new snapshot"
        )
    elif server["wal_status"] in ("unreserved",) or (
        server["safe_wal_size"] is not None and server["safe_wal_size"] < LOW_HEADROOM
    ):
        out.append(
            f"slot {server['slot']} is {_human(server['safe_wal_size'] or 0)} from being "
            "invalidated (safe_wal_size): capture and apply, or raise max_slot_wal_keep_size"
        )
    return out


def _epoch(iso: str) -> float:
    import calendar

    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))


def _mtime(path: Path) -> str | None:
    try:
        t = os.stat(path).st_mtime
    except OSError:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def render_text(doc: dict) -> str:
    """The status for a person: one block per stage."""
    lines = []
    if "server" in doc:
        s = doc["server"]
        if s["exists"]:
            safe = "unlimited" if s["safe_wal_size"] is None else _human(s["safe_wal_size"])
            lines += [
                f"slot {s['slot']}: {'active' if s['active'] else 'inactive'}, "
                f"wal_status {s['wal_status']}, safe_wal_size {safe}",
                f"  server WAL {s['wal_lsn']}, confirmed {s['confirmed_flush_lsn']}, "
                f"retained WAL {_human(s['retained_wal_bytes'] or 0)}",
            ]
        else:
            lines.append(f"slot {s['slot']}: does not exist (server WAL {s['wal_lsn']})")
    if "capture" in doc:
        c = doc["capture"]
        lines.append(
            f"capture {c['directory']}: durable up to {c['durable_lsn'] or 'nothing yet'}"
            + (f" at {c['durable_at']}" if c["durable_at"] else "")
            + f", {c['segments']} segment(s), {_human(c['bytes'])}"
        )
    if "apply" in doc:
        a = doc["apply"]
        lines.append(
            f"apply {a['directory']}: applied up to {a['applied_lsn'] or 'nothing yet'}"
            + (f" at {a['applied_at']}" if a["applied_at"] else "")
            + f", SCD{a['scd']}"
        )
        if a.get("last_run"):
            r = a["last_run"]
            lines.append(
                f"  last run: {r.get('finished_at', '?')}, {len(r.get('files_read', []))} "
                f"file(s) read, {r.get('units_read', '?')} unit(s)"
            )
        lines += _tables_block(a["tables"])
    if "query" in doc:
        q = doc["query"]
        lines.append(
            f"streaming query {q['checkpoint']}: "
            + (
                "no batch committed yet"
                if q["batch"] is None
                else f"batch {q['batch']} committed at {q['committed_at']}, "
                f"up to capture position {q['end_lsn']}"
            )
        )
    if doc.get("lag"):
        parts = []
        for k, v in doc["lag"].items():
            if k.endswith("_seconds"):
                if v:
                    parts.append(f"apply behind for {v} s")
            else:
                parts.append(f"{k.removesuffix('_bytes')} {_human(v)}")
        lines.append("lag behind the server's WAL: " + ", ".join(parts))
    lines += [f"warning: {w}" for w in doc["warnings"]]
    return "\n".join(lines)


def _tables_block(tables: dict) -> list[str]:
    """The tables at a glance: one aligned row each, the most behind first."""
    if not tables:
        return []
    rows = [("table", "version", "rows", "applied up to", "lag")]
    order = sorted(tables.items(), key=lambda kv: -(kv[1].get("lag_bytes") or 0))
    for name, t in order:
        lag = t.get("lag_bytes")
        rows.append(
            (
                name,
                "-" if t["version"] is None else str(t["version"]),
                "?" if t["rows"] is None else f"{t['rows']:,}",
                "set aside" if t.get("set_aside") else t.get("applied_lsn") or "-",
                "-" if lag is None else _human(lag),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()  # fmt: skip
        for r in rows
    ]
