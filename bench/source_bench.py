"""The ``pgcdc`` streaming source against its one-process peer, in turns, in one run.

``make bench``'s streaming workload: ``events`` inserts into ``bench_t`` (int8 key,
numeric(12,2), text, timestamptz, float8) in transactions of 1,000 rows, on a PostgreSQL 18
of the test harness (its decoding settings, or ``--production-decoding``; the server's default
``wal_sender_timeout``, which the harness turns off). Every slot is
created before the workload, so each path reads the same changes from a slot of its own:

- source: ``spark.readStream.format("pgcdc")`` into Parquet with a checkpoint,
  ``Trigger.AvailableNow``, Spark local[2], timed from ``start()`` to the end of
  ``awaitTermination()``; the rows are counted afterwards;
- source, typed: the same query with ``option("table", "public.bench_t")`` (the table's
  change events with typed ``before``/``after`` columns rather than JSON text);
- source, noop sink: the same query into ``format("noop")`` (the source without the sink's
  cost), with ``--noop``;
- source, peek: the same query with ``transport=peek`` (each batch read by
  ``pg_logical_slot_peek_binary_changes`` rather than a walsender stream), with ``--peek``;
- peer: the slot peeked (``pg_logical_slot_peek_binary_changes`` up to NULL) and typed by
  ``pgcdc.events.reader.EventReader`` in this process (:func:`bench.workload.peer_path`;
  ``bench.sync_bench``'s peer too).

Before them, a session's first streaming query: 1,000 inserts into another table read the
same way, printed on a line of its own. It pays once what no later query does (Spark's
first Python data-source processes, the JVM's first streaming write), 3 to 5 s here.

Then, each round, a query already running: the source (JSON and typed) into Parquet with the
default trigger (a batch as soon as the last one ends), started on a new slot and idle, then
the same workload written again as a burst (new keys); timed from the burst's start to the
end of the batch that brings the query's rows to ``events`` (as a query listener hears of it:
:class:`Batches`), as ``bench.sync_bench`` times ``pgcdc sync``; a line under each round says
how long the inserts took and when each batch ended. Its peer: a slot created before the
burst, peeked and typed after it.

The paths run in turns, ``--repeat`` rounds (default 3), each round printed: the machine is
shared (2 cores), so compare within a round. Round 1 is the JVM's cold round: its first
queries into Parquet run while HotSpot's compilers still compile Spark's Parquet writer and
row conversion (1.2-1.5 s more of the JVM's CPU than warm, docs/streaming.md), which a query that
runs for months pays once; the session's first streaming query, of 1,000 events, is too
small to reach them. The summary at the end gives round 1 and the later rounds apart. For the source, "in batches" is the time of its
micro-batches (``triggerExecution`` of the query's progress: planning, reading, writing and
committing the batch), without starting and stopping the query (about 1.5 to 2 s of Spark's
on this machine, the same for 1,000 events), which a long-running query pays once. ``--max-events`` sets ``maxEventsPerTrigger``.

With ``--cpu``, each round also prints the CPU seconds each path used while it was timed
(``bench.cpu``, from ``/proc``): the machine's, the Spark JVM's, the server's, and the rest
(the Python workers, this process: the peer's typing, a burst's inserts). It varies much less
than the wall time from hour to hour.

    python -m bench.source_bench [--events N] [--repeat R] [--noop] [--peek] [--max-events N]
                                 [--cpu]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .workload import FILL, PUB, TABLE, drop_slot, peer_path

ROOT = Path(__file__).resolve().parent.parent
EVENTS = 200_000


def _events(spark, dsn: str, slot: str, publication: str = PUB, **options):
    """The source's DataFrame of ``slot``, with the options that are not None."""
    reader = (
        spark.readStream.format("pgcdc")
        .option("dsn", dsn)
        .option("slot", slot)
        .option("publication", publication)
    )
    for name, value in options.items():
        if value is not None:
            reader = reader.option(name, str(value))
    return reader.load()


