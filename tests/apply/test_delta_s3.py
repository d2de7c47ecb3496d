"""apply into Delta Lake tables on S3: moto's standalone S3 server on 127.0.0.1 (a free
port, started and stopped here), reached through the standard AWS environment variables
and ``AWS_ENDPOINT_URL``.

What this exercises: ``apply_changes`` and ``pgcdc apply --out s3://bucket/prefix`` (Spark
tasks writing the data files with pyarrow's S3 client, delta-rs committing), incremental
runs, tables read back by delta-rs from S3; delta-rs's commit on S3 with conditional writes
(``PutObject`` with ``If-None-Match: *``, which moto answers with 412 when the object exists:
checked here) by two writers racing for the same version (both land, as two versions, or one
fails with a conflict; no commit is lost); and that the credentials appear in no output,
error, commit metadata, state file or ``pgcdc status``. What it does not: real AWS (its
consistency, IAM, multipart sizes), DuckDB over S3 (needs the httpfs extension), GCS, ADLS,
HDFS, a DynamoDB lock.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

pytest.importorskip("deltalake")
pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")

from deltalake import DeltaTable  # noqa: E402

from pgcdc.apply import delta  # noqa: E402
from pgcdc.apply.run import apply_changes  # noqa: E402
from tests.support.apply_runs import REPO, TABLES  # noqa: E402
from tests.support.truth import _rows_of  # noqa: E402
from tests.wait import until  # noqa: E402

KEY_ID = "AKIAPGCDCTESTKEY1234"
SECRET = "pgcdc-test-secret-Zq8vX2mN7"
BUCKET = "pgcdc-tables"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    try:

        def listening():
            assert proc.poll() is None, "moto did not start"
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True

        until("moto listening", listening, ignore=(OSError,))
        client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )  # fmt: skip
        client.create_bucket(Bucket=BUCKET)
        yield {"env": env, "client": client}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def aws_env(s3, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    return s3


def _no_secret(text: str, where: str) -> None:
    assert SECRET not in text, f"the secret key is in {where}"
    assert KEY_ID not in text, f"the access key id is in {where}"


def test_the_server_refuses_a_conditional_overwrite(aws_env):
    """What delta-rs's safe commit relies on: PutObject with If-None-Match: * fails with
    412 when the object exists."""
    c = aws_env["client"]
    c.put_object(Bucket=BUCKET, Key="probe/x", Body=b"1")
    with pytest.raises(Exception, match="PreconditionFailed|412"):
        c.put_object(Bucket=BUCKET, Key="probe/x", Body=b"2", IfNoneMatch="*")


def test_apply_to_s3_incremental(aws_env, runs, spark):  # noqa: F811
    out = f"s3://{BUCKET}/api"
    apply_changes(spark, [str(runs["cap1"])], out, split_records=200)
    for t in TABLES:
        expected, rows = runs["truth1"][t]
        got = _rows_of(DeltaTable(f"{out}/public.{t}").to_pyarrow_table(), rows)
        assert got == expected, f"phase 1: {t}"
    report = apply_changes(spark, [str(runs["cap"])], out, split_records=200)
    assert report
    for t in TABLES:
        expected, rows = runs["truth2"][t]
        dt = DeltaTable(f"{out}/public.{t}")
        assert _rows_of(dt.to_pyarrow_table(), rows) == expected, f"phase 2: {t}"
        for info in dt.history():
            _no_secret(json.dumps(info), f"the commit metadata of {t}")
    state = aws_env["client"].get_object(Bucket=BUCKET, Key="api/_pgcdc_state.json")
    state = state["Body"].read().decode()
    _no_secret(state, "_pgcdc_state.json")
    assert json.loads(state)["layout"] == "delta"
    assert apply_changes(spark, [str(runs["cap"])], out) == {}


def test_cli_to_s3_and_credentials_never_show(aws_env, runs):  # noqa: F811
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    out = f"s3://{BUCKET}/cli"
    run = subprocess.run(
        [sys.executable, "-m", "pgcdc", "apply", str(runs["cap"]), "--out", out,
         "--master", "local[1]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    _no_secret(run.stdout + run.stderr, "pgcdc apply's output")
    for t in TABLES:
        expected, rows = runs["truth2"][t]
        got = _rows_of(DeltaTable(f"{out}/public.{t}").to_pyarrow_table(), rows)
        assert got == expected, t
    # a bucket that does not exist: an error, exit 1, and still no credential in it
    bad = subprocess.run(
        [sys.executable, "-m", "pgcdc", "apply", str(runs["cap"]), "--out",
         "s3://no-such-bucket-pgcdc/x", "--master", "local[1]"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "pgcdc apply" in bad.stderr
    _no_secret(bad.stdout + bad.stderr, "the error")


def test_two_writers_racing_for_one_version(aws_env):
    """delta-rs commits on S3 by a conditional PUT of the next log entry: two writers that
    both read version N and commit at once end as N+1 and N+2 (the loser retries on top of
    the winner's commit, as an append may) or one fails; no commit overwrites another."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    uri = f"s3://{BUCKET}/race/t"
    fs, root = delta.filesystem(uri)
    schema = pa.schema([("id", pa.int64())])

    def put(name: str, n: int) -> delta.DataFile:
        pq.write_table(pa.table({"id": list(range(n))}, schema=schema), f"{root}/{name}",
                       filesystem=fs)  # fmt: skip
        return delta.DataFile(name, fs.get_file_info(f"{root}/{name}").size, n, "{}")

    delta.commit(uri, [put("d/base.parquet", 1)], schema, app_version=1)
    files = [put(f"d/w{i}.parquet", 10 + i) for i in range(2)]
    results = [None, None]
    start = threading.Barrier(2)

    def writer(i):
        start.wait()
        try:
            results[i] = delta.commit(uri, [files[i]], schema, app_version=2 + i)
        except delta.DeltaError as e:
            results[i] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    dt = DeltaTable(uri)
    landed = [i for i in range(2) if isinstance(results[i], int)]
    assert landed, results
    assert dt.version() == len(landed)  # one version per commit that landed
    assert dt.to_pyarrow_table().num_rows == 1 + sum(10 + i for i in landed)
    for r in results:
        if not isinstance(r, int):
            _no_secret(str(r), "a commit conflict's error")
