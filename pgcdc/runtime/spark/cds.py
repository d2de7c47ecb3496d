"""A class-data-sharing archive of the classes a pgcdc session's driver JVM loads.

A Spark driver loads about 19,000 classes from some 280 jars at its start and first queries:
each read from its jar, parsed and verified. HotSpot's application class-data sharing (a
dynamic archive: ``-XX:ArchiveClassesAtExit`` once, ``-XX:SharedArchiveFile`` after) maps
them from one file instead. On the 2-core machine of docs/performance.md a session's start
to the end of its first job took 5.3-6.4 s with the archive against 10.3-11.6 s without, and
a rerun of ``pgcdc sync`` was ``ready`` in 9.9 s instead of 16.2 s.

``python -m pgcdc.runtime.spark.build_cds`` (:mod:`.build_cds`) builds the archive when there
is none (``make test`` and ``make bench`` do, once) and prints its path; ``--rebuild`` builds
it again. Every session of pgcdc's (:func:`pgcdc.runtime.spark.local_session.session_conf`) then uses
it. It is keyed by the Java runtime and Spark's jars (names, sizes, times), so an upgrade of
either finds none until it is built again, and the JVM itself checks that the classpath is the
one it was built with (else it goes on without it, quietly). ``PGCDC_SPARK_CDS=off`` turns it
off; ``PGCDC_CACHE_DIR`` (default ``$XDG_CACHE_HOME/pgcdc`` or ``~/.cache/pgcdc``) is where it
lives, 160-200 MB (the newest three are kept).

An archive cut short makes the JVM fail at its start (SIGBUS on the missing pages), so one is
used only whole: built under a temporary name by a JVM that exited 0, checked by a JVM that
maps it, then renamed, with its size beside it; one whose size differs is not used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

__all__ = ["archive_path", "cache_dir", "java", "java_options", "whole"]

ENV = "PGCDC_SPARK_CDS"
# the JVM's notes about the archive (one it cannot use, classes it skips when dumping)
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def cache_dir() -> Path:
    given = os.environ.get("PGCDC_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgcdc"


def java() -> Path | None:
    """The java that spark-submit starts: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def _jars() -> Path | None:
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def _key() -> str | None:
    """What the archive was built for: the Java runtime's files and Spark's jars."""
    runtime, jars = java(), _jars()
    if runtime is None or jars is None or not jars.is_dir():
        return None
    h = hashlib.sha256()
    libjvm = runtime.parent.parent / "lib" / "server" / "libjvm.so"
    for f in [runtime, libjvm, *sorted(jars.iterdir())]:
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def archive_path() -> Path | None:
    """Where this Java and this Spark's archive is (or would be); None when off or when
    there is no Java or Spark to key it by."""
    if os.environ.get(ENV, "").lower() == "off":
        return None
    key = _key()
    return None if key is None else cache_dir() / f"spark-{key}.jsa"


def whole(path: Path) -> bool:
    """The archive is there, as long as when it was built."""
    try:
        made = json.loads(path.with_suffix(".json").read_text())
        return path.stat().st_size == made["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def java_options() -> str:
    """The driver JVM's options to use the archive, or "" when there is none."""
    path = archive_path()
    if path is None or not whole(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"