def source_path(
    spark,
    dsn: str,
    slot: str,
    out: Path,
    sink: str,
    max_events,
    transport: str = "walsender",
    table: str | None = None,
    meter=None,
) -> tuple[tuple[int, float, float], object]:
    """The source's query over ``slot`` into ``sink``: ((rows, seconds end to end, seconds in
    batches), the CPU it used from ``start()`` to the end of ``awaitTermination()``, by
    ``meter``: the rows counted afterwards are not in it)."""
    events = _events(spark, dsn, slot, transport=transport, table=table,
                     maxEventsPerTrigger=max_events or None)  # fmt: skip
    before = meter and meter.read()
    t0 = time.perf_counter()
    writer = events.writeStream.format(sink).option("checkpointLocation", str(out / "chk"))
    query = writer.trigger(availableNow=True).start(str(out / "rows"))
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    used = _used(meter, before)
    if sink == "noop":
        n = sum(p["numInputRows"] for p in query.recentProgress)
    else:
        n = spark.read.parquet(str(out / "rows")).count()
    # the batches' own time, without starting and stopping the query
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
    return (n, seconds, in_batches / 1000), used


class Batches:
    """The batches of the session's running queries as Spark reports them, once a batch
    (a ``StreamingQueryListener``): ``(batchId, rows, when it was seen)`` by query id.

    The running path waits on these rather than polling ``query.recentProgress``: that
    renders every progress Spark keeps as JSON in the JVM and hands each over py4j, 3 to
    10 ms a call, and polled every 10 ms it took 0.5 to 1.0 s of the JVM's CPU and 0.2 s of
    this process's in every 2 s (probe, 2026-12-02), on the 2 cores the query and the server
    share: the bench's own wait slowed the path it timed."""

    def __init__(self, spark):
        import threading

        from pyspark.sql.streaming import StreamingQueryListener

        batches = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                p = event.progress
                with batches.changed:
                    batches.seen.setdefault(str(p.id), []).append(
                        (p.batchId, p.numInputRows, time.perf_counter())
                    )
                    batches.changed.notify_all()

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                with batches.changed:
                    batches.changed.notify_all()

        self.seen: dict[str, list[tuple[int, int, float]]] = {}
        self.changed = threading.Condition()
        self.listener = Listener()
        spark.streams.addListener(self.listener)

    def wait_rows(self, query, before: set[int], rows: int, timeout: float) -> list:
        """The batches of ``query`` not in ``before``, ``(batchId, rows, when it was seen)``,
        once they hold ``rows`` rows; RuntimeError after ``timeout`` s or when the query
        failed."""
        deadline = time.monotonic() + timeout
        qid = str(query.id)
        with self.changed:
            while True:
                after = [b for b in self.seen.get(qid, []) if b[0] not in before]
                got = sum(n for _, n, _ in after)
                if got >= rows:
                    return after
                left = deadline - time.monotonic()
                if left <= 0 or not query.isActive:
                    raise RuntimeError(f"{got:,} of {rows:,} rows: {query.exception()}")
                self.changed.wait(min(left, 1.0))


def running_path(spark, batches: Batches, conn, dsn: str, slot: str, out: Path, events: int,
                 first: int, table: str | None = None, meter=None):  # fmt: skip
    """A query started on ``slot`` and idle, then a burst of ``events`` inserts from key
    ``first``: (rows the query wrote, seconds from the burst's start to the end of the batch
    that completes it, as ``batches`` saw it, how the burst went: how long its inserts
    took, and each batch's rows and end, in seconds from the burst's start, and the CPU used
    from the burst's start to that end, by ``meter``)."""
    query = (
        _events(spark, dsn, slot, table=table)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(out / "chk"))
        .start(str(out / "rows"))
    )
    try:
        deadline = time.monotonic() + 60
        while "Waiting for data" not in query.status["message"]:  # started, nothing to read
            if time.monotonic() > deadline or query.exception() is not None:
                raise RuntimeError(f"{slot}: the query did not start: {query.status}")
            time.sleep(0.05)
        before = {p["batchId"] for p in query.recentProgress}
        cpu_before = meter and meter.read()
        t0 = time.perf_counter()
        for lo in range(first, first + events, 1000):
            conn.execute(FILL.format(lo=lo, hi=min(lo + 999, first + events - 1)))
        written = time.perf_counter() - t0
        try:
            after = batches.wait_rows(query, before, events, 600)
            used = _used(meter, cpu_before)
        except RuntimeError as e:
            raise RuntimeError(f"{slot}: {e}") from None
        seconds = after[-1][2] - t0
        parts = [f"{n:,} rows at {at - t0:.2f} s" for _, n, at in after if n]
        how = f"inserts written in {written:.2f} s; batches: " + ", ".join(parts)
        # stopped between batches where it can: a batch stopped in the middle (the slot's
        # last records, an empty one) prints Spark's interrupted write as an error
        quiet = time.monotonic() + 3
        while query.status["isTriggerActive"] and time.monotonic() < quiet:
            time.sleep(0.02)
    finally:
        query.stop()
    return spark.read.parquet(str(out / "rows")).count(), seconds, how, used


