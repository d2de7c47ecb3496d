"""The import graph of the hand-written code against the map in docs/architecture.md.

The map's ``layers`` block lists the layers from the top (commands) to the ground floor (the
codec runtime), each a line of module prefixes. A module may import its own layer and the
layers below it, never one above (an arrow back up), and no set of modules may import each
other in a circle. Imports are read from the source with ``ast``, lazy ones inside functions
included: a circle through a function-level import is still a circle a newcomer must keep in
their head. Only ``if TYPE_CHECKING:`` imports are left out.
"""

from __future__ import annotations

import pytest

import ast
import re
from collections import defaultdict
from pathlib import Path

pytestmark = pytest.mark.fast  # no Java, PostgreSQL server or npm

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pgcdc", "codegen")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph() -> dict[str, set[str]]:
    """module -> the hand-written modules it imports (a package's submodule when the import
    names one, else the package itself)."""
    mods = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    up = base[: len(base) - (node.level - 1)]
                    target = ".".join(up + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [target, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
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
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_has_a_layer():
    table = layers()
    missing = sorted(m for m in _modules() if layer_of(m, table) is None)
    assert not missing, f"modules docs/architecture.md does not place: {missing}"


def test_imports_only_go_down():
    table = layers()
    up = []
    for src, targets in sorted(import_graph().items()):
        for dst in sorted(targets):
            a, b = layer_of(src, table), layer_of(dst, table)
            if a is not None and b is not None and b < a:
                up.append(f"{src} -> {dst}")
    assert not up, "imports against the direction of docs/architecture.md: " + ", ".join(up)


def test_the_checker_sees_a_circle_and_an_arrow_up():
    # the checks above must be able to fail: a made-up graph with both defects
    graph = {"pgcdc.lsn": {"pgcdc.cli"}, "pgcdc.cli": {"pgcdc.lsn"}}
    assert cycles(graph) == [["pgcdc.cli", "pgcdc.lsn"]]
    table = layers()
    assert layer_of("pgcdc.cli", table) < layer_of("pgcdc.lsn", table)
