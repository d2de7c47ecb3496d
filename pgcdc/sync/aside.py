"""``pgcdc sync``: one table's fault is that table's.

A table whose changes cannot be applied (its Delta table unreadable or not writable, a value
that does not load, apply's own refusal), or whose snapshot cannot be taken or loaded, is
**set aside**: recorded with its reason in ``DIR/_set_aside.json`` (:data:`pgcdc.status.SET_ASIDE`),
said once (``table_set_aside``: the table, the column where known, the remedy; the whole
error in ``DIR/_sync.log``), shown by ``pgcdc status`` and ``--metrics``
(``pgcdc_table_set_aside``), while the other tables go on.

A cycle is one apply over every table, so its failure says little of whose it is. It is
tried again in parts (:func:`apply`): first once with every table passed over (the captures
read, nothing written: a failure then is nobody's table, and sync ends as before), then
halves of the tables, and halves of the halves that fail, down to the tables that fail
alone; those are set aside and the cycle runs again without them. Exactly once holds through
it: each table's Delta commit carries its own position, the parts keep the summary's applied
position where it was (``apply_changes(hold=True)``), and a table a part committed skips
what it holds when the cycle runs again. A failure every table shares (a full disk, every
table failing alone) is not set aside.

A table set aside is not applied and not loaded (its values are not decoded: one that does
not load stops nothing), and the applied position, the slot's and the pruning's, goes on
without it: its changes meanwhile are passed over. It comes back only by a snapshot, which
holds them: ``pgcdc resnapshot --out DIR TABLE`` (:func:`request`) leaves a request in
``DIR/_resnapshot/``, which the running sync serves at its next ``--tables-check`` (or the
next run, if none runs) as it serves a table added to the publication (:mod:`.added`: a
snapshot taken in a thread while the other tables go on, then swapped in with the changes
after it in one commit); loaded, the table is taken up again (``table_taken_up``). The record
outlives a crash: a rerun says which tables are set aside and keeps them so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from urllib.parse import quote

from pgcdc.apply.state import SourceMismatch
from pgcdc.capture.catalog import RELATIONS_FILE, read_catalog_lines
from pgcdc.capture.files import SourceError
from pgcdc.capture.segments import CaptureDirError
from pgcdc.durable import write_json
from pgcdc.snapshot.server import list_published_tables
from pgcdc.spark.later import started
from pgcdc.status import RESNAPSHOT, SET_ASIDE, resnapshot_requests
from pgcdc.sync import added
from pgcdc.sync.logfile import column_of, format_error, reason

__all__ = ["SetAside", "apply", "is_running", "known_tables", "request", "serve"]

SEARCHES = 3  # a cycle's apply, run again once its culprits are set aside, this often at most
# errors of the place, not of a table: a cycle that fails so is not searched for a culprit
NOT_A_TABLE = ("No space left on device", "Disk quota exceeded", "Read-only file system")


class SetAside:
    """The tables set aside in a sync's directory: {table: {"reason", "column", "since",
    "doing"}}, kept in ``DIR/_set_aside.json``."""

    def __init__(self, out):
        self.out = Path(out)
        try:
            self.tables: dict = json.loads((self.out / SET_ASIDE).read_text())
        except (OSError, ValueError):
            self.tables = {}

    @property
    def names(self) -> frozenset:
        return frozenset(self.tables)

    def put(self, sync, name: str, error: BaseException, doing: str = "applying its changes"):
        """Set ``name`` aside for ``error``: recorded, said (one line; the error whole in the
        log file), counted."""
        why, column = reason(error), column_of(error)
        self.tables[name] = {"reason": why, "column": column, "doing": doing,
                             "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        self._write()
        where = getattr(sync.log, "where", None)
        detail = getattr(sync.log, "detail", None)
        if detail is not None:
            detail(f"{name}: {doing} failed:\n{format_error(error)}")
        at = f" (column {column})" if column else ""
        sync.log.event(
            "error", "table_set_aside",
            f"{name} is set aside: {doing} failed{at}: {why}. The other tables go on; its "
            f"changes are passed over until a snapshot takes it up again: fix the cause, then "
            f"run pgcdc resnapshot --out {self.out} {name} (a running sync takes it at its next "
            f"tables check){'; ' + where() if where else ''}",
            table=name, reason=why, column=column, doing=doing,
        )  # fmt: skip
        self.publish(sync)

    def taken_up(self, sync, names) -> None:
        """``names`` were loaded from a snapshot: those set aside are applied again."""
        self.answered(names)
        for name in names:
            sync.warned_tables.discard(name)
            if self.tables.pop(name, None) is not None:
                self._write()
                sync.log.event("info", "table_taken_up", f"{name} is taken up again: its "
                               "snapshot is loaded, its changes are applied again",
                               table=name)  # fmt: skip
        self.publish(sync)

    def answered(self, names) -> None:
        """The requests (pgcdc resnapshot) for ``names`` are served: gone."""
        asked = resnapshot_requests(self.out)
        for name in names:
            if name in asked:
                asked[name].unlink(missing_ok=True)

    def said(self, sync) -> None:
        """At the start of a run: the tables set aside by an earlier one, still aside."""
        for name, t in sorted(self.tables.items()):
            sync.log.event("warning", "table_set_aside", f"{name} is set aside since "
                           f"{t.get('since')} ({t.get('reason')}): its changes are passed "
                           f"over; once the cause is fixed: pgcdc resnapshot --out {self.out} "
                           f"{name}", table=name, reason=t.get("reason"),
                           column=t.get("column"), doing=t.get("doing"))  # fmt: skip
        self.publish(sync)

    def publish(self, sync) -> None:
        m = getattr(sync, "metrics", None)
        if m is not None:
            m.set_aside = sorted(self.tables)

    def _write(self) -> None:
        if self.tables or (self.out / SET_ASIDE).exists():
            write_json(self.out / SET_ASIDE, self.tables)


# --- a cycle that fails ----------------------------------------------------------------------


def apply(sync, run, snapshot):
    """``run(aside=..., hold=...)`` (:func:`pgcdc.apply.run.apply_changes` with a cycle's
    arguments), the tables set aside left out; when it fails, the tables at fault are found
    and set aside and it runs again (see the module docstring). Raises what is nobody's
    table's."""
    for attempt in range(SEARCHES):
        try:
            return run(aside=sync.aside.names)
        except Exception as e:
            if sync.stopper.requested or attempt == SEARCHES - 1 or _not_a_table(sync, e):
                raise
            first = e
        sync.log.event("warning", "apply_search", f"a cycle failed ({reason(first)}): looking "
                       "for the table(s) at fault, applying the tables in parts")  # fmt: skip
        found = _culprits(sync, run, _tables(sync, snapshot))
        if found is None:
            raise first
        for name, error in sorted(found.items()):
            sync.aside.put(sync, name, error)
    raise AssertionError("unreachable")


