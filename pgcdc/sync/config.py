"""What one ``pgcdc sync`` is asked to do (:class:`SyncConfig`, built by :mod:`pgcdc.cli.sync`
from its options, as :class:`pgcdc.capture.runner.CaptureConfig` is by ``pgcdc capture``),
and where it keeps things in its directory (``DIR``, ``--out``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgcdc.capture.metrics import parse_address
from pgcdc.errors import SetupError

# the capture directory (pgcdc capture --out) and what the tables hold (the capture confirms
# the slot no further): named where pgcdc status reads them
from pgcdc.status import SYNC_APPLIED as APPLIED
from pgcdc.status import SYNC_CAPTURE as CAPTURE
from pgcdc.sync.pace import TABLES_CHECK_SECONDS

__all__ = [
    "APPLIED", "CAPTURE", "CHECKPOINT", "LOCK", "RETAIN_LEAST", "SNAPSHOT", "STATE",
    "SetupError", "SyncConfig", "scd2_refusal",
]  # fmt: skip

# the layout of DIR (the others: ADDED and LOADED in pgcdc.sync.added, the resync's in
# pgcdc.sync.resync, the set-aside tables' in pgcdc.status)
SNAPSHOT = "_snapshot"  # the initial snapshot (pgcdc snapshot --out)
LOCK = "_sync.lock"  # held (flock) by the running sync and its capture process
STATE = "_pgcdc_state.json"  # apply's summary of the tables (pgcdc.apply.state.STATE_FILE)
CHECKPOINT = "_checkpoint"  # --engine streaming: the query's checkpoint

RETAIN_LEAST = 0.1  # hours: --retain's least but 0 (a reader of a version may take minutes)


@dataclass(frozen=True)
class SyncConfig:
    """What to sync and how; the fields are ``pgcdc sync``'s options."""

    publication: str  # publication name(s), comma-separated
    slot: str  # the logical replication slot (created with the snapshot on the first run)
    out: str  # DIR: the capture, the snapshots and the Delta tables <schema>.<table>/
    dsn: str = ""  # libpq connection string or URI (empty: the PG* environment)
    trigger: float = 5.0  # seconds between two cycles of apply (a burst's start sooner)
    tables_check: float = TABLES_CHECK_SECONDS  # seconds between two looks at the tables
    master: str = "local[*]"  # Spark master URL
    scd: int = 1  # 1: current state, 2: history
    heartbeat: float | None = None  # seconds between the capture's heartbeats (None: off)
    metrics: str | None = None  # [HOST:]PORT of the Prometheus endpoint (None: off)
    failover: bool = False  # make the slot a failover slot (PostgreSQL 17+)
    retain: float = 24.0  # hours a version's data files are kept (vacuum; 0: never)
    keep_segments: bool = False  # keep the capture's segments once applied
    stop_timeout: float = 30.0  # seconds a stop lets the running apply finish
    on_invalid_slot: str = "fail"  # a slot invalidated or dropped: "fail" or "resync"
    engine: str = "streaming"  # "streaming" (a Structured Streaming query) or "loop"
    once: bool = False  # stop once the tables hold the server's WAL position at the start
    fsync: bool = True  # the capture fsyncs what it makes durable (off: tests only)

    @property
    def pubs(self) -> list[str]:
        """The publications, one name each."""
        return [x.strip() for x in self.publication.split(",") if x.strip()]

    @property
    def dir(self) -> Path:
        return Path(self.out)

    @property
    def capture_dir(self) -> Path:
        return self.dir / CAPTURE

    @property
    def snapshot_dir(self) -> Path:
        return self.dir / SNAPSHOT

    @property
    def loop(self) -> bool:
        """Whether the driver's own cycles run the live path (``--engine loop``, and
        ``--once``, which stops after the cycle that reaches its point: no query)."""
        return self.engine == "loop" or self.once

    def check(self) -> None:
        """SetupError for options that cannot work together."""
        if not self.pubs:
            raise SetupError("--publication needs at least one name")
        if self.on_invalid_slot == "resync" and self.scd == 2:
            raise SetupError(scd2_refusal())
        if self.heartbeat is not None and self.heartbeat <= 0:
            raise SetupError("--heartbeat must be positive (seconds between heartbeats)")
        if self.retain != 0 and not self.retain >= RETAIN_LEAST:
            raise SetupError(f"--retain is hours, {RETAIN_LEAST:g} at least (a reader of a "
                             "version may take minutes), or 0 to keep every file")  # fmt: skip
        if self.metrics is not None:
            try:
                parse_address(self.metrics)
            except ValueError as e:
                raise SetupError(str(e)) from None


def scd2_refusal() -> str:
    return ("--on-invalid-slot resync works with --scd 1 only: a resync replaces the tables "
            "by a new snapshot, and SCD2 history tables would miss the versions of the rows "
            "changed while the slot was lost (their history cannot be completed from the "
            "server)")  # fmt: skip
