"""The ``pgcdc`` streaming source's batches, without Spark: rows and offsets.

- the rows built a column at a time (``events_batch``) equal the rows built event by event
  (``pgcdc.values.dumps_images`` per event, as the source did before) on a workload of many
  types (NaN, infinities, escapes, unicode, NULLs, arrays, jsonb, bytea), long runs of one
  table and short mixed ones, keys, REPLICA IDENTITY FULL, unchanged TOAST, a truncate and
  logical messages;
- offsets without a peek: ``latestOffset`` is the WAL flush position; reading a batch twice
  (a re-run after a crash, the slot advanced to the batch's start in between or not) gives
  the same rows; batches cut at flush positions taken while the workload runs cover the
  slot's events exactly once; ``maxEventsPerTrigger`` cuts at commits, and the last batch
  ends at the flush position;
- the slot's restart_lsn follows the batches (a standby snapshot logged when a batch is
  planned, where the server allows it), so a batch's walsender does not decode the batches
  before it again; a role that may not log one reads the same rows;
- with ``Trigger.AvailableNow`` the slot follows the batches Spark has committed when it asks
  for the next offset (the run's last question leaves it at the last batch's end); on other
  triggers only ``commit`` moves it.
- a non-transactional message is in one batch: one that ends exactly at a batch's end, and
  one whose record straddles a WAL page boundary that a batch was planned to (the WAL
  writer's flush position), with either transport.
"""

from __future__ import annotations

import gc
import json
import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pgcdc.lsn import format_lsn, parse_lsn  # noqa: E402
from pgcdc.streaming import read as R  # noqa: E402
from pgcdc.streaming import event_rows  # noqa: E402
from pgcdc.streaming import slot as S  # noqa: E402
from tests.postgres.slots import peeked_events  # noqa: E402
from tests.wait import until, WaitTimeout  # noqa: E402

PUB = "rows_pub"
SCHEMA = [
    "CREATE TABLE ty (id int8 PRIMARY KEY, n numeric, t text, ts timestamptz, f float8,"
    " r float4, b bool, d date, j jsonb, a int4[], by bytea, u uuid, iv interval, tm time,"
    " big text)",
    "ALTER TABLE ty ALTER big SET STORAGE external",
    "CREATE TABLE full_t (id int, msg text)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    f"CREATE PUBLICATION {PUB} FOR TABLE ty, full_t",
]
TEXTS = ["plain", 'q"uote', "back\\slash", "new\nline\ttab", "ünï €", "emoji 😀", "\x01ctl", ""]
FLOATS = ["0.1", "-1.5e300", "'NaN'", "'Infinity'", "'-Infinity'", "1e-7", "123456789.125"]
NUMS = ["0.10", "'NaN'", "-12345678901234567890.000001", "1e20", "7"]


def insert(lo: int, hi: int) -> str:
    texts = ", ".join("'" + t.replace("'", "''") + "'" for t in TEXTS)
    return (
        "INSERT INTO ty SELECT g,"
        f" (ARRAY[{', '.join(f'{x}::numeric' for x in NUMS)}])[g % {len(NUMS)} + 1],"
        f" CASE WHEN g % 9 = 0 THEN NULL ELSE (ARRAY[{texts}])[g % {len(TEXTS)} + 1] || g END,"
        " '2024-02-29 23:59:59.5+00'::timestamptz + g * interval '1.000001 second',"
        f" (ARRAY[{', '.join(f'{x}::float8' for x in FLOATS)}])[g % {len(FLOATS)} + 1],"
        " g / 3.0, g % 2 = 0, '2020-01-01'::date + g,"
        " jsonb_build_object('k', g, 's', 'x\"y', 'a', jsonb_build_array(1, 2.50, null)),"
        " ARRAY[g, NULL, -g]::int4[], decode(md5(g::text), 'hex'), md5(g::text)::uuid,"
        " g * interval '1 day 2 hours 3.5 seconds', time '12:34:56.789' + g * interval '1 ms',"
        " CASE WHEN g % 5 = 0 THEN repeat(md5(g::text), 200) END"
        f" FROM generate_series({lo}, {hi}) g"
    )


def workload(conn) -> None:
    with conn.transaction():  # long runs of one table
        conn.execute(insert(1, 120))
    with conn.transaction():  # years before 1000 and infinity: a run of another kind
        conn.execute(insert(200, 229))
        conn.execute("UPDATE ty SET ts = ts - interval '1500 years' WHERE id BETWEEN 200 AND 219")
        conn.execute("UPDATE ty SET ts = 'infinity', n = NULL WHERE id = 225")
    for i in range(121, 161):  # short mixed runs
        with conn.transaction():
            conn.execute(insert(i, i))
            conn.execute("INSERT INTO full_t VALUES (%s, %s)", [i % 4, f"m{i}"])
            conn.execute("UPDATE ty SET t = 'u' || id WHERE id = %s", [i - 100])
    with conn.transaction():
        conn.execute("UPDATE ty SET b = NOT b WHERE id <= 60")  # big unchanged where TOASTed
        conn.execute("UPDATE ty SET id = id + 1000 WHERE id BETWEEN 61 AND 90")  # key changes
        conn.execute("DELETE FROM ty WHERE id BETWEEN 91 AND 120")
        conn.execute("UPDATE full_t SET msg = msg || '!'")
        conn.execute("DELETE FROM full_t WHERE id = 1")
    conn.execute("SELECT pg_logical_emit_message(false, 'pfx', 'not in a transaction')")
    with conn.transaction():
        conn.execute("SELECT pg_logical_emit_message(true, 'pfx', '\\x00ff'::bytea)")
        conn.execute("TRUNCATE full_t")


