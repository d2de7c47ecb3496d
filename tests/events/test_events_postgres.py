"""Change events against real PostgreSQL 15-18: replaying the events rebuilds the tables.

Per server (one per version, module scope): the workload in tests/postgres/cdc_workload.py
runs step by step; after each step the test records the WAL position and every table as the
server renders it (``SELECT to_jsonb(t)::text FROM t``). Then one two-phase slot is peeked
with every option set: text and binary, protocols 1-4, streaming off / on / parallel (with
debug_logical_replication_streaming = immediate on 16+, so every transaction streams), each
through the publication with and without publish_via_partition_root. The events are
replayed into a small key-value store, in order; at each step's WAL position the store must
equal the server's tables. Buffers spill to disk past 32 kB, so spilling runs on real data.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

import pgoutput_codec as pgc
from pgcdc.capture import files as sources
from pgcdc.events.jsonlines import EventRenderer
from pgcdc.events.reader import EventReader
from tests.postgres import capture, servers
from tests.postgres import cdc_workload as wl
from tests.postgres.capture import Options

TWO_PHASE_SLOT = "cdc_2pc"
PLAIN_SLOT = "cdc_plain"


def combos(major: int):
    """(label, slot, Options) for every option set the server supports."""
    top = 4 if major >= 16 else 3
    origin = "any" if major >= 16 else None
    out = []
    for pv in range(1, top + 1):
        modes = ["off"] + (["on"] if pv >= 2 else []) + (["parallel"] if pv >= 4 else [])
        for streaming in modes:
            for binary in (False, True):
                pub = wl.PUB_ROOT if binary else wl.PUB_LEAF
                label = f"proto{pv}-{'binary' if binary else 'text'}-{streaming}-{pub}"
                out.append(
                    (
                        label,
                        TWO_PHASE_SLOT,
                        Options(pv, binary, streaming, origin=origin, publication=pub),
                    )
                )
    # a slot without two-phase: prepared transactions arrive whole at COMMIT PREPARED
    out.append(
        (
            f"proto{top}-text-on-{wl.PUB_ROOT}-no-two-phase",
            PLAIN_SLOT,
            Options(top, False, "on", origin=origin, publication=wl.PUB_ROOT),
        )
    )
    return out


PARAMS = [
    pytest.param(key, label, id=f"{key}-{label}")
    for key in servers.SERVER_KEYS
    for label, _, _ in combos(int(key[2:]))
]


class Run:
    """One server's workload: step boundaries with the server's tables, and the captures."""

    def __init__(self, major):
        self.major = major
        self.steps: list[tuple[str, int, dict]] = []
        self.captures: dict[str, tuple[Options, list]] = {}


def snapshot(conn) -> dict[str, list[str]]:
    out = {}
    for table in wl.KEYS:
        rows = conn.execute(f"SELECT to_jsonb(t)::text FROM {table} t").fetchall()
        out[table] = sorted(canonical(json.loads(r[0], parse_float=Decimal)) for r in rows)
    return out


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


_runs: dict[str, Run] = {}


def server_run_for(pg, key: str) -> Run:
    """Start the server, run the workload, capture every option set, stop the server; once
    per server for the whole module (the captures hold all the tests need)."""
    if key not in _runs:
        _runs.clear()  # one server's captures in memory at a time
        _runs[key] = _capture_run(pg, key)
    return _runs[key]


def _capture_run(pg, key: str) -> Run:
    with pg.database(key) as srv, srv.connect() as conn, srv.connect() as other:
        for stmt in wl.SCHEMA:
            conn.execute(stmt)
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)",
            [TWO_PHASE_SLOT],
        )
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false)",
            [PLAIN_SLOT],
        )
        run = Run(srv.major)
        for name, statements in wl.STEPS:
            wl.run_step(conn, other, statements)
            lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            run.steps.append((name, capture.lsn_to_int(lsn), snapshot(conn)))
        # a non-transactional message is flushed only with the next commit (15/16)
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE flush_marker ()")
        conn.execute("COMMIT")
        for label, slot, opts in combos(srv.major):
            run.captures[label] = (opts, capture.sql_capture(conn, slot, opts))
    return run


class Replay:
    """A key-value store fed with events, the way a simple sink would apply them."""

    def __init__(self):
        self.tables: dict[str, dict] = {t: {} for t in wl.KEYS}
        self.columns: dict[str, tuple] = {}
        self.render = EventRenderer().render
        self._bag = 0

    def key(self, table, row):
        cols = wl.KEYS[table]
        if cols is None:  # no identity: insert-only, every row distinct
            self._bag += 1
            return self._bag
        return tuple(canonical(row[c]) for c in cols)

    def apply(self, ev):
        if ev.op not in ("c", "u", "d", "t"):
            return
        table = ev.relation.table
        rows = self.tables[table]
        names = ev.relation.names
        if self.columns.get(table) != names:  # ALTER TABLE: the rows take the new shape
            for k, row in rows.items():
                rows[k] = {c: row.get(c) for c in names}
            self.columns[table] = names
        line = json.loads(self.render(ev), parse_float=Decimal)
        if ev.op == "t":
            rows.clear()
        elif ev.op == "c":
            rows[self.key(table, line["after"])] = line["after"]
        elif ev.op == "u":
            old = self.key(table, line["before"] or line["after"])
            assert old in rows, f"update of a row the replay does not have: {line}"
            prev = rows.pop(old)
            row = line["after"]
            for c in ev.unchanged:  # unchanged TOAST: keep the value we have
                assert c not in row
                row[c] = prev[c]
            rows[self.key(table, row)] = row
        else:
            old = self.key(table, line["before"])
            assert old in rows, f"delete of a row the replay does not have: {line}"
            del rows[old]

    def state(self, table) -> list[str]:
        return sorted(canonical(r) for r in self.tables[table].values())


@pytest.mark.parametrize(("key", "label"), PARAMS)
def test_replayed_events_rebuild_the_tables_after_every_step(pg, key, label, tmp_path):
    server_run = server_run_for(pg, key)
    opts, records = server_run.captures[label]
    tags = {r.data[:1] for r in records}
    if opts.streaming != "off":
        assert b"S" in tags and b"A" in tags, f"{label}: nothing streamed or aborted"
    if label.endswith("no-two-phase"):
        assert not tags & {b"b", b"p", b"K", b"r"}
    else:
        assert tags & {b"P", b"p"} and b"K" in tags and b"r" in tags, f"{label}: no 2PC"
    # read as a user reads a capture file: in chunks (column-wise runs, the message path
    # for the rest), so the server checks both
    path = tmp_path / "capture.pgcap"
    pgc.capture.write(path, records)
    reader = EventReader(memory_limit=32 << 10, transaction_events=True)
    events = reader.read_chunks(sources.iter_chunks(path))
    replay = Replay()
    leaf = opts.publication == wl.PUB_LEAF
    tables = [t for t in wl.KEYS if t not in (wl.ROOT_ONLY if leaf else wl.LEAF_ONLY)]
    pending = next(events, None)
    ops = set()
    keys = []
    for name, boundary, truth in server_run.steps:
        # the boundary is where the next record starts: a commit there belongs to the next step
        while pending is not None and pending.commit_lsn < boundary:
            replay.apply(pending)
            ops.add(pending.op)
            pending = next(events, None)
        for table in tables:
            assert replay.state(table) == truth[table], (
                f"{label}, after step {name!r}: table {table} differs from the server"
            )
    assert pending is None, f"{label}: events after the last step: {pending}"
    assert reader.pending() is None
    assert ops >= {"c", "u", "d", "t", "m", "begin", "end"}
    assert keys == sorted(keys) and len(set(keys)) == len(keys), "order keys not a total order"
    assert reader.budget.spilled_bytes > 0  # the big transactions went through the disk
