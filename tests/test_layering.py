"""The package layering: imports point one way, so no module (and no sub-package) depends on itself.

Units: every module of b2t/ and preprocess/, and, one level up, each sub-package
(`b2t.train`, `b2t.model`, ...) with each top-level module of `b2t` on its own. Imports
inside functions and under TYPE_CHECKING count too: a cycle there is still a cycle in the
design, only hidden from the interpreter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("b2t", "preprocess")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a `from pkg import name` of a submodule counts)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def unit_of(module: str) -> str:
    """`b2t.train.loop` -> `b2t.train`; `b2t.config` -> `b2t.config`; `preprocess.writer` -> itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that starts and ends at the same node, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_imports_itself_through_others():
    assert find_cycle(import_graph()) is None


def test_no_sub_package_depends_on_itself_through_others():
    units: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        units.setdefault(unit_of(module), set()).update(unit_of(d) for d in deps if unit_of(d) != unit_of(module))
    assert find_cycle(units) is None


@pytest.mark.parametrize(("low", "high"), [("b2t.config", "b2t.train"), ("b2t.model", "b2t.train"),
                                           ("b2t.decoding", "b2t.train"), ("b2t.contract", "b2t.data")])
def test_lower_layers_do_not_import_higher_ones(low, high):
    graph = import_graph()
    offenders = sorted(m for m, deps in graph.items() if unit_of(m) == low and any(unit_of(d) == high for d in deps))
    assert offenders == []