def _not_a_table(sync, error: BaseException) -> bool:
    """Whether ``error`` is the place's rather than a table's: the captures unreadable, the
    disk full, the Spark session gone."""
    if isinstance(error, (CaptureDirError, SourceError, SourceMismatch, MemoryError)):
        return True
    if any(text in str(error) for text in NOT_A_TABLE):
        return True
    spark = sync.spark
    if spark is None or not started(spark):
        return False  # (a run the driver applied: no session yet)
    try:
        return spark.sparkContext._jsc is None
    except Exception:  # noqa: BLE001 - a session that cannot say: gone
        return True


def _tables(sync, snapshot) -> list[str]:
    """The tables a cycle may write: apply's, the snapshot's being loaded, and any the
    capture has seen a Relation message of (not those set aside)."""
    names = set((sync.applied_doc() or {}).get("tables") or {})
    if snapshot is not None:
        names |= {p.name for p in Path(snapshot).iterdir()
                  if p.is_dir() and "." in p.name and not p.name.startswith("_")}  # fmt: skip
    try:
        for line in read_catalog_lines(sync.capture_dir, name=RELATIONS_FILE):
            rel = line["relation"]
            names.add(f"{rel['namespace']}.{rel['name']}" if rel["namespace"] else rel["name"])
    except (OSError, ValueError, KeyError):
        pass
    return sorted(names - sync.aside.names)


