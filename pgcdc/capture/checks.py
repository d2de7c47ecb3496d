"""Checks before streaming, so that common set-up mistakes end with one line naming the fix
(the server itself only notices a missing publication when the first change is decoded)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..lsn import format_lsn, parse_lsn
from .walsender import CaptureError, quote_literal

Execute = Callable[[str], Sequence[Sequence]]


def preflight(execute: Execute, slot: str, publications: Sequence[str], create_slot: bool) -> None:
    """Raise CaptureError for: wal_level not logical, a missing or non-pgoutput slot, a slot in
    use by another process, a missing publication."""
    ((wal_level,),) = execute("SHOW wal_level")
    if wal_level != "logical":
        raise CaptureError(
            f"the server runs with wal_level = {wal_level}; logical decoding needs logical "
            "(fix: ALTER SYSTEM SET wal_level = logical, then restart the server)",
            sqlstate="55000",
        )
    rows = execute(
        "SELECT plugin, slot_type, active_pid FROM pg_replication_slots "
        f"WHERE slot_name = {quote_literal(slot)}"
    )
    if not rows and not create_slot:
        raise CaptureError(
            f'replication slot "{slot}" does not exist (fix: create it with --create-slot, '
            "or check --slot)",
            sqlstate="42704",
        )
    if rows:
        plugin, slot_type, active_pid = rows[0]
        if slot_type != "logical" or plugin != "pgoutput":
            raise CaptureError(
                f'replication slot "{slot}" is a {slot_type} slot of plugin {plugin}, not a '
                "logical pgoutput slot (fix: use another --slot)"
            )
        if active_pid not in (None, ""):
            raise CaptureError(
                f'replication slot "{slot}" is active for PID {active_pid} (fix: stop the other '
                "consumer of this slot, see pg_stat_replication, or use another slot)",
                sqlstate="55006",
            )
    names = ", ".join(quote_literal(p) for p in publications)
    found = {
        r[0] for r in execute(f"SELECT pubname FROM pg_publication WHERE pubname IN ({names})")
    }
    missing = [p for p in publications if p not in found]
    if missing:
        raise CaptureError(
            f"publication {', '.join(missing)} does not exist in this database (fix: CREATE "
            "PUBLICATION <name> FOR ... on the server, or correct --publication)",
            sqlstate="42704",
        )


@dataclass(frozen=True)
class SourceIdentity:
    """Which server, database and slot a capture directory belongs to: PostgreSQL's system
    identifier (fixed at initdb, shared by a primary and its physical standbys), the timeline
    (it moves on promotion), the database, the slot, and the slot's consistent point when
    pgcdc created it (None for a slot made elsewhere)."""

    system_id: str
    timeline: int
    database: str
    slot: str
    slot_created_at: int | None = None

    def to_json(self) -> dict:
        return {
            "system_id": self.system_id,
            "timeline": self.timeline,
            "database": self.database,
            "slot": self.slot,
            "slot_created_at": None
            if self.slot_created_at is None
            else format_lsn(self.slot_created_at),
        }

    @classmethod
    def from_json(cls, doc: dict | None) -> SourceIdentity | None:
        if not doc:
            return None
        created = doc.get("slot_created_at")
        return cls(
            str(doc["system_id"]),
            int(doc["timeline"]),
            doc["database"],
            doc["slot"],
            None if created is None else parse_lsn(created),
        )

    def describe(self) -> str:
        created = (
            ""
            if self.slot_created_at is None
            else f", created at {format_lsn(self.slot_created_at)}"
        )
        return f"system {self.system_id}, database {self.database}, slot {self.slot}{created}"

    def same_source(self, other: SourceIdentity) -> bool:
        """The same server (or its promoted standby), database and slot."""
        return (self.system_id, self.database, self.slot) == (
            other.system_id,
            other.database,
            other.slot,
        )


class ResumeRefused(CaptureError):
    """A capture directory that this server or slot cannot continue (never retried)."""


def check_resume(
    execute: Execute,
    directory: str,
    recorded: SourceIdentity | None,
    current: SourceIdentity,
    resume_lsn: int,
    wal_end: int,
    *,
    temporary: bool = False,
) -> str | None:
    """Refuse (ResumeRefused, one line with the fix) to continue a capture directory whose
    durable position ``resume_lsn`` this server's slot cannot serve: another server or
    database, a position ahead of the server's WAL, or a slot confirmed past it (consumed
    elsewhere, or dropped and re-created under the same name). Runs before START_REPLICATION,
    so nothing is acknowledged to a slot that is not ours. Returns a warning for a timeline
    change (a promoted standby continues the same WAL), else None."""
    fix = "capture this server into a new --out directory, or connect to the server it came from"
    if recorded is not None and not recorded.same_source(current):
        raise ResumeRefused(
            f"{directory} was captured from {recorded.describe()}; this is "
            f"{current.describe()}: resuming would skip this slot's changes ({fix})"
        )
    if resume_lsn > wal_end:
        raise ResumeRefused(
            f"{directory} resumes at {format_lsn(resume_lsn)}, ahead of this server's WAL end "
            f"{format_lsn(wal_end)}: it was captured from another server or an older copy of "
            f"this one ({fix})"
        )
    rows = execute(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots "
        f"WHERE slot_name = {quote_literal(current.slot)}"
    )
    if not rows and not temporary:  # a temporary slot is made anew by every session
        raise ResumeRefused(
            f"slot {current.slot} does not exist any more, so the changes since {directory}'s "
            f"durable position {format_lsn(resume_lsn)} are gone (take a new snapshot into a "
            "new --out directory)"
        )
    confirmed = parse_lsn(rows[0][0]) if rows and rows[0][0] else None
    if confirmed is not None and confirmed > resume_lsn:
        raise ResumeRefused(
            f"slot {current.slot} is confirmed up to {format_lsn(confirmed)}, past "
            f"{directory}'s durable position {format_lsn(resume_lsn)}: the changes between "
            "were consumed elsewhere (another client of the slot, or a slot dropped and "
            "re-created under this name) and cannot be captured again (take a new snapshot "
            "into a new --out directory)"
        )
    if recorded is not None and recorded.timeline != current.timeline:
        return (
            f"the server's timeline is {current.timeline}, {directory} was captured on "
            f"{recorded.timeline} (a promoted standby or a restore of the same system): "
            "continuing on the new timeline"
        )
    return None


def current_identity(system_id, timeline, database, slot, recorded, created) -> SourceIdentity:
    """This server's identity for ``slot``; the slot's creation point is the one pgcdc saw:
    now (``created``, a SlotInfo) or when the directory began (``recorded``)."""
    if created is not None:
        at = created.consistent_point
    elif recorded is not None and recorded.slot == slot:
        at = recorded.slot_created_at
    else:
        at = None
    return SourceIdentity(str(system_id), int(timeline), database, slot, at)
