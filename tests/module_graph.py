"""swarmd's import graph, read from the source (no import runs): for tests/unit/test_module_graph.py (module
cycles, the extension seam) and tests/unit/test_layers.py (which package may import which).

Imports anywhere in a module count (inside functions too: swarmd imports heavy packages lazily, and a lazy
import is still a dependency); `from pkg import module` counts as importing the module, a package as its
__init__. TYPE_CHECKING-only imports count as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import swarmd

__all__ = ["PACKAGE", "module_name", "import_graph", "find_cycle", "unit_of"]

PACKAGE = Path(swarmd.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: its top-level package or module under swarmd (`swarmd.swarm.dht` ->
    `swarmd.swarm`, `swarmd.tasks.albert.model` -> `swarmd.tasks`, `swarmd.errors` -> itself, `swarmd` -> itself)."""
    return ".".join(module.split(".")[:2])


def import_graph() -> dict[str, set[str]]:
    """module -> the swarmd modules it imports anywhere in its body (a package import counts as its __init__)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]):
    """One cycle of `graph` as [a, b, ..., a], or None; deterministic (nodes and edges visited in sorted order)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None
