"""Old import paths of modules that moved: they keep working for one release, with a warning.

``import pgcdc.runtime.spark_arrow`` (or ``from pgcdc.runtime import spark_arrow``) gives the
module at its new path, ``pgcdc.runtime.spark.arrow``, the same module object, and a
DeprecationWarning naming the new path. One finder on ``sys.meta_path`` answers for every name
in :data:`MOVED`, so a moved module leaves no stub file behind; ``pgcdc/__init__.py`` puts
the finder in place, before any submodule of pgcdc can be looked up.

To retire an old path, delete its line here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module name -> new module name, all moved after 0.2.0: the codec-on-Spark runtime became
# a package, the commands went to pgcdc.cli, the JSON Lines renderer to pgcdc.events.jsonlines
MOVED = {
    **{
        f"pgcdc.runtime.spark_{name}": f"pgcdc.runtime.spark.{name}"
        for name in ("arrow", "batches", "buffers", "columns", "jvm", "plan", "quiet", "rows")
    },
    "pgcdc.changes": "pgcdc.events.jsonlines",
    "pgcdc.capture.cli": "pgcdc.cli.capture",
    "pgcdc.apply_cli": "pgcdc.cli.apply",
    "pgcdc.snapshot_cli": "pgcdc.cli.snapshot",
    # a folder for each thing a user names (apply, streaming, snapshot, events); the capture
    # format's reader beside its writer
    **{
        f"pgcdc.spark.{old}": f"pgcdc.apply.{new}"
        for old, new in (
            ("apply", "run"),
            ("ops", "ops"),
            ("driver_apply", "driver"),
            ("delta", "delta"),
            ("vacuum", "vacuum"),
            ("reshape", "reshape"),
        )
    },
    **{
        f"pgcdc.spark.{old}": f"pgcdc.streaming.{new}"
        for old, new in (
            ("source", "slot"),
            ("source_typed", "typed"),
            ("held_stream", "held"),
            ("json_runs", "json_runs"),
            ("capture_source", "directory"),
        )
    },
    "pgcdc.spark.snapshot": "pgcdc.snapshot.job",
    "pgcdc.spark.snapshot_arrow": "pgcdc.snapshot.binary_copy",
    **{
        f"pgcdc.{name}": f"pgcdc.events.{name}"
        for name in ("transactions", "relations", "spill", "jsonlines", "gcpause")
    },
    "pgcdc.sources": "pgcdc.capture.files",
    "pgcdc.chunks": "pgcdc.capture.chunks",
    # one name per module: no two modules of pgcdc's library share a name
    "pgcdc.spark.batches": "pgcdc.spark.table_batches",
    "pgcdc.sync.columns": "pgcdc.sync.drift",
    "pgcdc.sync.metrics": "pgcdc.sync.endpoint",
    "pgcdc.capture.stream": "pgcdc.capture.logical",
    "pgcdc.runtime.capture": "pgcdc.runtime.capture_file",
    "pgcdc.runtime.errors": "pgcdc.runtime.codec_errors",
    "pgcdc.runtime.spark.session": "pgcdc.runtime.spark.local_session",
    # exit statuses are the commands' alone (the library raises pgcdc.errors)
    "pgcdc.exits": "pgcdc.cli.exits",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of MOVED and loads each as the module at its new name."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # a placeholder: exec_module puts the real module in its place

    def exec_module(self, module):
        old = module.__name__
        new = MOVED[old]
        # stacklevel 2: the warning names the line that imports the old path (the import
        # system's own frames are skipped)
        warnings.warn(
            f"{old} moved to {new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        # the import system hands out whatever sys.modules holds under the old name once the
        # module has run, and binds that on the parent package: the new module itself
        sys.modules[old] = importlib.import_module(new)


_FINDER = _MovedFinder()


def install() -> None:
    """Put the finder on sys.meta_path (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_FINDER)
