"""Helpers the spec's field semantics add beside raw values: LSN text and datetimes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

__all__ = ["PG_EPOCH", "PG_EPOCH_UNIX_US", "lsn_text", "pg_datetime"]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
#: PG_EPOCH in microseconds since the Unix epoch (946_684_800_000_000): what a PostgreSQL
#: timestamp (microseconds since 2000-01-01 UTC) needs added to be a Unix one
PG_EPOCH_UNIX_US = int(PG_EPOCH.timestamp()) * 1_000_000


def lsn_text(lsn: int) -> str:
    """An LSN the way PostgreSQL prints it, e.g. 16/B374D848."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def pg_datetime(micros: int) -> datetime:
    """A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as an aware datetime.

    Raises OverflowError for PostgreSQL's ±infinity and other values outside datetime's
    range (years 1 to 9999); the raw integer is always there beside it."""
    return PG_EPOCH + timedelta(microseconds=micros)
