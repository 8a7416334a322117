"""The shape of the code: no import cycles between swarmd's modules (imports inside functions count too), and
the observers reach the daemon only through the snapshot and the extension interface."""

import ast
from pathlib import Path

import swarmd

PACKAGE = Path(swarmd.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
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


def test_the_graph_is_built_from_real_imports():
    graph = import_graph()
    assert "swarmd.daemon.extension" in graph["swarmd.metrics.extension"]
    assert "swarmd.status.snapshot" in graph["swarmd.daemon.lifecycle"]
    assert "swarmd.swarm.strategy" in graph["swarmd.daemon.lifecycle"]  # imported inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_extension_interface_is_a_leaf():
    assert import_graph()["swarmd.daemon.extension"] == set()


FORBIDDEN_MODULES = {"swarmd.swarm.optimizer", "swarmd.worker.stats", "swarmd.swarm.averaging_log", "swarmd.daemon.lifecycle"}
FORBIDDEN_NAMES = {"optimizer", "stats", "averaging_log", "AveragingLog", "WorkerStats", "SwarmOptimizer", "Daemon"}


def names_used(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return found


def test_observers_read_the_snapshot_not_the_optimizer_stats_or_averaging_log():
    graph = import_graph()
    observers = [path for path in (PACKAGE / "metrics").glob("*.py")] + [PACKAGE / "daemon" / "systemd.py"]
    for path in observers:
        name = module_name(path)
        assert not graph[name] & FORBIDDEN_MODULES, f"{name} imports {graph[name] & FORBIDDEN_MODULES}"
        assert not names_used(path) & FORBIDDEN_NAMES, f"{name} names {names_used(path) & FORBIDDEN_NAMES}"