def _culprits(sync, run, tables: list[str]) -> dict | None:
    """{table: its error} of the tables that fail alone, found by halves; None when the
    failure is nobody's table's: the captures read with every table passed over fail, or
    every table fails alone."""
    aside = sync.aside.names
    try:
        run(aside=aside | set(tables), hold=True)  # the captures read, nothing written
    except Exception:
        if sync.stopper.requested:
            raise
        return None
    failed, groups = {}, [tables]
    while groups:
        group = groups.pop()
        try:  # (the tables a part commits hold their changes: the next run skips them)
            run(aside=aside | (set(tables) - set(group)), hold=True)
        except Exception as e:
            if sync.stopper.requested:
                raise
            if len(group) == 1:
                failed[group[0]] = e
            else:
                half = len(group) // 2
                groups += [group[half:], group[:half]]
    if len(failed) > 1 and len(failed) == len(tables):
        return None
    return failed


# --- taken up again ----------------------------------------------------------------------------


def request(out, tables) -> list[Path]:
    """``pgcdc resnapshot``: ask the sync of ``out`` for a snapshot of each of ``tables``
    (a file each in ``DIR/_resnapshot/``, written whole); the request files."""
    root = Path(out) / RESNAPSHOT
    root.mkdir(exist_ok=True)
    made = []
    for name in tables:
        path = root / f"{quote(name, safe='')}.json"
        write_json(path, {"table": name,
                          "asked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})  # fmt: skip
        made.append(path)
    return made


def known_tables(out) -> set[str]:
    """The tables a sync directory holds or has set aside (what pgcdc resnapshot may ask
    for)."""
    out = Path(out)
    names = set(SetAside(out).tables)
    for doc in (out / "_pgcdc_state.json", out / "_snapshot" / "_snapshot.json"):
        try:
            names |= set(json.loads(doc.read_text()).get("tables") or {})
        except (OSError, ValueError, AttributeError):
            pass
    return names


def is_running(out) -> bool:
    """Whether a sync holds ``out`` now (its lock, ``DIR/_sync.lock``)."""
    import fcntl

    try:
        fd = os.open(Path(out) / "_sync.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (and the lock with it)


def serve(sync) -> None:
    """At a tables check: the snapshots pgcdc resnapshot asked for, taken in a thread while
    the cycles go on (:class:`pgcdc.sync.added.Adding`) and loaded by ``added.finish``,
    which takes the tables up again (:meth:`SetAside.taken_up`). One snapshot at a time:
    while another is under way, the requests wait."""
    asked = resnapshot_requests(sync.out)
    if not asked or sync.adding is not None:
        return
    if not (sync.snapshot_dir / "_snapshot.json").exists() or sync.snapshot_pending():
        return  # the initial snapshot first
    try:
        published = {t.qualified_name: t for t in list_published_tables(sync.connection(),
                                                                          sync.pubs)}  # fmt: skip
    except Exception:  # the server is away: the next check asks again
        sync.disconnect()
        return
    gone = sorted(n for n in asked if n not in published)
    for name in gone:
        sync.log.event("warning", "resnapshot_refused", f"{name}: a snapshot was asked for "
                       f"(pgcdc resnapshot), but it is not in {','.join(sync.pubs)}: not "
                       "taken; publish it and ask again", table=name)  # fmt: skip
    sync.aside.answered(gone)
    tables = [published[n] for n in sorted(asked) if n in published]
    if not tables:
        return
    why = "its snapshot asked for (pgcdc resnapshot)"
    aside = [t.qualified_name for t in tables if t.qualified_name in sync.aside.names]
    if aside:
        why += f", set aside ({', '.join(aside)}): its changes are passed over until it is loaded"
    sync.adding = added.Adding(tables, (), {},
                               lambda ts, again: added.take(sync, ts, again, why=why))  # fmt: skip