def reference_rows(events) -> list[dict]:
    """The rows as the source built them before, event by event."""
    from pgcdc.values import dumps, dumps_images

    def text(b):
        return None if b is None else b.decode()

    rows = []
    for ev in events:
        before, after = dumps_images(ev)
        detail = None
        if ev.op == "t":
            detail = dumps({"cascade": ev.detail[0], "restart_identity": ev.detail[1]})
        elif ev.op == "m":
            prefix, content, transactional = ev.detail
            detail = dumps(
                {
                    "prefix": prefix,
                    "content": "\\x" + bytes(content).hex(),
                    "transactional": transactional,
                }
            )
        rel = ev.relation
        rows.append(
            {
                "op": ev.op,
                "schema": None if rel is None else rel.schema,
                "table": None if rel is None else rel.table,
                "before_json": text(before),
                "after_json": text(after),
                "unchanged": list(ev.unchanged),
                "detail_json": text(detail),
                "lsn": ev.lsn,
                "commit_lsn": ev.commit_lsn,
                "tx_ordinal": ev.tx_ordinal,
                "commit_time": ev.commit_time,
                "xid": ev.xid,
                "errors": [str(e) for e in ev.errors] or None,
            }
        )
    return rows


def batch_rows(batches) -> list[dict]:
    from pgcdc.runtime.semantics import PG_EPOCH_UNIX_US

    rows = []
    for b in batches:
        for r in b.to_pylist():
            t = r["commit_time"]
            if t is not None:  # back to microseconds since 2000, as the events carry it
                r["commit_time"] = round(t.timestamp() * 1e6) - PG_EPOCH_UNIX_US
            rows.append(r)
    return rows


def slot_events(conn, slot: str, major: int) -> list:
    return peeked_events(conn, slot, PUB, major, messages=True)


def stream_reader(srv, slot: str, **options):
    opts = {"dsn": srv.conninfo(), "slot": slot, "publication": PUB, "messages": "true"}
    return S.PgcdcStreamReader({**opts, **{k: str(v) for k, v in options.items()}})


def read(reader, start: int, end: int, rows: int = 10_000) -> list[dict]:
    got = R.read_batch(reader.opts, reader.plugin_options, start, end, batch_rows=rows)
    return batch_rows(got)


@pytest.fixture(scope="module")
def server(pg):
    with pg.database("pg18") as srv:
        yield srv


def test_rows_built_a_column_at_a_time_equal_event_by_event(server):
    with server.connect() as conn:
        for stmt in SCHEMA:
            conn.execute(stmt)
        conn.execute("SELECT pg_create_logical_replication_slot('rows_slot', 'pgoutput')")
        workload(conn)
        events = slot_events(conn, "rows_slot", server.major)
        want = reference_rows(events)
        assert {"c", "u", "d", "t", "m"} <= {r["op"] for r in want}
        assert any(r["unchanged"] for r in want)
        got = batch_rows([event_rows.events_batch(events)])
        assert got == want
        # the same through the slot, in batches of a few rows (runs cut anywhere), by each
        # transport
        for transport in ("walsender", "peek"):
            reader = stream_reader(server, "rows_slot", transport=transport)
            start = parse_lsn(reader.initialOffset()["lsn"])
            end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
            assert read(reader, start, end, rows=37) == want, transport
            assert gc.isenabled()  # paused while reading, on again after
            reader.stop()


# a table of the types whose text pgcdc.streaming.json_runs renders as JSON, and values each
# of which sends its run (a transaction's changes of one kind) to the exact path
RUNS_TABLE = (
    "CREATE TABLE jr (id int8 PRIMARY KEY, i2 int2, i4 int4, n numeric(12,2), nn numeric,"
    " t text, v varchar(20), c char(4), nm name, u uuid, b bool, f float8, r float4,"
    " ts timestamptz, tn timestamp, d date)"
)
RUNS_FILL = (
    "INSERT INTO jr SELECT g, (g %% 30000)::int2, -g, g * 0.01, g * 1.5 / 7, 'row ' || g || {t},"
    " 'v' || g, 'c', 'n' || g, md5(g::text)::uuid, g %% 2 = 0, {f}, g / 3.0,"
    " '2024-02-29 23:59:59.5+00'::timestamptz + g * interval '1.000001 second',"
    " '2024-01-01'::timestamp + g * interval '0.25 second', {d}"
    " FROM generate_series(%s::int, %s::int) g"
)
EXACT = {  # one value in a run, and the run takes the exact path
    "f": ["'NaN'", "1e300", "1e-7", "1e15"],
    "d": ["'0044-03-15 BC'::date", "'infinity'::date"],
}
ESCAPED = {"t": ["E'\\x01'", "'\"'"]}  # still rendered there, one by one


def test_runs_rendered_from_their_text_equal_event_by_event(server, monkeypatch):
    """``json_runs`` renders a run's JSON from the server's text: for integers, numerics,
    strings (escapes, unicode), uuid, bool, floats (integral ones, the smallest and largest
    plain ones), timestamps, dates and NULLs it equals the rows built event by event
    (``pgcdc.values.dumps_images``), and so does each run it hands to the exact path (NaN,
    exponents, a BC date, infinity)."""
    from pgcdc.streaming import json_runs

    made, real = [], json_runs.run_batch

    def run_batch(run, schema):
        batch = real(run, schema)
        made.append(batch is not None)
        return batch

    monkeypatch.setattr(json_runs, "run_batch", run_batch)
    with server.connect() as conn:
        conn.execute(RUNS_TABLE)
        conn.execute("CREATE PUBLICATION jr_pub FOR TABLE jr")
        conn.execute("SELECT pg_create_logical_replication_slot('jr_slot', 'pgoutput')")
        plain = {"t": "''", "f": "g / 7.0", "d": "'2020-01-01'::date + g"}
        lo = 1
        odd_values = [(c, x) for odd in (EXACT, ESCAPED) for c, xs in odd.items() for x in xs]
        for column, odd in [(None, None), *odd_values]:
            with conn.transaction():
                parts = dict(plain)
                if column is not None:  # the run's last row holds the odd value
                    parts[column] = f"CASE WHEN g = {lo + 99} THEN {odd} ELSE {plain[column]} END"
                conn.execute(RUNS_FILL.format(**parts), [lo, lo + 99])
            lo += 100
        with conn.transaction():  # plain values the server writes without a fraction
            conn.execute(RUNS_FILL.format(t="''", f="999999999999999 - g * 1000.0", d="NULL"),
                         [lo, lo + 99])  # fmt: skip
            conn.execute("UPDATE jr SET f = 0.0001 * (id - %s + 1), r = 123456.7, nm = NULL"
                         " WHERE id >= %s", [lo, lo])  # fmt: skip
            conn.execute("UPDATE jr SET f = '-0', r = 1 WHERE id >= %s", [lo])
        conn.execute("DELETE FROM jr WHERE id <= 100")  # key images
        events = peeked_events(conn, "jr_slot", "jr_pub", server.major)
        want = reference_rows(events)
        reader = S.PgcdcStreamReader({"dsn": server.conninfo(), "slot": "jr_slot",
                                      "publication": "jr_pub"})  # fmt: skip
        start = parse_lsn(reader.initialOffset()["lsn"])
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        got = read(reader, start, end)
        reader.stop()
    assert len(want) == (1 + len(odd_values)) * 100 + 3 * 100 + 100  # ins., upd., deletes
    assert got == want
    odd = sum(map(len, EXACT.values()))
    # the plain run rendered here, the odd ones by the exact path, and the rest here (the
    # escaped strings, the floats without a fraction, the updates, the deletes: runs of at
    # least 64 changes, as the stream's reads cut them)
    assert made[: 1 + odd] == [True] + [False] * odd and all(made[1 + odd :]), made
    assert len(made) >= 1 + odd + 4, made


