"""The import graph of the hand-written code against the map in docs/architecture.md, and the
house rules a reader of one file cannot see.

The map's ``layers`` block lists the layers from the top (commands) to the ground floor (the
codec runtime), each a line of module prefixes. A module may import its own layer and the
layers below it, never one above (an arrow back up), and no set of modules may import each
other in a circle. Imports are read from the source with ``ast``, lazy ones inside functions
included: a circle through a function-level import is still a circle a newcomer must keep in
their head. Only ``if TYPE_CHECKING:`` imports are left out.

The house rules: no library module imports ``argparse`` (the commands in ``pgcdc/cli/`` parse
arguments, the library takes a config); an import of pgcdc's own modules or of a generated
codec inside a function says why it is there (``# lazy: <reason>``: an optional dependency
it pulls, or a cost at import); one module per name in pgcdc; no circle in bench/; no test
module imports another (what tests share lives in conftest plugins and support modules).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pgcdc", "codegen")
LIBRARY = ROOT / "pgcdc"
COMMANDS = LIBRARY / "cli"  # one module per command, named for it
# the codecs `make generate` renders, top-level packages beside pgcdc
CODECS = frozenset(p.parent.name for p in (ROOT / "generated").glob("*/__init__.py"))
LAZY = re.compile(r"# lazy: \S")  # what a function-level import of our own code says


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(packages=PACKAGES) -> dict[str, Path]:
    return {_module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once for all the checks."""
    return ast.parse(path.read_text(), str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def function_level_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports inside a def or class body, but those under ``if TYPE_CHECKING:``."""
    skip = _type_checking_nodes(tree)
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

    def walk(node: ast.AST, inside: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if inside and id(child) not in skip:
                    yield child
            else:
                yield from walk(child, inside or isinstance(child, scopes))

    yield from walk(tree, False)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of ``module`` names: modules, or names in them
    (``from a import b`` gives ``a`` and ``a.b``); a relative import resolved."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        up = base[: len(base) - (node.level - 1)]
        target = ".".join(up + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target, *(f"{target}.{a.name}" for a in node.names)]


def import_graph(packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the hand-written modules of ``packages`` it imports (a package's submodule
    when the import names one, else the package itself)."""
    mods = _modules(packages)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        tree = _tree(path)
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _imported(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                target, names = targets[0], targets[1:]
                subs = [n for n in names if n in mods]
                targets = subs if len(subs) == len(names) else [target, *subs]
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a module: its nearest package
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def layers() -> list[list[str]]:
    """The ``layers`` block of docs/architecture.md: module prefixes per layer, top first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```text layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```text layers block"
    out = []
    for line in block.group(1).splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.append(line.split(":", 1)[1].split())
    return out


def layer_of(module: str, table: list[list[str]]) -> int | None:
    """The layer of the longest prefix naming ``module`` (or a package above it); a prefix
    written ``=name`` names only the module ``name``."""
    best, at = -1, None
    for i, prefixes in enumerate(table):
        for p in prefixes:
            if p.startswith("="):  # that module alone (a package's __init__)
                hit = module == p[1:]
            else:
                hit = module == p or module.startswith(p + ".")
            if hit and len(p) > best:
                best, at = len(p), i
    return at


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, (
        "import circles: "
        + "; ".join(" <-> ".join(c) for c in found)
        + ". Break each: move what the modules share into a module below them (or into the "
        "lower one), so the imports go one way."
    )


def test_every_module_has_a_layer():
    table = layers()
    missing = sorted(m for m in _modules() if layer_of(m, table) is None)
    assert not missing, (
        f"modules docs/architecture.md does not place: {missing}. Add each (or its package) "
        "to the line of its layer in the ```text layers block there."
    )


def test_imports_only_go_down():
    table = layers()
    up = []
    for src, targets in sorted(import_graph().items()):
        for dst in sorted(targets):
            a, b = layer_of(src, table), layer_of(dst, table)
            if a is not None and b is not None and b < a:
                up.append(f"{src} -> {dst}")
    assert not up, (
        "imports against the direction of docs/architecture.md: "
        + ", ".join(up)
        + ". Move the code the lower module needs down to its layer (or hand it in as an "
        "argument); change the layers block only if the map itself is wrong."
    )


def test_the_checker_sees_a_circle_and_an_arrow_up():
    # the checks above must be able to fail: a made-up graph with both defects
    graph = {"pgcdc.lsn": {"pgcdc.cli"}, "pgcdc.cli": {"pgcdc.lsn"}}
    assert cycles(graph) == [["pgcdc.cli", "pgcdc.lsn"]]
    table = layers()
    assert layer_of("pgcdc.cli", table) < layer_of("pgcdc.lsn", table)


def test_no_library_module_imports_argparse():
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        if COMMANDS in path.parents:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] == "argparse" for n in names):
                found.append(_where(path, node))
    assert not found, (
        "argparse imported outside pgcdc/cli/: "
        + ", ".join(found)
        + ". Parse the arguments in the command's module of pgcdc/cli/ and hand the library a "
        "config (a dataclass, as CaptureConfig) or plain arguments."
    )


def test_a_function_level_import_of_our_own_code_says_why():
    found = []
    for name, path in sorted(_modules().items()):
        lines = path.read_text().splitlines()
        package = path.name == "__init__.py"
        for node in function_level_imports(_tree(path)):
            targets = _imported(node, name, package)
            ours = any(t.split(".")[0] in ("pgcdc", *CODECS) for t in targets)
            if ours and not LAZY.search(lines[node.lineno - 1]):
                found.append(_where(path, node))
    assert not found, (
        "imports of pgcdc's modules or of a generated codec inside a function, with no reason "
        "given: "
        + ", ".join(found)
        + ". Move each to the top of its module; one that must stay (an optional dependency "
        "it pulls, a cost at import) ends its first line with '# lazy: <the reason>'."
    )


def test_one_module_per_name():
    modules = [
        p
        for p in sorted(LIBRARY.rglob("*.py"))
        if COMMANDS not in p.parents and p.stem not in ("__init__", "__main__")
    ]
    packages = {p.parent.name: p.parent for p in LIBRARY.rglob("*/__init__.py")}
    by_name = defaultdict(list)
    for p in modules:
        by_name[p.stem].append(str(p.relative_to(ROOT)))
    same = [" ~ ".join(paths) for paths in by_name.values() if len(paths) > 1]
    same += [
        f"{p.relative_to(ROOT)} ~ {packages[p.stem].relative_to(ROOT)}/"
        for p in modules
        if p.stem in packages
    ]
    assert not same, (
        "modules that share a name (with a module, or with a package of pgcdc): "
        + "; ".join(same)
        + ". Rename one for what it holds (pgcdc/cli/ is left out: a module per command, "
        "named for it)."
    )


def test_no_import_circles_in_bench():
    found = cycles(import_graph(("bench",)))
    assert not found, (
        "import circles in bench/: "
        + "; ".join(" <-> ".join(c) for c in found)
        + ". Move what the benchmarks share into a module of its own that both import (as "
        "bench/workload.py holds the streaming workload)."
    )


def test_no_test_module_imports_another():
    found = []
    for name, path in sorted(_modules(("tests",)).items()):
        package = path.name == "__init__.py"
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(node, name, package):
                if target.rpartition(".")[2].startswith("test_") and target != name:
                    found.append(f"{_where(path, node)} imports {target}")
                    break
    assert not found, (
        "test modules imported by other test modules: "
        + ", ".join(found)
        + ". Move the fixtures and helpers they share into a conftest plugin (or a support "
        "module of tests/) and import that; a test module holds tests only."
    )


def test_the_house_checks_see_their_defects():
    # the checks above must be able to fail: a function-level import without a reason, one
    # with, one under TYPE_CHECKING, a third-party one; a relative import of a test module
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import pgcdc.lsn\n"
        "def f():\n"
        "    from pgcdc.lsn import parse_lsn\n"
        "    import pgoutput_codec  # lazy: a reason\n"
        "    if TYPE_CHECKING:\n"
        "        from pgcdc.values import Catalog\n"
        "    import json\n"
    )
    found = [(n.lineno, _imported(n, "pgcdc.x", False)) for n in function_level_imports(tree)]
    assert found == [(4, ["pgcdc.lsn", "pgcdc.lsn.parse_lsn"]), (5, ["pgoutput_codec"]),
                     (8, ["json"])]  # fmt: skip
    assert LAZY.search("    import pgoutput_codec  # lazy: a reason")
    assert not LAZY.search("    import pgoutput_codec  # lazy:")
    assert not LAZY.search("    import pgoutput_codec  # lazy")
    relative = ast.parse("from .test_sync import Sync").body[0]
    assert _imported(relative, "tests.test_x", False)[0] == "tests.test_sync"
