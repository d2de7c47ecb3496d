"""apply's small runs in the driver (pgcdc.apply.driver) against the same model as
Spark's (tests/apply/test_apply_model.py: the transactions folded over a dict), over runs that each
apply a longer prefix of the history into the same tables, as sync's cycles do.

With tiny files (a few rows each, none merged as small) the changed keys' statistics and key
columns choose the files to rewrite; with the defaults every file is small and merged. A run
with a truncate or an unchanged TOAST column is Spark's (the same run, that table), and the
next one is the driver's again."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pgcdc.apply import driver as driver_apply  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from pgcdc.apply.state import STATE_FILE  # noqa: E402
from tests.support.apply_model import (  # noqa: E402
    BOTH,
    PLAIN,
    TABLE,
    TRUNCATE_ONLY,
    U,
    _history,
    check_state,
    write_capture,
)  # noqa: E402

BIG = 1 << 30


def _by(out) -> str:
    return json.loads((out / STATE_FILE).read_text())["tables"][TABLE].get("applied_by", "spark")


def _has_t_or_u(txns) -> bool:
    return any(c[0] == "T" or U in c for changes in txns for c in changes)


def _runs(txns, cuts):
    """Prefixes of ``txns`` at the cuts (sorted, distinct), then all of it."""
    ends = sorted({c for c in cuts if 0 < c < len(txns)}) + [len(txns)]
    return [txns[:e] for e in ends]


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    txns=_history(),
    cuts=st.lists(st.integers(1, 6), max_size=3),
    tiny=st.booleans(),
)
@example(txns=PLAIN, cuts=[1, 2], tiny=True)
@example(txns=PLAIN + PLAIN[1:], cuts=[1, 3, 4], tiny=False)
@example(txns=BOTH, cuts=[1, 2, 3, 4], tiny=True)
@example(txns=TRUNCATE_ONLY, cuts=[1, 2], tiny=True)
def test_driver_runs_equal_the_model(spark, tmp_path_factory, monkeypatch, txns, cuts, tiny):  # noqa: F811
    if tiny:
        monkeypatch.setattr(driver_apply, "FILE_ROWS", 2)
        monkeypatch.setattr(driver_apply, "SMALL_ROWS", 0)
    tmp = tmp_path_factory.mktemp("driver")
    out = tmp / "out"
    done = []
    for n, part in enumerate(_runs(txns, cuts)):
        cap = tmp / f"cap{n}.pgcap"
        write_capture(cap, part)
        report = apply_changes(spark, [str(cap)], out, split_records=5, driver_bytes=BIG)
        check_state(out, part, report)
        new = part[len(done) :]
        if n > 0 and not _has_t_or_u(new):  # the table exists and the run is plain
            assert _by(out) == "driver"
        done = part


def test_driver_files_are_few_and_key_ranged(spark, tmp_path, monkeypatch):  # noqa: F811
    """Rows appended run after run go into the small last file (rewritten) until it is full;
    a run that updates keys in one file rewrites that file only (Spark's first file of 8
    rows, written again as two of 4)."""
    monkeypatch.setattr(driver_apply, "FILE_ROWS", 4)
    monkeypatch.setattr(driver_apply, "SMALL_ROWS", 4)
    txns = [[("I", k, f"a{k}", None, k) for k in range(8)]]
    for k in range(8, 16):
        txns.append([("I", k, f"a{k}", None, k)])
    txns.append([("U", 1, "one", "b", 1), ("U", 2, "two", "b", 2)])
    out = tmp_path / "out"
    for n in range(1, len(txns) + 1):
        cap = tmp_path / f"cap{n}.pgcap"
        write_capture(cap, txns[:n])
        report = apply_changes(spark, [str(cap)], out, driver_bytes=BIG)
        check_state(out, txns[:n], report)
    doc = json.loads((out / STATE_FILE).read_text())["tables"][TABLE]
    assert doc["applied_by"] == "driver"
    assert (doc["files_removed"], doc["files_added"]) == (1, 2)  # keys 1, 2: the first file
    from deltalake import DeltaTable

    files = [pq.read_table(u) for u in DeltaTable(str(out / TABLE)).file_uris()]
    assert sorted(sorted(f.column("id").to_pylist()) for f in files) == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]
    ]  # fmt: skip


def test_a_big_run_leaves_the_small_files_to_the_next_small_run(spark, tmp_path, monkeypatch):  # noqa: F811
    """A run of SMALL_ROWS upserts or more writes its own files and rewrites no small file
    (a burst in cycles rewrote the last cycle's file each time); the next small run merges
    every small file. The files are the table's as delta-rs lists them."""
    monkeypatch.setattr(driver_apply, "SMALL_ROWS", 4)
    txns = [
        [("I", 0, "a", None, 0), ("I", 1, "b", None, 1)],  # Spark's first file: 2 rows
        [("I", k, f"a{k}", None, k) for k in range(2, 7)],  # 5 upserts: a file of its own
        [("I", 7, "h", None, 7)],  # 1 upsert: merged with the small file of 2
    ]
    out = tmp_path / "out"
    from deltalake import DeltaTable

    def files():
        tables = [pq.read_table(u) for u in DeltaTable(str(out / TABLE)).file_uris()]
        return sorted(sorted(t.column("id").to_pylist()) for t in tables)

    seen = []
    for n in range(1, len(txns) + 1):
        cap = tmp_path / f"cap{n}.pgcap"
        write_capture(cap, txns[:n])
        report = apply_changes(spark, [str(cap)], out, driver_bytes=BIG)
        check_state(out, txns[:n], report)
        seen.append(files())
    assert _by(out) == "driver"
    assert seen[1] == [[0, 1], [2, 3, 4, 5, 6]]  # the small file left as it was
    assert seen[2] == [[0, 1, 7], [2, 3, 4, 5, 6]]


def test_only_rows_already_in_key_order_skip_the_sort():
    """The driver's new files are sorted by the key unless the rows already are (one integer
    key, strictly ascending): a burst of growing keys, appended to the file it rewrites."""
    import pyarrow as pa

    def table(*ids):
        return pa.table({"id": pa.array(ids, pa.int32()), "v": pa.array([str(i) for i in ids])})

    ascending = pa.concat_tables([table(1, 2, 5), table(7, 9)])  # the kept rows, then new
    assert driver_apply._ascending(ascending, ["id"])
    assert driver_apply._ascending(table(), ["id"])
    assert not driver_apply._ascending(pa.concat_tables([table(1, 8), table(3)]), ["id"])
    assert not driver_apply._ascending(table(1, 1, 2), ["id"])
    assert not driver_apply._ascending(pa.table({"id": ["a", "b"]}), ["id"])  # not an integer
    assert not driver_apply._ascending(table(1, 2), ["id", "v"])


def test_keys_apart_need_no_lookup():
    """A file's keys whose range misses the changed keys' range hold none of them: the file
    is kept whole (no hash set is built); ranges that meet are looked up key by key."""
    import pyarrow as pa

    def hits(file_ids, changed_ids):
        return driver_apply._hits(
            pa.table({"id": pa.array(file_ids, pa.int64())}),
            ["id"],
            pa.table({"id": pa.array(changed_ids, pa.int64())}),
        ).tolist()

    assert driver_apply._apart(pa.chunked_array([[1, 5]]), pa.array([6, 9]))
    assert driver_apply._apart(pa.chunked_array([[7, 9]]), pa.array([2, 6]))
    assert not driver_apply._apart(pa.chunked_array([[1, 6]]), pa.array([6, 9]))
    assert not driver_apply._apart(pa.chunked_array([["a"]]), pa.array(["b"]))  # not integers
    assert not driver_apply._apart(pa.chunked_array([[None]], pa.int64()), pa.array([1]))
    assert hits([1, 2, 3], [4, 5]) == [False, False, False]
    assert hits([1, 4, 9], [4, 5]) == [False, True, False]  # ranges meet: each key looked up
    assert hits([1, 9], [4, 5]) == [False, False]  # meet, none in both
    small = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    changed = pa.table({"id": pa.array([4, 5], pa.int64())})
    assert driver_apply._without(small, ["id"], changed) is small  # apart: kept whole
    two = pa.table({"id": pa.array([2], pa.int64())})
    assert driver_apply._without(small, ["id"], two).column("id").to_pylist() == [1, 3]


def test_only_repeating_columns_are_dictionary_encoded(tmp_path):
    """The driver's Parquet files dictionary-encode the columns whose values repeat, and
    write the others plain (a dictionary of distinct values is built only to be given up);
    the encodings are the file's own, as pyarrow's reader reports them."""
    import pyarrow as pa

    from pgcdc.apply import delta

    n = 20_000
    batch = pa.record_batch(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": pa.array([f"row {i}" for i in range(n)]),
            "state": pa.array(["open", "closed", "void"] * (n // 3) + ["open"] * (n % 3)),
            "tags": pa.array([["a"]] * n, pa.list_(pa.string())),
        }
    )
    assert delta.repeating_columns(batch) == ["state"]
    write = delta._writer_task(str(tmp_path), "d", 1 << 20, {})
    (row,) = [r for b in write(iter([batch])) for r in b.to_pylist()]
    meta = pq.ParquetFile(tmp_path / row["path"]).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(4)}
    assert "RLE_DICTIONARY" in encodings["state"]
    assert not any("DICTIONARY" in e for e in encodings["id"] + encodings["name"])
    assert pq.read_table(tmp_path / row["path"]).to_batches()[0].equals(batch)


def test_a_rewrite_larger_than_the_driver_holds_is_sparks(spark, tmp_path, monkeypatch):  # noqa: F811
    """The files a run rewrites are read whole in the driver: past REWRITE_BYTES of them the
    table is Spark's in that run (the same result), and the next run is the driver's again."""
    monkeypatch.setattr(driver_apply, "FILE_ROWS", 4)
    monkeypatch.setattr(driver_apply, "SMALL_ROWS", 4)
    txns = [[("I", k, f"a{k}", None, k) for k in range(16)]]
    txns.append([("U", 1, "one", "b", 1), ("U", 13, "thirteen", "b", 13)])  # two files
    txns.append([("U", 2, "two", "c", 2)])
    out = tmp_path / "out"
    by = []
    for n in range(1, len(txns) + 1):
        cap = tmp_path / f"cap{n}.pgcap"
        write_capture(cap, txns[:n])
        # the second run's two files are more than it may rewrite here; the third's one is not
        monkeypatch.setattr(driver_apply, "REWRITE_BYTES", BIG if n != 2 else 1)
        report = apply_changes(spark, [str(cap)], out, driver_bytes=BIG)
        check_state(out, txns[:n], report)
        by.append(_by(out))
    assert by[1:] == ["spark", "driver"]


class _NoSession:
    """A session that is not there yet: any use of it fails the test."""

    started = False

    def __getattr__(self, name):
        raise AssertionError(f"a small run used the Spark session ({name})")


def test_a_small_run_needs_no_spark_session(spark, tmp_path, monkeypatch):  # noqa: F811
    """pgcdc sync applies its first cycles while its session starts (pgcdc.spark.later): a
    run the driver can apply touches no session, and a run that cannot waits for it."""
    from pgcdc.spark import later

    monkeypatch.setattr(later, "SessionLater", _NoSession)
    out = tmp_path / "out"
    for n in range(1, len(PLAIN) + 1):
        cap = tmp_path / f"cap{n}.pgcap"
        write_capture(cap, PLAIN[:n])
        session = spark if n == 1 else _NoSession()  # the first run creates the table: Spark's
        report = apply_changes(session, [str(cap)], out, driver_bytes=BIG)
        check_state(out, PLAIN[:n], report)
    assert _by(out) == "driver"
    cap = tmp_path / "truncate.pgcap"
    write_capture(cap, PLAIN + [[("T",)]])
    with pytest.raises(AssertionError, match="used the Spark session"):
        apply_changes(_NoSession(), [str(cap)], out, driver_bytes=BIG)  # a truncate: Spark's


def test_summaries_do_not_wait_for_a_starting_session(spark, tmp_path, monkeypatch):  # noqa: F811
    """A run reads every capture file's transaction boundaries first (its summary): in a job
    when they are large, but not while the session is still starting. A rerun of pgcdc sync
    summarises every segment not yet pruned, and once they passed the job's threshold its
    first cycle waited for the JVM's start (6 s, every rerun) to read what takes 0.1 s here."""
    from pgcdc.spark import changes, later

    monkeypatch.setattr(later, "SessionLater", _NoSession)
    out = tmp_path / "out"
    for n in range(1, len(PLAIN) + 1):
        cap = tmp_path / f"cap{n}.pgcap"  # a new file each run: no summary remembered
        write_capture(cap, PLAIN[:n])
        if n == 2:
            monkeypatch.setattr(changes, "DRIVER_SUMMARY_BYTES", 0)  # a started session's job
        session = spark if n == 1 else _NoSession()
        report = apply_changes(session, [str(cap)], out, driver_bytes=BIG)
        check_state(out, PLAIN[:n], report)
    monkeypatch.setattr(changes, "STARTING_SUMMARY_BYTES", 0)
    cap = tmp_path / "past.pgcap"
    write_capture(cap, PLAIN)
    with pytest.raises(AssertionError, match="used the Spark session"):
        apply_changes(_NoSession(), [str(cap)], out, driver_bytes=BIG)
    # the job, once started: the same history, nothing new to apply
    assert apply_changes(spark, [str(cap)], out, driver_bytes=BIG) == {}


def test_a_session_later_waits_for_its_start_and_says_its_failure():
    import threading

    from pgcdc.spark.later import SessionLater, resolve, started

    gate = threading.Event()
    box = SessionLater(lambda: gate.wait(10) and "the session")
    assert not started(box) and not box.started
    gate.set()
    assert resolve(box) == "the session" and started(box)
    assert box.upper() == "THE SESSION"  # attributes are the session's

    def fail():
        raise RuntimeError("no Java")

    broken = SessionLater(fail)
    with pytest.raises(RuntimeError, match="no Java"):
        broken.session()
    assert not broken.started
    with pytest.raises(RuntimeError, match="no Java"):
        broken.check()
    assert started(object())  # a plain session is always there

    calls = []
    deferred = SessionLater(lambda: calls.append(1) or "later", deferred=True)
    assert not deferred.begun and not calls and not started(deferred)
    assert resolve(deferred) == "later" and deferred.begun and calls == [1]
    deferred.begin()  # once
    assert calls == [1]


WATCHED_META_PATH = """
import sys

class Watched(list):
    removed = []

    def remove(self, item):
        self.removed.append(item)
        super().remove(item)

    def pop(self, *index):
        self.removed.append(index)
        return super().pop(*index)

    def __delitem__(self, index):
        self.removed.append(index)
        super().__delitem__(index)

sys.meta_path = Watched(sys.meta_path)
from pgcdc.apply.driver import warm_up

for _ in range(2):
    warm_up().join(120)
print(len(sys.meta_path.removed), "pandas" in sys.modules, sum(
    type(f).__name__ == "_NoPandas" for f in sys.meta_path))
"""


def test_the_warm_up_takes_no_finder_out_of_sys_meta_path():
    # Spark's start imports pyspark in another thread meanwhile: a finder taken out of the
    # list it walks shifts the rest under it, and it skips the path finder ("No module named
    # 'pyspark.sql.streaming.listener'" in CI). In a new interpreter, where pandas is not
    # imported yet and the warm-up refuses it to its own thread.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", WATCHED_META_PATH], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    removed, pandas, finders = proc.stdout.split()
    assert removed == "0", proc.stdout  # nothing taken out
    assert pandas == "False" and finders == "1", proc.stdout  # refused, by one finder


def test_a_driver_run_reads_the_log_of_its_table_twice(spark, tmp_path, monkeypatch):  # noqa: F811
    """delta-rs lists ``_delta_log`` whenever a table is opened or updated (50-75 ms after a
    day of commits a second): a run the driver applies opens its table once and brings that
    object to its commit, rather than opening it again for each question (five times)."""
    from deltalake import DeltaTable

    reads = []
    real_init, real_update = DeltaTable.__init__, DeltaTable.update_incremental

    def init(self, *a, **k):
        reads.append("open")
        real_init(self, *a, **k)

    def update(self, *a, **k):
        reads.append("update")
        return real_update(self, *a, **k)

    out = tmp_path / "out"
    for n in range(1, len(PLAIN) + 1):
        cap = tmp_path / f"cap{n}.pgcap"
        write_capture(cap, PLAIN[:n])
        if n == len(PLAIN):
            monkeypatch.setattr(DeltaTable, "__init__", init)
            monkeypatch.setattr(DeltaTable, "update_incremental", update)
        report = apply_changes(spark, [str(cap)], out, driver_bytes=BIG)
        monkeypatch.undo()
        check_state(out, PLAIN[:n], report)
    assert _by(out) == "driver"
    assert reads == ["open", "update"]