@pytest.mark.parametrize("transport", ["walsender", "peek"])
def test_offsets_without_a_peek_cover_the_slot_once_and_rereads_agree(server, transport):
    t = transport[0]
    with server.connect() as conn:
        conn.execute(f"CREATE TABLE o{t} (id int PRIMARY KEY, v text)")
        conn.execute(f"CREATE PUBLICATION o{t}_pub FOR TABLE o{t}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [f"o{t}_slot"])
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [f"o{t}_twin"])
        opts = {"dsn": server.conninfo(), "slot": f"o{t}_slot", "publication": f"o{t}_pub",
                "transport": transport}  # fmt: skip
        reader = S.PgcdcStreamReader(opts)
        offsets = [reader.initialOffset()]
        for i in range(6):  # flush positions taken between (and inside) transactions
            with conn.transaction():
                conn.execute(f"INSERT INTO o{t} SELECT g, 'v' || g"
                             " FROM generate_series(%s::int, %s::int) g",
                             [i * 100, i * 100 + 49])  # fmt: skip
                offsets.append(reader.latestOffset(offsets[-1]))
                conn.execute(f"UPDATE o{t} SET v = v || '!' WHERE id % 7 = 0")
            offsets.append(reader.latestOffset(offsets[-1]))
        lsns = [parse_lsn(o["lsn"]) for o in offsets]
        assert lsns == sorted(lsns)
        got = []
        for lo, hi in zip(lsns, lsns[1:]):
            if hi <= lo:
                continue
            first = read(reader, lo, hi)
            assert read(reader, lo, hi) == first  # re-read, the slot not advanced
            reader.commit({"lsn": format_lsn(lo)})  # the slot at the batch's start
            assert read(reader, lo, hi) == first  # re-read after a crash and a commit
            got += first
        twin = S.PgcdcStreamReader({**opts, "slot": f"o{t}_twin"})
        start = parse_lsn(twin.initialOffset()["lsn"])
        whole = read(twin, start, lsns[-1])
        key = [(r["commit_lsn"], r["tx_ordinal"]) for r in got]
        assert len(key) == len(set(key)) == len(whole) > 6 * 50
        assert got == whole

        # maxEventsPerTrigger: cut at commits, the last batch up to the flush position
        limited = S.PgcdcStreamReader({**opts, "slot": f"o{t}_twin", "maxEventsPerTrigger": "150"})
        start = offsets[0]
        seen = []
        ends = []
        while True:
            end = limited.latestOffset(start, S.ReadMaxRows(150))
            if end == start:
                break
            rows = read(limited, parse_lsn(start["lsn"]), parse_lsn(end["lsn"]))
            assert rows, "a batch without rows"
            seen += rows
            ends.append(parse_lsn(end["lsn"]))
            start = end
        assert seen == whole
        assert len(ends) > 2 and ends[-1] >= lsns[-1]
        for r in (reader, twin, limited):
            r.stop()


def test_types_that_are_not_built_in_come_typed_from_text_and_binary_slots(server):
    """The source asks the server what an enum, a composite, a domain over an enum and a
    binary slot's reg* OIDs are (a side connection while it streams, the peek's own
    connection): each row's ``after_json`` equals the server's ``to_jsonb(row)``, from a text
    and a binary slot, over the walsender and the peek."""
    import json

    with server.connect() as conn:
        for stmt in (
            "CREATE TYPE smood AS ENUM ('sad', 'ok', 'happy')",
            "CREATE TYPE spair AS (a int, b text, m smood)",
            "CREATE DOMAIN snice AS smood",
            "CREATE TABLE ut (id int PRIMARY KEY, m smood, ms smood[], p spair, ps spair[],"
            ' n snice, c "char", rc regclass, rt regtype[])',
            "CREATE PUBLICATION ut_pub FOR TABLE ut",
        ):
            conn.execute(stmt)
        slots = ("ut_text", "ut_bin", "ut_text_peek", "ut_bin_peek")
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        conn.execute(
            "INSERT INTO ut VALUES (1, 'happy', '{sad,ok}', ROW(7, 'se,ven', 'ok'),"
            " ARRAY[ROW(1, 'x', 'sad')::spair, NULL], 'ok', '\\303', 'pg_class', '{int4,smood}'),"
            " (2, NULL, '{}', ROW(NULL, NULL, NULL), '{}', NULL, 'z', 'ut', NULL)"
        )
        conn.execute("ALTER TYPE smood ADD VALUE 'ecstatic'")
        conn.execute("INSERT INTO ut (id, m, ms) VALUES (3, 'ecstatic', '{ecstatic,sad}')")
        truth = {
            i: json.loads(doc)
            for i, doc in conn.execute("SELECT id, to_jsonb(ut)::text FROM ut ORDER BY id")
        }
    for slot in slots:
        opts = {"dsn": server.conninfo(), "slot": slot, "publication": "ut_pub",
                "binary": str("bin" in slot).lower(),
                "transport": "peek" if slot.endswith("peek") else "walsender"}  # fmt: skip
        reader = S.PgcdcStreamReader(opts)
        start = parse_lsn(reader.initialOffset()["lsn"])
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        rows = read(reader, start, end)
        reader.stop()
        assert [r["errors"] for r in rows] == [None] * 3, (slot, rows)
        got = {json.loads(r["after_json"])["id"]: json.loads(r["after_json"]) for r in rows}
        assert got == truth, slot


