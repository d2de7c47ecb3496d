"""Checks before streaming, so that common set-up mistakes end with one line naming the fix
(the server itself only notices a missing publication when the first change is decoded)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pgcdc.lsn import format_lsn, parse_lsn
from pgcdc.capture.walsender import CaptureError, quote_literal

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


# --- the slot's health: invalidated slots ----------------------------------------------------

# invalidation_reason (PostgreSQL 17+; wal_status 'lost' alone on 15 and 16) -> what happened,
# the setting that decides it, and what to do so it does not happen again
_INVALIDATIONS = {
    "wal_removed": (
        "the server removed WAL the slot still needed: it fell further behind than "
        "max_slot_wal_keep_size",
        "max_slot_wal_keep_size",
        "raise max_slot_wal_keep_size (-1: no limit, watch the disk) and keep the capture "
        "running (pgcdc status shows safe_wal_size, the headroom left)",
    ),
    "idle_timeout": (
        "the slot was not used for longer than idle_replication_slot_timeout",
        "idle_replication_slot_timeout",
        "raise idle_replication_slot_timeout (0 turns it off) and keep the capture running",
    ),
    "rows_removed": (
        "the primary removed catalog rows the slot still needed (a slot on a standby)",
        "hot_standby_feedback",
        "set hot_standby_feedback = on on the standby, with a physical slot on the primary "
        "(primary_slot_name)",
    ),
    "wal_level_insufficient": (
        "the primary's wal_level is below logical (a slot on a standby)",
        "wal_level",
        "set wal_level = logical on the primary and restart it",
    ),
}


class SlotInvalidated(CaptureError):
    """The slot exists but the server invalidated it: it can never be read again (never
    retried). ``health`` is the :class:`SlotHealth` that says so."""

    def __init__(self, message: str, health: SlotHealth):
        super().__init__(message, sqlstate="55000")
        self.health = health


@dataclass(frozen=True)
class SlotHealth:
    """A replication slot as ``pg_replication_slots`` shows it, read the same way on every
    supported server (15: no ``conflicting``; 16: no ``invalidation_reason``; 17+: both,
    and ``failover``). ``exists`` False: every other field is None."""

    slot: str
    exists: bool
    wal_status: str | None = None  # reserved, extended, unreserved or lost
    invalidation_reason: str | None = None  # as the server says (17+), else inferred
    safe_wal_size: int | None = None  # bytes before the slot is cut; None: no limit
    retained_bytes: int | None = None  # pg_current_wal_lsn() - restart_lsn (primary only)
    restart_lsn: int | None = None
    confirmed_flush_lsn: int | None = None
    active_pid: int | None = None
    plugin: str | None = None
    slot_type: str | None = None
    temporary: bool | None = None
    failover: bool | None = None  # None: the server has no failover slots (before 17)
    synced: bool | None = None  # synchronized from the primary (a standby's copy, 17+)
    in_recovery: bool = False
    settings: dict | None = None  # max_slot_wal_keep_size, idle_replication_slot_timeout

    @property
    def invalidated(self) -> bool:
        return self.exists and (
            self.wal_status == "lost" or self.invalidation_reason not in (None, "", "none")
        )

    @property
    def reason(self) -> str | None:
        """Why the slot was invalidated (None when it was not)."""
        if not self.invalidated:
            return None
        return self.invalidation_reason or "wal_removed"  # 15/16: lost means removed WAL

    def to_json(self) -> dict:
        doc = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("restart_lsn", "confirmed_flush_lsn"):
            doc[k] = None if doc[k] is None else format_lsn(doc[k])
        doc["invalidated"] = self.invalidated
        doc["reason"] = self.reason
        return doc

    def invalidation_message(
        self,
        directory: str | None = None,
        resume_lsn: int | None = None,
        position: str = "durable position",
    ) -> str:
        """One line: what happened, the setting to raise, and that the changes since the
        consumer's position are gone (the tables need a re-snapshot). ``directory``'s
        ``position`` (``resume_lsn``) names it: a capture's durable position, a sync's
        applied position."""
        reason = self.reason or "unknown"
        what, setting, fix = _INVALIDATIONS.get(
            reason,
            (f"the server invalidated it ({reason})", None, "see the server log"),
        )
        now = (self.settings or {}).get(setting) if setting else None
        if now not in (None, ""):
            what += f" ({setting} is {now} now)"
        since = (
            f"{directory}'s {position} {format_lsn(resume_lsn)}"
            if directory is not None and resume_lsn
            else "the consumer's last position"
        )
        return (
            f'replication slot "{self.slot}" was invalidated by the server (wal_status '
            f"{self.wal_status}, reason {reason}): {what}; the changes since {since} are gone "
            f"and the tables need a re-snapshot (fix: {fix}; then drop the slot, "
            f"SELECT pg_drop_replication_slot({quote_literal(self.slot)}), create it again and "
            "take a new snapshot into a new --out directory)"
        )


_HEALTH_SQL = (
    "SELECT to_jsonb(s)::text, pg_is_in_recovery(), "
    "CASE WHEN pg_is_in_recovery() THEN NULL "
    "ELSE (pg_current_wal_lsn() - s.restart_lsn)::bigint END, "
    "current_setting('max_slot_wal_keep_size', true), "
    "current_setting('idle_replication_slot_timeout', true) "
    "FROM pg_replication_slots s WHERE s.slot_name = {slot}"
)


def slot_health(execute: Execute, slot: str) -> SlotHealth:
    """The health of ``slot`` through ``execute`` (a walsender connection's, or any SQL
    connection's rows as text): whether it exists, its wal_status, why it was invalidated,
    the headroom before it would be (safe_wal_size) and the WAL it holds back."""
    import json

    rows = execute(_HEALTH_SQL.format(slot=quote_literal(slot)))
    if not rows:
        return SlotHealth(slot, False)
    doc_text, recovery, retained, keep, idle = rows[0]
    doc = json.loads(doc_text)

    def lsn(key):
        v = doc.get(key)
        return parse_lsn(v) if v else None

    def num(v):
        return None if v in (None, "") else int(v)

    reason = doc.get("invalidation_reason")
    if reason is None and doc.get("conflicting") and doc.get("wal_status") != "lost":
        reason = "rows_removed"  # 16: a conflict on a standby, the reason not shown
    return SlotHealth(
        slot,
        True,
        wal_status=doc.get("wal_status"),
        invalidation_reason=reason,
        safe_wal_size=num(doc.get("safe_wal_size")),
        retained_bytes=num(retained),
        restart_lsn=lsn("restart_lsn"),
        confirmed_flush_lsn=lsn("confirmed_flush_lsn"),
        active_pid=num(doc.get("active_pid")),
        plugin=doc.get("plugin"),
        slot_type=doc.get("slot_type"),
        temporary=doc.get("temporary"),
        failover=doc.get("failover"),
        synced=doc.get("synced"),
        in_recovery=recovery in (True, "t", "true"),
        settings={"max_slot_wal_keep_size": keep, "idle_replication_slot_timeout": idle},
    )


def check_slot_valid(
    execute: Execute, slot: str, directory: str | None = None, resume_lsn: int | None = None
) -> SlotHealth:
    """The slot's health; SlotInvalidated (one line: reason, setting, re-snapshot) when the
    server invalidated it."""
    health = slot_health(execute, slot)
    if health.invalidated:
        raise SlotInvalidated(health.invalidation_message(directory, resume_lsn), health)
    return health
