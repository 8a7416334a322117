"""The shape of the code: no import cycles between swarmd's modules (imports inside functions count too), and
the observers reach the daemon only through the snapshot and the extension interface."""

import ast
from pathlib import Path

from module_graph import PACKAGE, find_cycle, import_graph, module_name  # tests/module_graph.py


def test_the_graph_is_built_from_real_imports():
    graph = import_graph()
    assert "swarmd.extension" in graph["swarmd.metrics.extension"]
    assert "swarmd.status.snapshot" in graph["swarmd.daemon.lifecycle"]
    assert "swarmd.swarm.strategies" in graph["swarmd.daemon.lifecycle"]  # imported inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_extension_interface_is_a_leaf():
    assert import_graph()["swarmd.extension"] == set()


FORBIDDEN_MODULES = {"swarmd.swarm.upstream.optimizer", "swarmd.worker.stats", "swarmd.swarm.averaging_log", "swarmd.daemon.lifecycle"}
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
    observers = [*(PACKAGE / "metrics").glob("*.py"), *(PACKAGE / "web").glob("*.py")]
    observers.append(PACKAGE / "daemon" / "systemd.py")
    for path in observers:
        name = module_name(path)
        assert not graph[name] & FORBIDDEN_MODULES, f"{name} imports {graph[name] & FORBIDDEN_MODULES}"
        assert not names_used(path) & FORBIDDEN_NAMES, f"{name} names {names_used(path) & FORBIDDEN_NAMES}"