FAST = [
    "CREATE TABLE fast_t (id int8 PRIMARY KEY, n numeric(12,2), s text, ts timestamptz,"
    " f float8, r float4, b bool, d date, v varchar(20), i int2, tn timestamp)",
    "CREATE PUBLICATION fast_pub FOR TABLE fast_t",
]


def fast_insert(lo: int, hi: int, ts: str = "'2024-02-29 23:59:59.5+00'::timestamptz") -> str:
    return (
        "INSERT INTO fast_t SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE g * 1.25 END,"
        f" 'ü ' || g, {ts} + g * interval '1.000001 second', g / 3.0, g / 7.0,"
        " g % 2 = 0, '0900-01-01'::date + g, 'v' || g, (g % 30000)::int2,"
        " '1999-12-31 23:59:59'::timestamp + g * interval '1 ms'"
        f" FROM generate_series({lo}, {hi}) g"
    )


@pytest.mark.parametrize("transport", ["walsender", "peek"])
def test_typed_rows_from_raw_runs_equal_the_events_path(server, monkeypatch, transport):
    """The typed mode takes runs of changes raw from the stream and types them by Arrow
    (``TypedBatches.run_batch``); its rows equal those ``TypedBatches.batch`` makes of the
    loaded events of a peek (the exact path that test_streaming_source_typed checks against
    the server), in batches of a few rows; runs holding a value only the exact path takes
    (numeric NaN, infinity) fall back to it, and short runs are loaded as events. Over the
    peek, its rows are typed 157 at a time: runs cut across those groups too."""
    from pgcdc.streaming.typed import TypedBatches

    made = {"raw": 0, "exact": 0}
    run_batch = TypedBatches.run_batch

    def counted(self, run):
        got = run_batch(self, run)
        made["raw" if got is not None else "exact"] += 1
        return got

    monkeypatch.setattr(TypedBatches, "run_batch", counted)
    monkeypatch.setattr(R, "_PEEK_ROWS", 157)
    slot = f"fast_{transport}"
    with server.connect() as conn:
        conn.execute("DROP PUBLICATION IF EXISTS fast_pub")  # the other transport's
        conn.execute("DROP TABLE IF EXISTS fast_t")
        for stmt in FAST:
            conn.execute(stmt)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        with conn.transaction():
            conn.execute(fast_insert(1, 300))
        with conn.transaction():  # values the exact path keeps: the run falls back
            conn.execute(fast_insert(301, 400, "'infinity'::timestamptz"))
            conn.execute("UPDATE fast_t SET n = 'NaN' WHERE id BETWEEN 1 AND 80")
        for i in range(401, 421):  # short runs (loaded as events): inserts, updates, deletes
            with conn.transaction():
                conn.execute(fast_insert(i, i))
                conn.execute("UPDATE fast_t SET s = 'u' || id WHERE id = %s", [i - 300])
                conn.execute("DELETE FROM fast_t WHERE id = %s", [i - 260])
        with conn.transaction():
            conn.execute("UPDATE fast_t SET b = NOT b WHERE id <= 100")
            conn.execute("UPDATE fast_t SET id = id + 1000 WHERE id BETWEEN 101 AND 110")
            conn.execute("DELETE FROM fast_t WHERE id BETWEEN 200 AND 300")
        events = peeked_events(conn, slot, "fast_pub", server.major)
    reader = stream_reader(server, slot, publication="fast_pub", table="public.fast_t",
                           messages="false", transport=transport)  # fmt: skip
    doc = reader.opts["table_doc"] = S._describe(reader.opts)  # as streamReader does
    typed = TypedBatches(doc)
    want = batch_rows([typed.batch(typed.mine(events))])
    assert {"c", "u", "d"} <= {r["op"] for r in want}
    start = parse_lsn(reader.initialOffset()["lsn"])
    end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
    got = read(reader, start, end, rows=37)
    reader.stop()
    assert got == want
    assert made["raw"] >= 2 and made["exact"] >= 1, made


RESTART = [
    "CREATE TABLE rp (id int8 PRIMARY KEY, s text)",
    "CREATE PUBLICATION rp_pub FOR TABLE rp",
]


