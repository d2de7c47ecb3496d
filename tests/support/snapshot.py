"""The snapshot workload: its schema, a writer that keeps changing the tables, the server's state
and the replay of changes over a snapshot (tests/snapshot/,
tests/apply/test_apply_snapshot.py)."""

from __future__ import annotations

import json
import random
import threading
from decimal import Decimal
from pgcdc.cli import capture as capture_cli
from pgcdc.events.reader import EventReader
from pgcdc.capture.files import iter_records
import datetime as dt
from pathlib import Path
import pyarrow.parquet as pq  # noqa: E402


PUB = "snap_pub"


SLOT = "snap_slot"


SCHEMA = [
    "CREATE TABLE acct (id int PRIMARY KEY, bal numeric(12,2), note text, ts timestamptz,"
    " tags text[])",
    "CREATE TABLE log_full (id int NOT NULL, msg text)",
    "ALTER TABLE log_full REPLICA IDENTITY FULL",
    """CREATE TABLE reg (id int NOT NULL, region text NOT NULL, v int,
        PRIMARY KEY (id, region)) PARTITION BY LIST (region)""",
    "CREATE TABLE reg_a PARTITION OF reg FOR VALUES IN ('a')",
    "CREATE TABLE reg_b PARTITION OF reg FOR VALUES IN ('b')",
    "CREATE TABLE filtered (id int PRIMARY KEY, v int, secret text)",
    "CREATE TABLE unpublished (id int PRIMARY KEY)",
    f"""CREATE PUBLICATION {PUB} FOR TABLE acct, log_full, reg,
        filtered (id, v) WHERE (id % 3 <> 0) WITH (publish_via_partition_root = true)""",
]


PRELOAD = [
    """INSERT INTO acct SELECT g, g * 1.25, CASE WHEN g % 7 = 0 THEN NULL
        ELSE 'note ' || g || E'\\ttab\\\\slash\\nline' END,
        CASE WHEN g % 11 = 0 THEN 'infinity'::timestamptz
             ELSE '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 minute' END,
        ARRAY['t' || (g % 5), NULL] FROM generate_series(1, 20000) g""",
    "INSERT INTO log_full SELECT g % 500, 'm' || g FROM generate_series(1, 2000) g",
    "INSERT INTO reg SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, g"
    " FROM generate_series(1, 3000) g",
    "INSERT INTO filtered SELECT g, g, 's' || g FROM generate_series(1, 3000) g",
    "INSERT INTO unpublished SELECT g FROM generate_series(1, 100) g",
]


# The truth, written by hand from the publication's definition: table -> (key, query)
TRUTH = {
    "public.acct": (("id",), "SELECT to_jsonb(t)::text FROM acct t"),
    "public.log_full": (None, "SELECT to_jsonb(t)::text FROM log_full t"),
    "public.reg": (("id", "region"), "SELECT to_jsonb(t)::text FROM reg t"),
    "public.filtered": (
        ("id",),
        "SELECT to_jsonb(t)::text FROM (SELECT id, v FROM filtered WHERE id % 3 <> 0) t",
    ),
}


def canonical(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)


def server_state(conn) -> dict[str, list[str]]:
    out = {}
    for name, (_, query) in TRUTH.items():
        rows = conn.execute(query).fetchall()
        out[name] = sorted(canonical(json.loads(r[0], parse_float=Decimal)) for r in rows)
    return out


def setup_schema(conn) -> None:
    for stmt in SCHEMA + PRELOAD:
        conn.execute(stmt)
    conn.execute("ANALYZE")


class Writer(threading.Thread):
    """Small random transactions on every published table until stopped."""

    def __init__(self, conninfo: str, seed: int = 15):
        super().__init__(daemon=True)
        self.conninfo = conninfo
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.count = 0
        self.error: BaseException | None = None
        self.next_id = 100_000

    def statements(self) -> list[str]:
        r = self.rng
        out = []
        for _ in range(r.randint(1, 4)):
            k = r.randint(1, 20000)
            self.next_id += 1
            n = self.next_id
            out.append(
                r.choice(
                    [
                        f"UPDATE acct SET bal = bal + 1, note = 'w{n}' WHERE id = {k}",
                        f"INSERT INTO acct VALUES ({n}, {n}.5, 'new', now(), '{{x}}')",
                        f"DELETE FROM acct WHERE id = {k}",
                        f"INSERT INTO log_full VALUES ({k % 500}, 'w{n}')",
                        f"UPDATE log_full SET msg = 'u{n}' WHERE id = {k % 500}",
                        f"DELETE FROM log_full WHERE id = {k % 500}",
                        f"UPDATE reg SET region = CASE region WHEN 'a' THEN 'b' ELSE 'a' END"
                        f" WHERE id = {k % 3000}",
                        f"UPDATE reg SET v = v + 1 WHERE id = {k % 3000}",
                        f"INSERT INTO reg VALUES ({n}, 'a', 0)",
                        f"DELETE FROM reg WHERE id = {k % 3000}",
                        f"INSERT INTO filtered VALUES ({n}, {n}, 'x')",
                        f"UPDATE filtered SET v = v + 1, secret = 'y' WHERE id = {k % 3000}",
                        f"DELETE FROM filtered WHERE id = {k % 3000}",
                    ]
                )
            )
        return out

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    with conn.transaction():
                        for stmt in self.statements():
                            conn.execute(stmt)
                    self.count += 1
        except BaseException as e:  # reported by the test
            self.error = e

    def wait_for(self, n: int) -> None:
        target = self.count + n
        while self.count < target and self.is_alive():
            self.stop_event.wait(0.01)
        assert self.error is None, self.error

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        assert self.error is None, self.error