def first_query(spark, conn, dsn: str, tmp: Path) -> tuple[float, float]:
    """A session's first streaming query: 1,000 inserts into ``warm_t`` read into Parquet
    (``Trigger.AvailableNow``): (seconds end to end, seconds in batches)."""
    conn.execute("CREATE TABLE warm_t (id int8 PRIMARY KEY, s text)")
    conn.execute("CREATE PUBLICATION warm_pub FOR TABLE warm_t")
    conn.execute("SELECT pg_create_logical_replication_slot('warm_slot', 'pgoutput')")
    conn.execute("INSERT INTO warm_t SELECT g, 'w' || g FROM generate_series(1, 1000) g")
    t0 = time.perf_counter()
    query = (
        _events(spark, dsn, "warm_slot", "warm_pub")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp / "warm_chk"))
        .trigger(availableNow=True)
        .start(str(tmp / "warm"))
    )
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    conn.execute("SELECT pg_drop_replication_slot('warm_slot')")
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
    return seconds, in_batches / 1000


def run(
    events: int = EVENTS,
    repeat: int = 3,
    *,
    noop: bool = False,
    peek: bool = False,
    max_events: int | None = None,
    production: bool = False,
    cpu: bool = False,
) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from pgcdc.runtime.spark import local_spark_session
    from pgcdc.streaming.slot import PgcdcDataSource
    from tests.postgres import servers

    settings = {**servers.WALSENDER_DEFAULTS, **(servers.PRODUCTION_DECODING if production else {})}
    tmp = Path(tempfile.mkdtemp(prefix="pgcdc-sourcebench-"))
    spark = local_spark_session("pgcdc source bench", cores=2)
    spark.dataSource.register(PgcdcDataSource)
    paths = ["peer", "source", "source, typed"] + (["source, noop sink"] if noop else [])
    paths += ["source, peek"] if peek else []
    rounds: list[dict] = []
    batches = Batches(spark)
    try:
        with servers.running_server("pg18", settings) as srv, srv.connect() as conn:
            dsn = srv.conninfo()
            meter = _meter(spark, srv) if cpu else None
            first_query_s = first_query(spark, conn, dsn, tmp)
            print("\na session's first streaming query (1,000 events into Parquet, once per "
                  "session): {:.2f} s, in batches {:.2f} s".format(*first_query_s))  # fmt: skip
            conn.execute(TABLE)
            conn.execute(f"CREATE PUBLICATION {PUB} FOR TABLE bench_t")
            slots = {(r, p): f"s{r}_{i}" for r in range(repeat) for i, p in enumerate(paths)}
            for slot in slots.values():
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            for lo in range(1, events + 1, 1000):
                conn.execute(FILL.format(lo=lo, hi=min(lo + 999, events)))
            conn.execute("CHECKPOINT")
            for r in range(repeat):
                got, used = {}, {}
                # the order turns each round: neither path always runs first
                for p in paths if r % 2 == 0 else paths[::-1]:
                    slot = slots[(r, p)]
                    if p == "peer":
                        before = meter and meter.read()
                        got[p] = peer_path(conn, slot, srv.major)
                        used[p] = _used(meter, before)
                    else:
                        sink = "noop" if "noop" in p else "parquet"
                        transport = "peek" if "peek" in p else "walsender"
                        table = "public.bench_t" if "typed" in p else None
                        got[p], used[p] = source_path(
                            spark, dsn, slot, tmp / slot, sink, max_events, transport, table, meter
                        )
                    n = got[p][0]
                    assert n == events, (p, n, events)
                rounds.append(got)
                _print_round(r, got)
                _print_cpu(used)
            # a running query and a burst, each path its own; keys go on from the last
            first = events + 1
            for r in range(repeat):
                running, used = {}, {}
                for p, table in (("source", None), ("source, typed", "public.bench_t")):
                    slot, peer_slot = f"run{r}_{len(running)}", f"runpeer{r}_{len(running)}"
                    for s in (slot, peer_slot):
                        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                                     [s])  # fmt: skip
                    n, seconds, how, used[p] = running_path(
                        spark, batches, conn, dsn, slot, tmp / slot, events, first, table, meter
                    )
                    first += events
                    before = meter and meter.read()
                    pn, peer_s, _ = peer_path(conn, peer_slot, srv.major)
                    used[f"peer of {p}"] = _used(meter, before)
                    for s in (slot, peer_slot):  # once the stopped query has let go of it
                        drop_slot(conn, s)
                    assert n == events and pn == events, (p, n, pn, events)
                    running[p] = (n, seconds, peer_s, how)
                rounds[r]["running"] = running
                _print_running(r, running)
                _print_cpu(used)
            _print_summary(rounds, first_query_s)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rounds