@pytest.mark.parametrize("role", ["postgres", "rp_plain"])
def test_the_slots_restart_point_follows_the_batches(server, role):
    """Each batch's walsender decodes again from the slot's restart_lsn, which the server
    moves only to a running-transactions record passed before a confirmed position (logged
    every 15 s of activity). A superuser's reader logs one as it plans a batch: after the
    third batch is committed, restart_lsn is past the first batch, by the server's own
    pg_replication_slots. A plain REPLICATION role cannot, and reads the same. The records
    it logs do not keep an idle slot's batches coming."""
    slot = f"rp_{role}"
    with server.connect() as conn:
        if conn.execute("SELECT to_regclass('rp')").fetchone()[0] is None:
            for stmt in RESTART:
                conn.execute(stmt)
        if role != "postgres":
            conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
            conn.execute(f"GRANT SELECT ON rp TO {role}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        opts = {"dsn": server.conninfo(user=role), "slot": slot, "publication": "rp_pub"}
        reader = S.PgcdcStreamReader(opts)
        offsets, rows = [parse_lsn(reader.initialOffset()["lsn"])], []
        first = conn.execute("SELECT coalesce(max(id), 0) FROM rp").fetchone()[0]
        for b in range(3):  # three bursts of about 2 MB of WAL, each read and committed
            for lo in range(first + b * 10_000, first + (b + 1) * 10_000, 1000):
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO rp SELECT g, repeat('x', 100) || g FROM"
                        " generate_series(%s::int8, %s::int8) g",
                        [lo + 1, lo + 1000],
                    )
            offsets.append(parse_lsn(reader.latestOffset({"lsn": format_lsn(offsets[-1])})["lsn"]))
            rows += read(reader, offsets[-2], offsets[-1])
            reader.commit({"lsn": format_lsn(offsets[-1])})
        restart = conn.execute(
            "SELECT (restart_lsn - '0/0'::pg_lsn)::int8 FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        ).fetchone()[0]
        if role == "postgres":  # (a transaction open at a record holds it at the one before)
            assert restart >= offsets[1], (format_lsn(restart), format_lsn(offsets[1]))
        # the records it logs are WAL too: an idle slot gets a batch or two of them, then none
        quiet, tries = 0, 0
        while quiet < 3:
            tries += 1
            assert tries <= 12, "the source keeps planning batches of its own records"
            end = parse_lsn(reader.latestOffset({"lsn": format_lsn(offsets[-1])})["lsn"])
            quiet = quiet + 1 if end == offsets[-1] else 0
            if end > offsets[-1]:
                rows += read(reader, offsets[-1], end)
                reader.commit({"lsn": format_lsn(end)})
                offsets.append(end)
            time.sleep(0.3)  # the WAL writer flushes within wal_writer_delay (200 ms)
        assert reader._log_snapshots is (role == "postgres")  # refused once, then not asked
        reader.stop()
    assert [r["after_json"] for r in rows] == [
        '{"id":%d,"s":"%s"}' % (i, "x" * 100 + str(i)) for i in range(first + 1, first + 30_001)
    ]


def test_an_available_now_run_leaves_the_slot_at_its_last_committed_batch(server):
    with server.connect() as conn:
        conn.execute("CREATE TABLE an (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION an_pub FOR TABLE an")
        conn.execute("SELECT pg_create_logical_replication_slot('an_slot', 'pgoutput')")

        def confirmed() -> int:
            (lsn,) = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                                  " WHERE slot_name = 'an_slot'").fetchone()  # fmt: skip
            return parse_lsn(lsn)

        conn.execute("INSERT INTO an SELECT g, 'v' || g FROM generate_series(1, 100) g")
        opts = {"dsn": server.conninfo(), "slot": "an_slot", "publication": "an_pub"}
        # as Spark drives an AvailableNow run: the target, the first batch planned (nothing
        # committed: the slot stays), run and committed, then asked again (nothing more)
        run = S.PgcdcStreamReader(opts)
        run.prepareForTriggerAvailableNow()
        start = run.initialOffset()
        created = confirmed()
        end = run.latestOffset(start)
        assert parse_lsn(end["lsn"]) > parse_lsn(start["lsn"]) == created == confirmed()
        assert len(read(run, parse_lsn(start["lsn"]), parse_lsn(end["lsn"]))) == 100
        assert run.latestOffset(end) == end
        assert confirmed() == parse_lsn(end["lsn"])
        run.stop()

        # a query on any other trigger: latestOffset leaves the slot to commit
        conn.execute("INSERT INTO an SELECT g, 'w' || g FROM generate_series(101, 150) g")
        running = S.PgcdcStreamReader(opts)
        nxt = running.latestOffset(end)
        assert running.latestOffset(nxt) == nxt
        assert confirmed() == parse_lsn(end["lsn"])
        running.commit(nxt)
        assert confirmed() == parse_lsn(nxt["lsn"])
        running.stop()


@pytest.mark.parametrize("transport", ["walsender", "peek"])
def test_a_message_ending_at_a_batch_end_is_in_that_batch_once(pg, transport):
    """A non-transactional message flushed at the end of the WAL (the last thing written, as
    a heartbeat often is) ends exactly where a batch planned then ends. Its LSN is where its
    record ends, and the next batch's walsender skips it (its record starts before that
    batch's start), so it is this batch's: the walsender transport cut it off as committing
    at the end, and it was never read."""
    with pg.database("pg18") as srv, srv.connect() as conn:
        conn.execute("CREATE TABLE m (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION {PUB} FOR TABLE m")
        conn.execute("SELECT pg_create_logical_replication_slot('ms', 'pgoutput')")
        reader = stream_reader(srv, "ms", transport=transport)
        start = parse_lsn(reader.initialOffset()["lsn"])
        conn.execute("INSERT INTO m VALUES (1)")
        (msg,) = conn.execute(  # flushed: the flush position is the message's end
            "SELECT pg_logical_emit_message(false, 'pgcdc-test', 'last', true)::text"
        ).fetchone()
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        assert end == parse_lsn(msg)
        first = [(r["op"], r["after_json"], r["detail_json"]) for r in read(reader, start, end)]
        reader.commit({"lsn": format_lsn(end)})
        conn.execute("INSERT INTO m VALUES (2)")
        later = parse_lsn(reader.latestOffset({"lsn": format_lsn(end)})["lsn"])
        second = [(r["op"], r["after_json"]) for r in read(reader, end, later)]
        reader.stop()
    assert [(op, after) for op, after, _ in first] == [("c", '{"id":1}'), ("m", None)]
    assert "pgcdc-test" in first[1][2] and "6c617374" in first[1][2]  # "last"
    assert second == [("c", '{"id":2}')]


@pytest.fixture
def pg15_or_18(pg, request, server):
    """The module's PostgreSQL 18, or a PostgreSQL 15 of the test's own."""
    if request.param == "pg18":
        yield server
    else:
        with pg.database(request.param) as srv:
            yield srv


