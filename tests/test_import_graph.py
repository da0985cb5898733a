"""The package's import graph has no cycles, and the names packages export resolve.

Every ``import`` of a ``streamfl`` module, at module level or inside a function, is an edge from
the importing module to the imported one (a package's ``__init__`` only when the package itself is
imported). A cycle means two modules can only be understood together, and lazy imports inside
functions are how such cycles hide, so they count too.
"""
import ast
import importlib
from pathlib import Path
from typing import Dict, List, Set

import pytest

from source_tree import modules

#: Every module of the installed packages, from the file tree (setup.py's own list).
MODULES = modules()


def _imports(name: str, path: Path) -> Set[str]:
    """The streamfl modules ``name`` imports anywhere in its source."""
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    found: Set[str] = set()

    def add(target: str) -> None:
        while target and target not in MODULES:
            target = target.rsplit(".", 1)[0] if "." in target else ""
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                full = "%s.%s" % (base, alias.name)
                add(full if full in MODULES else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.startswith("streamfl"):
            add(node.args[0].value)
    return found


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_scan_sees_the_packages_and_their_imports():
    assert {"streamfl.errors", "streamfl.agent.core", "streamfl.coordinator.core",
            "streamfl.sim.runtime", "streamfl.dvfs.base"} <= set(MODULES)
    # Subpackages below the top-level folders are scanned too (a hand list once missed these).
    assert {"streamfl.methods.sessions.initializers.base", "streamfl.methods.stewc.periods.drift",
            "streamfl.methods.sfedpo.latent.inferred", "streamfl.protocol.transport.paho"} <= set(MODULES)
    assert "streamfl.agent.plugins" in _imports("streamfl.agent.core", MODULES["streamfl.agent.core"])


def test_a_planted_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_no_module_imports_private_names_of_another():
    """A module that needs another's ``_private`` names is really one module split in two."""
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamfl"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    offenders.append("%s: %s from %s" % (name, ", ".join(private), node.module))
    assert offenders == []


def _lazy_exports():
    for name in MODULES:
        if MODULES[name].stem == "__init__" and "_EXPORTS" in MODULES[name].read_text():
            module = importlib.import_module(name)
            for export in module.__all__:
                yield name, export


@pytest.mark.parametrize("package, export", list(_lazy_exports()))
def test_every_lazily_exported_name_resolves(package, export):
    assert getattr(importlib.import_module(package), export) is not None
