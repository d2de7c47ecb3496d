"""What ``pgcdc sync`` runs: one command from a database to current Delta tables: the
initial snapshot, a durable capture of the slot, and an apply of what it captured every
``--trigger``. ``Sync(SyncConfig(...), log).run()``; :mod:`pgcdc.cli.sync` builds the
:class:`SyncConfig` from its options.

::

    pgcdc sync --dsn "host=db dbname=app user=cdc" --publication app_pub --slot cdc \\
        --out tables/ [--trigger 5s] [--master URL] [--scd 1|2] [--heartbeat SECONDS] \\
        [--metrics [HOST:]PORT] [--log-format auto|text|json] [--once]

``DIR`` (``--out``) holds everything of one pipeline (see docs/sync.md):

- ``DIR/_capture/``: the capture directory (``pgcdc capture --out``): the durable log of the
  slot; the slot is confirmed only up to what is durable there and what the tables hold
  (``DIR/_applied.lsn``, written after each cycle's commits);
- ``DIR/_snapshot/``: the initial snapshot (``pgcdc snapshot --out``), taken on the first run
  when the slot does not exist yet (creating it, aligned with the snapshot);
- ``DIR/<schema>.<table>/``: the Delta tables, and ``DIR/_pgcdc_state.json``: apply's state
  (``pgcdc apply _capture --out DIR --snapshot _snapshot``);
- ``DIR/_snapshot_added/<consistent point>/``: snapshots of tables added to the publication
  later, each taken at a temporary slot's exported snapshot in a thread while the other
  tables' cycles go on, and swapped into its Delta table in one commit (built in
  ``DIR/_stage_added/``); also a table dropped and created again, removed from the
  publication and added back (``DIR/_published.json``), or whose columns changed in a way no
  change carries (:mod:`pgcdc.sync.added`). A snapshot's rows are deleted once loaded and
  the segments after it pruned;
- ``DIR/_columns.json``: each table's columns as its Delta table holds them, recorded at each
  check (:mod:`pgcdc.sync.drift`: columns changed with no change of the table since are
  brought in place, or the table's snapshot taken again);
- ``DIR/_sync.lock``: held (flock) by the running sync and its capture process;
- ``DIR/_set_aside.json``: tables that could not be applied, set aside while the others go
  on, and ``DIR/_resnapshot/``: the snapshots ``pgcdc resnapshot`` asked for to take them
  up again (:mod:`pgcdc.sync.aside`);
- ``DIR/_sync.log``: sync's warnings and errors, each error whole (stderr has one line), and
  the JVM's log (:mod:`pgcdc.sync.logfile`);
- ``DIR/_checkpoint/``: with ``--engine streaming``, the checkpoint of the Structured Streaming
  query whose micro-batches are the cycles (:mod:`pgcdc.sync.query`).

The capture runs in a child process (:mod:`pgcdc.sync.child`) in a session of its own,
while this process runs Spark and applies every ``--trigger``; exactly once comes from the
durable log and apply's per-table applied position, not from the two agreeing on anything.
A table that cannot be applied is set aside and the others go on (:mod:`pgcdc.sync.aside`).
Ctrl-C or SIGTERM: the capture stops at its next boundary (durable), the running apply finishes
(``--stop-timeout``, then it is cancelled and its tables stay at their last commit), exit 0;
a second signal cancels at once. Killed (SIGKILL) at any point, a rerun converges: the capture
resumes from its state.json, apply from its tables' positions. ``--once``: the capture stops
at the server's WAL position read at the start, and sync once the tables hold it (the slot and
the directory kept: the next run goes on from there). :meth:`Sync.run` raises
:class:`pgcdc.errors.SetupError` for set-up that retrying cannot fix (one line naming the fix),
the slot invalidated or dropped, the capture given up (the command's exit 2);
:class:`pgcdc.errors.DataError` for a cycle that fails for no one table (exit 1); what it has
said already is ``Sync.said``. With ``--on-invalid-slot resync``, an invalidated or dropped
slot is created again instead, with a new snapshot swapped into each table in one Delta commit
(:mod:`pgcdc.sync.resync`).
"""

from pgcdc.errors import SetupError
from pgcdc.sync.child import PROG, capture_child
from pgcdc.sync.config import SyncConfig

__all__ = ["PROG", "SetupError", "Sync", "SyncConfig", "capture_child"]


def __getattr__(name: str):
    # the capture child imports this package (pgcdc.sync.child) at its start: the pipeline's
    # imports (apply's, 0.2 s) are not its own
    if name == "Sync":
        from pgcdc.sync.pipeline import Sync  # lazy: the capture child's start

        return Sync
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
