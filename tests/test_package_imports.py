"""The packages of fabro_git import one another in one direction only.

Every import of every module counts, lazy ones inside functions and those under
TYPE_CHECKING included: a cycle between packages is a cycle in the design even when
Python tolerates it at run time.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers import parsed

import fabro_git

ROOT = Path(fabro_git.__file__).parent


def _unit(module: str) -> str | None:
    """The first-level package (or top-level module) a `fabro_git.…` name belongs to;
    None for names outside fabro_git and for attributes of fabro_git itself."""
    parts = module.split(".")
    if parts[0] != "fabro_git" or len(parts) < 2:
        return None
    if not ((ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").exists()):
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = parsed(path)
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.add(base)
            # `from fabro_git import handlers` names a package in the alias.
            found.update(f"{base}.{alias.name}" for alias in node.names if base == "fabro_git")
    return found


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        source = (
            _unit(_module_name(path)) if path.parent != ROOT or path.name != "__init__.py" else None
        )
        if source is None:
            continue
        for name in _imports(path):
            target = _unit(name)
            if target is not None and target != source:
                graph[source].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_between_packages() -> None:
    graph = package_graph()
    assert "engine" in graph and "handlers" in graph  # the scan sees the code
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_handlers_never_import_the_store() -> None:
    imported = package_graph()["handlers"]
    assert "engine" in imported  # the scan saw the handlers
    assert "store" not in imported