@pytest.mark.parametrize(
    ("pg15_or_18", "transport"),
    [("pg18", "walsender"), ("pg18", "peek"), ("pg15", "walsender")],
    indirect=["pg15_or_18"],
)
def test_a_message_across_a_flushed_page_boundary_is_read_once(pg15_or_18, transport):
    """The WAL writer flushes whole pages, so the flush position a batch is planned to may
    be a page boundary inside a record. A non-transactional message whose record straddles
    it was lost: its LSN is where its record ends, past the batch's end, and the next
    batch's decoding, started at that end, skips a record that starts before it (seen
    with 1,500-byte messages written while a query ran: one lost in every few batches).
    With ``messages`` such an end is replaced by the last record end a peek sees; planned
    by a running query, with ``maxEventsPerTrigger``, and as an AvailableNow target."""
    page = 8192
    with pg15_or_18.connect() as conn:
        assert int(conn.execute("SHOW wal_block_size").fetchone()[0]) == page
        conn.execute(f"CREATE TABLE mp_{transport} (id int PRIMARY KEY)")
        conn.execute(f"CREATE PUBLICATION mp_{transport} FOR TABLE mp_{transport}")
        cases = ("running", "max_events", "available_now")
        for case in cases:
            conn.execute(f"SELECT pg_create_logical_replication_slot('mp_{case}_{transport}',"
                         " 'pgoutput')")  # fmt: skip
        conn.execute(f"INSERT INTO mp_{transport} VALUES (1)")
        sent, across = [], None
        while across is None:  # until a message's record starts before a page it ends in
            body = f"{len(sent):06d}" + "x" * 1500
            (end,) = conn.execute("SELECT pg_logical_emit_message(false, 'mp', %s)::text",
                                  [body]).fetchone()  # fmt: skip
            sent.append(body)
            end = parse_lsn(end)
            if 100 < end % page < 1000:  # a record of 1,500 bytes and more: it started before
                across = end - end % page
        conn.execute("SELECT pg_logical_emit_message(false, 'mp', 'after')")
        conn.execute(f"INSERT INTO mp_{transport} VALUES (2)")  # flushes all of it
        sent.append("after")

    for case in cases:
        opts = {"dsn": pg15_or_18.conninfo(), "slot": f"mp_{case}_{transport}",
                "publication": f"mp_{transport}", "messages": "true", "transport": transport}  # fmt: skip
        if case == "max_events":
            opts["maxEventsPerTrigger"] = "100000"
        reader = S.PgcdcStreamReader(opts)
        flush = reader._flush_lsn
        reader._flush_lsn = lambda begin=None: across  # where the WAL writer flushed to
        start = reader.initialOffset()
        if case == "available_now":
            reader.prepareForTriggerAvailableNow()
        limit = reader.getDefaultReadLimit()
        end = reader.latestOffset(start, limit)
        assert parse_lsn(end["lsn"]) != across
        rows = read(reader, parse_lsn(start["lsn"]), parse_lsn(end["lsn"]))
        reader.commit(end)
        reader._flush_lsn, reader._target = flush, None
        later = reader.latestOffset(end, limit)
        rows += read(reader, parse_lsn(end["lsn"]), parse_lsn(later["lsn"]))
        reader.stop()
        got = [bytes.fromhex(json.loads(r["detail_json"])["content"][2:]).decode()
               for r in rows if r["op"] == "m"]  # fmt: skip
        assert got == sent, (case, len(got), len(sent))
        assert [r["after_json"] for r in rows if r["op"] == "c"] == ['{"id":1}', '{"id":2}']


@pytest.mark.parametrize("transport", ["walsender", "peek"])
def test_a_batch_waits_for_a_slot_another_process_holds(server, transport):
    """A killed run's walsender may hold the slot a moment after the task that replaces it
    starts: the read waits for it (up to ``SLOT_BUSY_PATIENCE``) and then reads the batch
    whole, over either transport. Before the slot is free the server refuses the stream or
    the peek ("is active for PID"): the holder here is a walsender released after 1.5 s."""
    import threading

    from pgcdc.capture.logical import LogicalStream

    slot = f"held_{transport}"
    with server.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS held_t (id int PRIMARY KEY)")
        conn.execute("DROP PUBLICATION IF EXISTS held_pub")
        conn.execute("CREATE PUBLICATION held_pub FOR TABLE held_t")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        base = conn.execute("SELECT coalesce(max(id), 0) FROM held_t").fetchone()[0]
        conn.execute("INSERT INTO held_t SELECT g FROM generate_series(%s::int, %s::int) g",
                     [base + 1, base + 500])  # fmt: skip
    reader = stream_reader(server, slot, publication="held_pub", transport=transport,
                           messages="false")  # fmt: skip
    start = parse_lsn(reader.initialOffset()["lsn"])
    end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
    holder = LogicalStream(server.conninfo(), slot, ["held_pub"]).open()
    threading.Timer(1.5, holder.close).start()
    t0 = time.monotonic()
    rows = read(reader, start, end)
    waited = time.monotonic() - t0
    reader.stop()
    assert waited >= 1.0, "the slot was free: nothing was waited for"
    assert sorted(json.loads(r["after_json"])["id"] for r in rows) == list(
        range(base + 1, base + 501)
    )


def _held_pid(conn, slot: str):
    from pgcdc.streaming.held import HELD_APP

    row = conn.execute(
        "SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a"
        " ON a.pid = s.active_pid WHERE s.slot_name = %s AND a.application_name = %s",
        [slot, HELD_APP],
    ).fetchone()
    return row and row[0]


def _confirmed(conn, slot: str) -> int:
    row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                       " WHERE slot_name = %s", [slot]).fetchone()  # fmt: skip
    return parse_lsn(row[0])


def _eventually(check, seconds: float = 5) -> bool:
    try:
        return bool(until("the check", check, seconds, 0.02))
    except WaitTimeout:
        return False