def replay(rows_by_table: dict[str, list[dict]], events) -> dict[str, list[str]]:
    """Apply change events to the snapshot rows, by key (the whole row without one)."""
    from pgcdc.events.jsonlines import EventRenderer

    render = EventRenderer().render
    state: dict[str, dict] = {}
    for name, rows in rows_by_table.items():
        key_cols = TRUTH[name][0]
        st = state[name] = {}
        for row in rows:
            k = canonical({c: row[c] for c in key_cols}) if key_cols else canonical(row)
            st.setdefault(k, []).append(row)

    def key_of(name, row):
        key_cols = TRUTH[name][0]
        return canonical({c: row[c] for c in key_cols}) if key_cols else canonical(row)

    for ev in events:
        if ev.op not in ("c", "u", "d", "t"):
            continue
        name = ev.relation.qualified_name
        st = state[name]
        line = json.loads(render(ev), parse_float=Decimal)
        if ev.op == "t":
            st.clear()
            continue
        if ev.op in ("u", "d"):
            old = key_of(name, line["before"] or line["after"])
            assert st.get(old), f"{ev.op} of a row the snapshot does not have: {line}"
            st[old].pop()
            if not st[old]:
                del st[old]
        if ev.op in ("c", "u"):
            assert not ev.unchanged, line
            st.setdefault(key_of(name, line["after"]), []).append(line["after"])
    return {
        n: sorted(canonical(r) for rows in st.values() for r in rows) for n, st in state.items()
    }


def changes_since(srv, tmp_path, end_lsn: str, consistent_point: int):
    """(capture directory, events): the slot read by `pgcdc capture` up to end_lsn; every
    change committed after the snapshot's consistent point."""
    capdir = tmp_path / "capture"
    code = capture_cli.main(
        ["--dsn", srv.conninfo(), "--slot", SLOT, "--publication", PUB, "--out",
         str(capdir), "--until-lsn", end_lsn, "--log-format", "json", "--no-fsync"]
    )  # fmt: skip
    assert code == 0
    events = list(EventReader().read(iter_records(capdir)))
    # the slot sends a transaction whose commit record starts at the point or later (the
    # first one after a busy snapshot can start exactly there: seen in CI), the snapshot holds
    # the ones before it
    assert events and min(e.commit_lsn for e in events) >= consistent_point
    return capdir, events


def _jsonish(value):
    """A Parquet value in the form the server's to_jsonb gives after json.loads."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # timestamp without time zone
            value = value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc).isoformat()
    if isinstance(value, list):
        return [_jsonish(v) for v in value]
    return value


def _normal_ts(row: dict) -> dict:
    # to_jsonb trims trailing zeros of fractional seconds; compare instants, not spellings
    ts = row.get("ts")
    if isinstance(ts, str) and ts[:1].isdigit():
        row = dict(row, ts=dt.datetime.fromisoformat(ts).isoformat())
    return row


def parquet_rows(path) -> tuple[list[dict], set]:
    """The rows of a snapshot table as dicts of JSON-like values, and its (lsn, ordinal)s."""
    out, order = [], set()
    for f in Path(path).glob("*.parquet"):  # timestamps as INT64 microseconds, never INT96
        schema = pq.ParquetFile(f).schema
        assert "INT96" not in {schema.column(i).physical_type for i in range(len(schema))}
    for rec in pq.read_table(path).to_pylist():
        special = dict(rec.pop("_pg_text") or {})
        order.add((rec.pop("_commit_lsn"), rec.pop("_tx_ordinal")))
        row = {k: special.get(k, _jsonish(v)) for k, v in rec.items()}
        out.append(json.loads(canonical(row), parse_float=Decimal))
    return out, order


def _states_equal(got: dict[str, list[str]], want: dict[str, list[str]]) -> None:
    for name in want:
        g = sorted(canonical(_normal_ts(json.loads(r, parse_float=Decimal))) for r in got[name])
        w = sorted(canonical(_normal_ts(json.loads(r, parse_float=Decimal))) for r in want[name])
        assert g == w, name
