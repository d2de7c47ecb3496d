"""Checks before streaming, so that common set-up mistakes end with one line naming the fix
(the server itself only notices a missing publication when the first change is decoded)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