@pytest.mark.parametrize("typed", [False, True], ids=["json", "typed"])
def test_a_running_querys_batches_share_one_held_stream_once_each(server, typed):
    """A running query's task holds its stream for the next batch (pgcdc.streaming.held):
    eight batches are served by one walsender, the slot is confirmed at each batch's start,
    and the driver's commit leaves the held slot alone without waiting. What the stream read
    past a batch's end (transactions written after the end was planned, one left open across
    it) comes in the next batch: the batches equal one read of the whole slot by a twin slot,
    each change once. A batch read again (a task retried) finds the stream held for another
    start: that stream is ended, and the batch reads the same rows as before."""
    tag = "ty" if typed else "js"
    slot, twin = f"hs_{tag}", f"hs_{tag}_twin"
    with server.connect() as conn, server.connect() as other:
        conn.execute("CREATE TABLE IF NOT EXISTS hs_t (id int PRIMARY KEY, v text)")
        conn.execute("DROP PUBLICATION IF EXISTS hs_pub")
        conn.execute("CREATE PUBLICATION hs_pub FOR TABLE hs_t")
        for s in (slot, twin):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [s])
        base = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM hs_t").fetchone()[0]
        options = {"publication": "hs_pub", "messages": "false"}
        if typed:
            options["table"] = "public.hs_t"
        reader = stream_reader(server, slot, **options)
        if typed:
            reader.opts["table_doc"] = S._describe(reader.opts)  # as streamReader does
        start = parse_lsn(reader.initialOffset()["lsn"])
        got, pids = [], set()

        def insert(c, lo, n):
            c.execute("INSERT INTO hs_t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int)"
                      " g", [lo, lo + n - 1])  # fmt: skip

        for i in range(8):
            lo = base + i * 1000
            insert(conn, lo, 300)  # in this batch
            conn.execute("UPDATE hs_t SET v = v || '!' WHERE id BETWEEN %s AND %s", [lo, lo + 9])
            if i % 3 == 1:  # open across the end: the next batch's
                other.execute("BEGIN")
                insert(other, lo + 300, 100)
            end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
            if i % 3 == 1:
                other.execute("COMMIT")
            insert(conn, lo + 500, 200)  # after the end was planned: read ahead, held
            rows = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end,
                                           keep=True))  # fmt: skip
            got += rows
            pid = _held_pid(conn, slot)
            assert pid, "the stream was not held after the batch"
            pids.add(pid)
            # the batch's start, as a new stream's (the walsender takes the status in a moment)
            assert _eventually(lambda: _confirmed(conn, slot) == start), (_confirmed(conn, slot),
                                                                         start)  # fmt: skip
            t0 = time.monotonic()
            reader.commit({"lsn": format_lsn(end)})  # left to the held stream, not waited on
            assert time.monotonic() - t0 < 5
            start = end
        assert len(pids) == 1, f"{len(pids)} walsenders served the batches"
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        last = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end, keep=True))
        got += last

        whole_reader = stream_reader(server, twin, **options)
        whole_reader.opts["table_doc"] = reader.opts.get("table_doc")
        twin_start = parse_lsn(whole_reader.initialOffset()["lsn"])
        whole = read(whole_reader, twin_start, end)
        assert len(whole) == 8 * (300 + 10 + 200) + 3 * 100
        assert got == whole

        # the last batch read again, as by a retried task (the slot is at its start): the
        # stream held for its end is ended, and the batch reads the same rows
        t0 = time.monotonic()
        again = read(reader, start, end)
        assert time.monotonic() - t0 < 10, "waited for the held stream"
        assert again == last and last
        # a running query's batches are held, AvailableNow's and holdSeconds=0's are not
        offsets = {"lsn": format_lsn(start)}, {"lsn": format_lsn(end)}
        assert [b.keep for b in reader.partitions(*offsets)] == [True]
        off = stream_reader(server, slot, **options, holdSeconds="0")
        assert [b.keep for b in off.partitions(*offsets)] == [False]
        now = stream_reader(server, slot, **options)
        now.prepareForTriggerAvailableNow()
        assert [b.keep for b in now.partitions(*offsets)] == [False]
        for r in (whole_reader, off, now):
            r.stop()
        list(R.read_batch(reader.opts, reader.plugin_options, start, end, keep=True))
        assert _held_pid(conn, slot)
        # maxEventsPerTrigger peeks for a batch's end: a held stream is ended for it (at once,
        # not after the slot's patience), and its batches hold none
        limited = stream_reader(server, slot, **options, maxEventsPerTrigger="100")
        assert [b.keep for b in limited.partitions(*offsets)] == [False]
        t0 = time.monotonic()
        cut = limited.latestOffset({"lsn": format_lsn(start)}, S.ReadMaxRows(100))
        assert time.monotonic() - t0 < 10 and start < parse_lsn(cut["lsn"]) <= end
        assert not _held_pid(conn, slot)
        list(R.read_batch(reader.opts, reader.plugin_options, start, end, keep=True))
        assert _held_pid(conn, slot)
        reader.stop()  # the query stops: its held stream is ended (not waited for)
        assert _eventually(lambda: not _held_pid(conn, slot), 2)
        limited.stop()


