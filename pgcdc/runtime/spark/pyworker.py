"""The interpreter a local session gives Spark for its Python processes (``pgcdc-spark-python``).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
process's path. Python compiles what it imports from a zip at each start and caches nothing,
so each process Spark starts spends about 0.35 s (on a 2-core machine) compiling pyspark: the
planner of a Python data source, and the process that runs a streaming query's offsets, which
is started anew with every query. With pyspark installed by pip, ``SPARK_HOME`` *is* the
installed package, so its compiled modules in site-packages are the same code: this launcher
puts the zips after them and then runs ``-m module ...`` as Python would. Anything else (the
``-c`` version check, a zip of another Spark install) runs unchanged.

Importing this module imports nothing of pyspark (the point is to do it after).
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder


SCRIPT = "pgcdc-spark-python"  # the console script of :func:`main`, beside the interpreter


def is_spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def reordered(path: list[str]) -> list[str]:
    """``path`` with Spark's zips after the rest, when the pyspark found without them is the
    one they came with (the zips lie inside its package); else ``path`` unchanged."""
    zips = [p for p in path if is_spark_zip(p)]
    if not zips:
        return path
    rest = [p for p in path if p not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.submodule_search_locations:
        return path  # no installed pyspark: the zip is the only one
    home = os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep
    if not all(os.path.realpath(z).startswith(home) for z in zips):
        return path  # SPARK_HOME is another install: its own code, as Spark meant
    return rest + zips


def worker_python() -> str:
    """The interpreter for a local session's Python processes: :data:`SCRIPT` beside this
    interpreter when it is installed there (``pip install`` makes it), else this one."""
    script = os.path.join(os.path.dirname(sys.executable), SCRIPT)
    return script if os.access(script, os.X_OK) else sys.executable


def main() -> None:
    """``pgcdc-spark-python -m module args...``: the module run as ``python -m`` runs it,
    with the path of :func:`reordered`; any other arguments are handed to this interpreter."""
    # the fork server runs as `python -m`: runpy warns when it was imported before
    from pgcdc.runtime.spark.forkserver import run_forked, serves, stop_on_sigterm  # lazy: runpy

    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    sys.path[0] = os.getcwd()  # where `python -m` looks first (the script's folder here)
    sys.path[:] = reordered(sys.path)
    code = run_forked(args[1], args[2:], sys.path)  # in a child of the session's fork server
    if code is not None:
        sys.exit(code)
    if serves(args[1]):
        stop_on_sigterm()
    import runpy

    sys.argv = [args[1], *args[2:]]  # runpy sets argv[0] to the module's file
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