def _meter(spark, srv):
    from .cpu import Meter, postmaster_pid

    return Meter(spark._jvm.java.lang.ProcessHandle.current().pid(), postmaster_pid(srv.datadir))


def _used(meter, before):
    """The CPU used since ``before`` (a Reading), or None without a meter. The running
    query's path includes the burst's INSERTs (the server's part and this process's)."""
    after = meter and meter.read()
    return None if before is None or after is None else after - before


def _print_cpu(used: dict) -> None:
    if not any(used.values()):
        return
    print(f"{'CPU seconds':<22}{'machine':>10}{'JVM':>9}{'server':>9}{'rest':>9}")
    for p, u in used.items():
        if u is not None:
            print(f"{p:<22}{u.machine:>10.2f}{u.jvm:>9.2f}{u.server:>9.2f}{u.rest:>9.2f}")


def _print_round(r: int, got: dict) -> None:
    peer_rate = got["peer"][0] / got["peer"][1]
    print(f"\nround {r + 1}" + (" (cold: the JVM's first queries into Parquet)" if r == 0 else ""))
    head = f"{'path':<22}{'events':>10}{'seconds':>9}{'events/s':>11}{'vs peer':>9}"
    print(head + f"{'in batches s':>14}{'events/s':>11}{'vs peer':>9}")
    for p, (n, s, b) in got.items():
        print(
            f"{p:<22}{n:>10,}{s:>9.2f}{n / s:>11,.0f}{n / s / peer_rate:>8.2f}x"
            f"{b:>14.2f}{n / b:>11,.0f}{n / b / peer_rate:>8.2f}x"
        )


def _print_running(r: int, running: dict) -> None:
    print(f"\nround {r + 1}, a running query and a burst (written while it runs)")
    print(f"{'path':<22}{'events':>10}{'seconds':>9}{'events/s':>11}{'peer s':>8}{'vs peer':>9}")
    for p, (n, s, peer_s, _) in running.items():
        print(f"{p:<22}{n:>10,}{s:>9.2f}{n / s:>11,.0f}{peer_s:>8.2f}{peer_s / s:>8.2f}x")
    for p, (*_, how) in running.items():
        print(f"  {p}: {how}")


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if lo == hi else f"{lo:.2f}-{hi:.2f}x"


def _print_summary(rounds: list[dict], first: tuple[float, float]) -> None:
    """Each source path against the peer of its round: AvailableNow in batches, round 1 (cold)
    apart from the rounds after it, and a running query's burst in every round."""
    print("\nsummary, vs the peer of the same round")
    print(f"(before them, the session's first streaming query: 1,000 events in {first[0]:.2f} s,"
          f" in batches {first[1]:.2f} s)")  # fmt: skip
    print(f"{'path':<34}{'round 1 (cold)':>16}{'rounds 2+':>16}")
    for p in [p for p in rounds[0] if p not in ("peer", "running")]:
        ratios = [g["peer"][1] / g[p][2] for g in rounds]  # in batches
        print(f"{p + ', in batches':<34}{_span(ratios[:1]):>16}{_span(ratios[1:]):>16}")
    # the running queries start after every AvailableNow round: none of them is cold
    for p in rounds[0].get("running", {}):
        ratios = [g["running"][p][2] / g["running"][p][1] for g in rounds]
        print(f"{p + ', running query':<34}{'':>16}{_span(ratios):>16}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.source_bench")
    p.add_argument("--events", type=int, default=EVENTS)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--noop", action="store_true", help="also the source into a noop sink")
    p.add_argument("--peek", action="store_true", help="also the source with transport=peek")
    p.add_argument("--max-events", type=int, default=None, help="maxEventsPerTrigger")
    p.add_argument("--production-decoding", action="store_true")
    p.add_argument("--cpu", action="store_true", help="also the CPU each path used (/proc)")
    args = p.parse_args(argv)
    run(
        args.events,
        args.repeat,
        noop=args.noop,
        peek=args.peek,
        max_events=args.max_events,
        production=args.production_decoding,
        cpu=args.cpu,
    )


if __name__ == "__main__":
    main()