@pytest.mark.parametrize("ended_by", ["holdSeconds", "the server"])
def test_a_held_stream_that_ended_between_batches_is_replaced(server, ended_by):
    """A held stream can end before the next batch: no batch took it within the option
    holdSeconds (it frees the slot), or the server ended it (a restart, wal_sender_timeout,
    an administrator's pg_terminate_backend). The next batch then opens a stream of its own
    from its start and reads its changes, each once."""
    slot = "hs_timeout" if ended_by == "holdSeconds" else "hs_ended"
    with server.connect() as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {slot}_t (id int PRIMARY KEY)")
        conn.execute(f"DROP PUBLICATION IF EXISTS {slot}_pub")
        conn.execute(f"CREATE PUBLICATION {slot}_pub FOR TABLE {slot}_t")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        reader = stream_reader(
            server,
            slot,
            publication=f"{slot}_pub",
            messages="false",
            holdSeconds="0.5" if ended_by == "holdSeconds" else "10",
        )
        start = parse_lsn(reader.initialOffset()["lsn"])
        ids, pids = [], []
        for i in range(3):
            conn.execute(f"INSERT INTO {slot}_t SELECT g FROM generate_series(%s::int, %s::int)"
                         " g", [i * 100 + 1, i * 100 + 50])  # fmt: skip
            end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
            rows = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end,
                                           keep=True))  # fmt: skip
            ids += [json.loads(r["after_json"])["id"] for r in rows]
            pids.append(_held_pid(conn, slot))
            assert pids[-1]
            if ended_by == "the server":
                conn.execute("SELECT pg_terminate_backend(%s)", [pids[-1]])
            else:
                assert _eventually(lambda: not _held_pid(conn, slot), 10), (
                    "the held stream outlived holdSeconds"
                )
            start = end
        reader.stop()
    assert len(set(pids)) == 3
    assert ids == [i * 100 + k for i in range(3) for k in range(1, 51)]


def test_a_quiet_held_stream_spares_the_batches_of_other_tables_wal(server):
    """Writes to a table outside the publication move the WAL flush position. A running
    query's held stream that has received nothing past its batch's end says so (a keepalive
    after no message: pgcdc.streaming.held), and ``latestOffset`` plans no batch for that
    WAL; the first change of the publication takes it back, and the next batch holds exactly
    that change. A reader that holds no stream (holdSeconds 0), or more WAL than
    idleAdvanceBytes, plans the batch as before."""
    from pgcdc.streaming.held import quiet_reports

    slot = "hs_quiet"
    with server.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS hq_t (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE IF NOT EXISTS hq_other (id int PRIMARY KEY, v text)")
        conn.execute("DROP PUBLICATION IF EXISTS hq_pub")
        conn.execute("CREATE PUBLICATION hq_pub FOR TABLE hq_t")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        options = {"publication": "hq_pub", "messages": "false"}
        reader = stream_reader(server, slot, **options)
        start = parse_lsn(reader.initialOffset()["lsn"])
        conn.execute("INSERT INTO hq_t SELECT generate_series(1, 10)")
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        rows = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end,
                                       keep=True))  # fmt: skip
        assert [json.loads(r["after_json"])["id"] for r in rows] == list(range(1, 11))
        assert _held_pid(conn, slot)
        start, at = end, {"lsn": format_lsn(end)}

        def other_writes(n):
            conn.execute("INSERT INTO hq_other SELECT g, repeat('x', 200) FROM"
                         " generate_series(%s::int, %s::int) g", [n, n + 99])  # fmt: skip

        other_writes(1)
        flush = reader._positions()[0]
        assert flush > start, "the other table's writes did not move the WAL"
        # the held stream says so in a moment; the driver then plans nothing for that WAL
        assert _eventually(lambda: reader.latestOffset(at) == at, 5), quiet_reports(
            conn, reader._quiet_tag
        )
        for n in range(101, 1001, 100):  # more of it, quiet all along
            other_writes(n)
            assert _eventually(lambda: reader.latestOffset(at) == at, 5)
        p, w, _ = max(quiet_reports(conn, reader._quiet_tag), key=lambda r: r[1])
        assert p == start and w > start
        # without a held stream, or past idleAdvanceBytes, the batch is planned as before
        for other in (stream_reader(server, slot, **options, holdSeconds="0"),
                      stream_reader(server, slot, **options, idleAdvanceBytes="1")):  # fmt: skip
            assert parse_lsn(other.latestOffset(at)["lsn"]) > start
            other._connection().close()  # not stop(): that would end the held stream
        # a change of the publication: the report is taken back and the batch comes
        t0 = time.monotonic()
        conn.execute("INSERT INTO hq_t VALUES (11)")
        assert _eventually(lambda: reader.latestOffset(at) != at, 5)
        waited = time.monotonic() - t0
        assert waited < 2, f"the batch waited {waited:.2f} s for the report"
        end = parse_lsn(reader.latestOffset(at)["lsn"])
        rows = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end,
                                       keep=True))  # fmt: skip
        assert [json.loads(r["after_json"])["id"] for r in rows] == [11]
        reader.stop()
        assert _eventually(lambda: not _held_pid(conn, slot), 2)


def test_the_side_connection_holds_no_transaction_open(server):
    """The side connection asks the catalog what a type that is not built in is, while the
    slot streams on another, and stays open while the stream is held between batches. It
    commits what it asks: a connection left idle in a transaction holds its locks on the
    catalog, and a server with ``idle_in_transaction_session_timeout`` ends it, and the next
    batch's question with it."""
    slot = "hs_side"
    with server.connect() as conn:
        conn.execute("CREATE TYPE hside_mood AS ENUM ('sad', 'ok')")
        conn.execute("CREATE TABLE hside_t (id int PRIMARY KEY, m hside_mood)")
        conn.execute("CREATE PUBLICATION hside_pub FOR TABLE hside_t")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        reader = stream_reader(server, slot, publication="hside_pub", messages="false")
        start = parse_lsn(reader.initialOffset()["lsn"])
        conn.execute("INSERT INTO hside_t VALUES (1, 'ok'), (2, 'sad')")
        end = parse_lsn(reader.latestOffset({"lsn": format_lsn(start)})["lsn"])
        conn.execute("INSERT INTO hside_t VALUES (3, 'ok')")  # past the end: read ahead, held
        rows = batch_rows(R.read_batch(reader.opts, reader.plugin_options, start, end,
                                       keep=True))  # fmt: skip
        assert [json.loads(r["after_json"]) for r in rows] == [
            {"id": 1, "m": "ok"}, {"id": 2, "m": "sad"}]  # fmt: skip
        assert _held_pid(conn, slot)
        states = conn.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = 'pgcdc stream catalog'"
            " OR application_name LIKE 'pgcdc quiet %%'"
        ).fetchall()
        assert states == [("idle",)], states
        reader.stop()
