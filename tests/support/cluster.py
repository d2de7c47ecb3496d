"""A Spark standalone cluster on 127.0.0.1 for tests: one master and one worker started from
pyspark's own distribution (``bin/spark-class``), and a Python for its executors that does
not have pgcdc.

The executors' Python (:func:`bare_python`) is a virtual environment made without pip whose
only addition is a ``.pth`` line naming this venv's site-packages directory. A path line in a
``.pth`` file puts that directory on ``sys.path`` but does not run the ``.pth`` files inside
it, so pyspark, pyarrow and psycopg import while the editable install of pgcdc (an import
hook started by a ``.pth`` file there) is not active: ``import pgcdc`` fails unless Spark
ships it. The worker runs with ``PYTHONPATH`` empty and ``PYTHONNOUSERSITE=1``, which its
executors and their Python workers inherit.

``python -m tests.support.cluster run MASTER OUT SPLIT CAPTURE...`` is a driver that applies
captures on the cluster and reports, as JSON, what an executor's Python imports before and
after the run (:func:`run`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from dataclasses import dataclass
from pathlib import Path
import pyspark
from tests.wait import until, WaitTimeout  # noqa: E402


SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_python(directory: Path) -> Path:
    """An interpreter with this venv's dependencies but without pgcdc (see the docstring)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120
    )
    site = Path(
        sysconfig.get_path("purelib", vars={"base": str(directory), "platbase": str(directory)})
    )
    site.mkdir(parents=True, exist_ok=True)
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return directory / "bin" / "python"


def cluster_env(python: Path) -> dict:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=str(python),
        PYTHONPATH="",
        PYTHONNOUSERSITE="1",
        SPARK_DAEMON_MEMORY="512m",
    )
    return env


@dataclass
class Cluster:
    master_url: str
    webui: str
    work_dir: Path
    python: Path
    env: dict
    procs: list


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen) -> None:
    """TERM the process group this module started (the worker's executors are in it), then
    KILL it if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _alive_workers(webui: str) -> int:
    with urllib.request.urlopen(webui + "/json/", timeout=5) as r:
        doc = json.load(r)
    return sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE")


def _logs(tmp: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in tmp.glob("*.log")
    )


@contextlib.contextmanager
def standalone_cluster(tmp: Path, *, python: Path | None = None, timeout: float = 180):
    """A master and one worker (1 core, 1 GB) on 127.0.0.1, stopped on exit (also on
    failure); logs and the worker's work directory under ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    python = python or bare_python(tmp / "executor-python")
    env = cluster_env(python)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, webui_port, worker_ui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    webui = f"http://127.0.0.1:{webui_port}"
    work_dir = tmp / "work"
    procs = []
    try:
        procs.append(
            _start(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(webui_port)],
                env, tmp / "master.log",
            )
        )  # fmt: skip
        procs.append(
            _start(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--webui-port", str(worker_ui), "--cores", "1", "--memory", "1g",
                 "--work-dir", str(work_dir), master_url],
                env, tmp / "worker.log",
            )
        )  # fmt: skip

        def registered():
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a cluster process exited ({p.returncode})\n{_logs(tmp)}")
            return _alive_workers(webui) >= 1

        try:
            until("a worker registered", registered, timeout, 0.1, ignore=(OSError, ValueError))
        except WaitTimeout as e:
            raise RuntimeError(f"{e}\n{_logs(tmp)}") from None
        yield Cluster(master_url, webui, work_dir, python, env, procs)
    finally:
        for p in reversed(procs):
            _stop(p)


# --- a driver that probes the executors' Python ---------------------------------------------------


def _what_imports(_):
    """Runs on an executor: where pgcdc and the codecs come from, and whether the compiled
    accelerator loaded."""
    import sys

    out = {"python": sys.executable}
    try:
        import pgcdc
        import pgcdc.spark  # what every pgcdc Spark job imports first (pgcdc.spark.ship)
        import pgoutput_codec
        import replication_codec
    except ImportError as e:
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    out["pgcdc"] = pgcdc.__file__
    out["pgoutput_codec"] = pgoutput_codec.__file__
    out["accelerated"] = [pgoutput_codec.use_speedups(True), replication_codec.use_speedups(True)]
    return out


def run(master: str, out: str, split_records: int, captures: list[str]) -> dict:
    """A driver on the cluster, with the session ``pgcdc apply --master`` builds: what an
    executor task imports before the run, ``apply_changes`` (which ships the packages, the
    master not being local), what a task imports after it."""
    from pyspark import cloudpickle

    from pgcdc.spark.session import apply_session as _session
    from pgcdc.apply.run import apply_changes

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the executors lack `tests`
    spark = _session(master)
    try:
        sc = spark.sparkContext
        before = sc.parallelize([0], 1).map(_what_imports).collect()[0]
        report = apply_changes(spark, captures, out, split_records=split_records)
        after = sc.parallelize([0], 1).map(_what_imports).collect()[0]
        return {"before": before, "after": after, "report": report}
    finally:
        spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"] and len(sys.argv) > 5:
        print(json.dumps(run(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])))
    else:
        sys.exit("usage: python -m tests.support.cluster run MASTER OUT SPLIT_RECORDS CAPTURE...")
