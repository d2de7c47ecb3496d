"""Ship pgcdc and its codecs to Spark executors that do not have them installed.

A job's tasks run functions of ``pgcdc.spark`` (pickled by reference), so every executor's
Python must import ``pgcdc``, ``pgoutput_codec`` and ``replication_codec``. On a cluster they
are not installed: :func:`ship_packages` zips the three packages as this driver imports them
(built once per content, named by its hash) and adds the zip with ``SparkContext.addPyFile``;
Spark copies it to each executor and puts it on the Python workers' ``sys.path``.

The zip also holds the compiled accelerators (``_speedups.*.so``) where they are built.
Python's zip importer cannot load extension modules, so when ``pgcdc.spark`` itself is
imported from a zip it installs :class:`ZipExtensionFinder`, which extracts a shipped
package's extension module next to the zip (once, atomically) and loads it from there. If
that fails, or the module was built for another Python, the codecs fall back to pure Python
(they treat an ImportError of their accelerator so), so the results are the same, only slower.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = [
    "PACKAGES",
    "ZipExtensionFinder",
    "build_zip",
    "install_zip_extension_finder",
    "ship_packages",
]

PACKAGES = ("pgcdc", "pgoutput_codec", "replication_codec")
# sources and build products the executors do not need
_SKIP_SUFFIXES = (".pyc", ".pyo", ".c", ".h", ".o")
_NATIVE_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the same files give the same bytes (and name)
_shipped: set[tuple[str, str]] = set()


def _package_dir(name: str) -> Path:
    module = importlib.import_module(name)  # imported here, so addPyFile's zip never shadows it
    return Path(next(iter(module.__path__)))


def _files(native: bool) -> list[tuple[str, Path]]:
    out = []
    for name in PACKAGES:
        root = _package_dir(name)
        for path in sorted(root.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.name.endswith(_SKIP_SUFFIXES):
                continue
            if path.name.endswith(_NATIVE_SUFFIXES) and not native:
                continue
            out.append((f"{name}/{path.relative_to(root).as_posix()}", path))
    return out


def build_zip(directory=None, *, native: bool = True) -> Path:
    """A zip of :data:`PACKAGES` as imported here (``native``: with their compiled
    accelerators), written into ``directory`` (default: a per-user temporary directory) as
    ``pgcdc-executors-<hash>.zip``; an existing zip of the same content is reused."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, path in _files(native):
            info = zipfile.ZipInfo(arcname, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, path.read_bytes())
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    if directory is None:
        directory = Path(tempfile.gettempdir()) / f"pgcdc-executors-{os.getuid()}"
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"pgcdc-executors-{digest}.zip"
    if not target.exists():
        tmp = directory / f".{target.name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target


def is_local_master(spark) -> bool:
    return spark.sparkContext.master.startswith("local")


def ship_packages(spark, *, native: bool = True, directory=None) -> Path:
    """Add the packages' zip to ``spark``'s executors (once per application and content);
    returns the zip's path on the driver."""
    sc = spark.sparkContext
    path = build_zip(directory, native=native)
    key = (sc.applicationId, path.name)
    if key not in _shipped:
        sc.addPyFile(str(path))
        _shipped.add(key)
    return path


# --- on the executors -----------------------------------------------------------------------------


def _split_zip(entry: str) -> tuple[str, str] | None:
    """'/dir/x.zip/pkg/sub' -> ('/dir/x.zip', 'pkg/sub'); None when not inside a zip file."""
    head, sep, tail = entry.partition(".zip" + os.sep)
    if not sep:
        return None
    archive = head + ".zip"
    return (archive, tail.replace(os.sep, "/")) if os.path.isfile(archive) else None


def _extract(archive: str, info: zipfile.ZipInfo, z: zipfile.ZipFile) -> Path:
    """The member as a file beside the archive (or in the temporary directory when that is
    not writable), written once under a name that changes with its content."""
    name = f"{info.CRC:08x}-{info.file_size}-{info.filename.replace('/', '.')}"
    candidates = [
        Path(archive).parent / ".pgcdc-native",
        Path(tempfile.gettempdir()) / "pgcdc-native",
    ]
    for directory in candidates:
        target = directory / name
        if target.exists():
            return target
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / f".{name}.{os.getpid()}.tmp"
            tmp.write_bytes(z.read(info))
            os.replace(tmp, target)  # racing workers write the same bytes
            return target
        except OSError:
            continue
    raise ImportError(f"cannot extract {info.filename} from {archive}")


class ZipExtensionFinder(importlib.abc.MetaPathFinder):
    """Finds extension modules of :data:`PACKAGES` inside a zip on the package's path and
    loads them from an extracted copy (the zip importer cannot load them)."""

    def find_spec(self, fullname, path=None, target=None):
        if not path or fullname.partition(".")[0] not in PACKAGES or "." not in fullname:
            return None
        leaf = fullname.rpartition(".")[2]
        for entry in path:
            where = _split_zip(str(entry))
            if where is None:
                continue
            archive, inner = where
            try:
                with zipfile.ZipFile(archive) as z:
                    for suffix in _NATIVE_SUFFIXES:
                        try:
                            info = z.getinfo(f"{inner}/{leaf}{suffix}")
                        except KeyError:
                            continue
                        extracted = _extract(archive, info, z)
                        loader = importlib.machinery.ExtensionFileLoader(fullname, str(extracted))
                        return importlib.util.spec_from_file_location(
                            fullname, str(extracted), loader=loader
                        )
            except (OSError, zipfile.BadZipFile, ImportError):
                return None  # the zip importer goes on: pure Python
        return None


def install_zip_extension_finder() -> None:
    """Put :class:`ZipExtensionFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, ZipExtensionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ZipExtensionFinder())
