"""Layers of llmgw_runtime (issue 26): no import circle, and no module imports one above
its floor.

The import graph is read from the source (``ast``), not by importing anything: an edge is
an import that runs when the module is imported, at module level (also under ``if``,
``try`` and ``with``, and in class bodies) or under ``if TYPE_CHECKING:`` (a circle there
still ties the two modules together for the checker and for whoever reads them). Imports
inside functions are left out: they run later, on purpose. Importing ``pkg.sub`` imports
``pkg/__init__`` first, so it counts as importing both, unless ``pkg`` holds the importer
(its own package is already being imported).

A floor holds for everything a module loads, directly or through other modules: a breach
is shown as the chain of imports that reaches above the floor, a circle as its loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "llmgw_runtime"
TOP = ROOT.name

Graph = dict[str, set[str]]

# (importers, what they must not load, why): a module below another never imports it, nor
# anything that does. Each names a module or package below llmgw_runtime, with all it holds.
FLOORS: list[tuple[str, tuple[str, ...], str]] = [
    ("status", ("placement", "devices", "weights", "cli", "store"),
     "the fleet summary is a pure core: it reads the fleet vocabulary, not the planner, "
     "the hardware, the disks or the store"),
    ("router", ("control",), "the router runs without the control service's code"),
    ("status.render", ("cli",), "the console renders the same summary without the CLI"),
    ("api", ("control", "router", "cli", "store", "status"),
     "the messages sit below both sides of every conversation"),
    ("catalog", ("control", "router", "cli", "store"),
     "the catalog is read by the control service, the router and ctl alike"),
    ("store", ("control", "router", "cli", "status"),
     "the store only stores: what is derived from its rows (a replica's drain, a node's) "
     "is the control service's"),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: not those inside functions."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.ClassDef):
            yield from _import_nodes(node.body)
        elif isinstance(node, ast.If):
            yield from _import_nodes(node.body)
            yield from _import_nodes(node.orelse)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody,
                          *(h.body for h in node.handlers)):
                yield from _import_nodes(block)
        elif isinstance(node, ast.With | ast.AsyncWith | ast.For | ast.While):
            yield from _import_nodes(node.body)


def imported_names(module: str, is_package: bool, tree: ast.Module) -> set[str]:
    """Every dotted name ``module`` imports (``from a import b`` gives ``a`` and ``a.b``:
    which of them are modules is the graph's to say), relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(tree.body):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".")
            if node.level > 1:
                base = base[:-(node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        out.add(source)
        out.update(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")
    return out


def build_graph(root: Path = ROOT) -> Graph:
    """Module -> the modules of the package it imports (see the module docstring)."""
    trees = {}
    for path in sorted(root.rglob("*.py")):
        trees[module_name(path, root)] = (path.name == "__init__.py",
                                          ast.parse(path.read_text(), str(path)))
    graph: Graph = {}
    for module, (is_package, tree) in trees.items():
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        if is_package:
            own.add(module)
        edges: set[str] = set()
        for name in imported_names(module, is_package, tree):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in trees and target not in own:
                    edges.add(target)
        edges.discard(module)
        graph[module] = edges
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle (``[a, b, c, a]``), or None: a depth-first walk, iterative."""
    state: dict[str, int] = {}            # 1: on the walk's path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        state[start] = 1
        todo = [iter(sorted(graph[start]))]
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph.get(nxt, ()))))
    return None


def under(module: str, prefix: str, top: str = TOP) -> bool:
    """``module`` is ``prefix`` (a path below ``top``) or one of its submodules."""
    full = f"{top}.{prefix}"
    return module == full or module.startswith(full + ".")


def reached(graph: Graph, start: str) -> dict[str, str | None]:
    """Every module importing ``start`` loads -> the module that imports it on the way
    (None for ``start``)."""
    via: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        module = todo.pop()
        for target in sorted(graph.get(module, ())):
            if target not in via:
                via[target] = module
                todo.append(target)
    return via


def floor_breaches(graph: Graph, importers: str, forbidden: tuple[str, ...],
                   top: str = TOP) -> list[str]:
    """``a -> b -> c`` for every module under ``forbidden`` that importing a module under
    ``importers`` loads, directly or through others."""
    out = []
    for module in sorted(m for m in graph if under(m, importers, top)):
        via = reached(graph, module)
        for target in sorted(via):
            if any(under(target, f, top) for f in forbidden):
                chain = [target]
                while (step := via[chain[-1]]) is not None:
                    chain.append(step)
                out.append(" -> ".join(reversed(chain)))
    return out


# ------------------------------------------------------------------- llmgw_runtime


def test_no_module_of_llmgw_runtime_is_in_an_import_circle() -> None:
    cycle = find_cycle(build_graph())
    assert cycle is None, (
        "import circle: " + " -> ".join(cycle or ()) + "; move what both sides need into a "
        "module below both (tests/test_layers.py)")


@pytest.mark.parametrize(("importers", "forbidden", "why"), FLOORS,
                         ids=[floor[0] for floor in FLOORS])
def test_no_module_imports_one_above_its_floor(importers: str, forbidden: tuple[str, ...],
                                               why: str) -> None:
    breaches = floor_breaches(build_graph(), importers, forbidden)
    assert not breaches, f"{importers} must not load {', '.join(forbidden)} ({why}):\n  " + \
        "\n  ".join(breaches)


def test_the_catalog_package_imports_nothing() -> None:
    # api/catalog.py imports catalog/bounds.py; were catalog/__init__ to import parse.py
    # (which imports api/catalog.py), the two would form a circle.
    assert build_graph()[f"{TOP}.catalog"] == set()


def test_the_status_summary_loads_nothing_but_the_states_the_vocabulary_and_text() -> None:
    # and coop (the standard library alone: its walks give a gevent worker's loop a turn)
    loaded = set(reached(build_graph(), f"{TOP}.status.render"))
    assert loaded == {f"{TOP}.{m}" for m in (
        "status.render", "status.tables", "status.summary", "status.node_facts",
        "status.telling", "status.changes", "fleetvocab", "text", "api", "api.states", "coop")}


# ------------------------------------------------------------------- the checker itself


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under ``root`` from {relative path: source}."""
    for name, source in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import B\nA = 1\n",
        "b.py": "from . import c\nB = 2\n",
        "c.py": "from pkg.a import A\n",
    })
    assert find_cycle(build_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_an_import_under_type_checking_counts_and_one_inside_a_function_does_not(
        tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "b.py": "B = 1\ndef later():\n    from .a import x\n",
        "c.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\n",
        "d.py": "from .c import C\n",
    })
    graph = build_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == set()
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) is None
    (pkg / "b.py").write_text("from .d import D\n")
    assert find_cycle(build_graph(pkg)) == ["pkg.a", "pkg.b", "pkg.d", "pkg.c", "pkg.a"]


def test_importing_a_submodule_imports_its_package_but_not_the_importers_own(
        tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "from .one import ONE\n",
        "low/one.py": "from ..low.two import TWO\nONE = 1\n",
        "low/two.py": "TWO = 2\n",
        "high/__init__.py": "",
        "high/top.py": "import pkg.low.two\nfrom ..low import one\n",
    })
    graph = build_graph(pkg)
    assert graph["pkg.low.one"] == {"pkg.low.two"}        # its own package: no edge
    assert graph["pkg.high.top"] == {"pkg.low", "pkg.low.one", "pkg.low.two"}
    assert find_cycle(graph) is None
    (pkg / "low" / "two.py").write_text("from pkg.high.top import X\n")
    assert find_cycle(build_graph(pkg)) == ["pkg.high.top", "pkg.low", "pkg.low.one",
                                            "pkg.low.two", "pkg.high.top"]


def test_a_floor_breach_is_found_through_other_modules(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "__init__.py": "",
        "status/__init__.py": "",
        "status/summary.py": "from ..vocab import X\n",
        "vocab.py": "from .placement.model import Y\nX = 1\n",
        "placement/__init__.py": "",
        "placement/model.py": "Y = 2\n",
    })
    assert floor_breaches(build_graph(pkg), "status", ("placement",), top="pkg") == [
        "pkg.status.summary -> pkg.vocab -> pkg.placement",
        "pkg.status.summary -> pkg.vocab -> pkg.placement.model"]
    assert floor_breaches(build_graph(pkg), "status", ("devices",), top="pkg") == []
