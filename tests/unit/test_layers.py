"""The layers of swarmd, as one table, checked against the real imports (imports inside functions count).

A unit is a top-level package or module under swarmd (tests/module_graph.py `unit_of`). Bottom to top:

    swarmd (__version__), errors                     anyone may import these
    extension                                        the seam between the daemon and its extensions: a leaf
    logs, seeds                                      small shared helpers
    config                                           settings and their validation: nothing above it
    tasks                                            model/data plugins over config (StrictModel)
    checkpoints                                      checkpoint files and the state in them (no daemon)
    swarm                                            the hivemind library layer: config, the extension seam
    ranks, worker                                    data-parallel ranks inside a peer; the training loop
    status                                           the snapshot and the views of it (local and remote peers)
    web                                              the page of a metrics port: the snapshot as HTML and JSON
    metrics, tracking                                observers: the snapshot and the extension seam only
    export, install                                  a checkpoint -> a model folder; systemd units
    monitor                                          a swarm observer that keeps and exports the model
    daemon                                           the composition: lifecycle, checkpointer, extensions
    cli, __main__                                    the top

config finds a task's own settings model through a hook the layers above fill in (config/task_resolver.py: the
CLI, a compute rank, tests/conftest.py register tasks.registry.resolve_task); precision and batch moving, which
the worker and the compute ranks share, live in ranks/.

The observers (status, web, metrics, tracking, monitor) never see the daemon, the worker or the optimizers: the
table keeps daemon/ and worker/ out, and OBSERVERS_NEVER the optimizer modules inside swarm/. Each known
violation is an EXCEPTIONS entry with its reason; an entry that no longer matches an import fails the test, so
fixing one means deleting its line.
"""

from collections import defaultdict

from module_graph import find_cycle, import_graph, unit_of  # tests/module_graph.py

ROOT, ERRORS = "swarmd", "swarmd.errors"
BASE = {ROOT, ERRORS}

MAY_IMPORT: dict[str, set[str]] = {
    "swarmd": set(),
    "swarmd.errors": set(),
    "swarmd.extension": set(),
    "swarmd.logs": BASE,
    "swarmd.seeds": BASE,
    "swarmd.config": {ERRORS},
    "swarmd.tasks": BASE | {"swarmd.config"},
    "swarmd.checkpoints": BASE,
    "swarmd.swarm": BASE | {"swarmd.config", "swarmd.extension"},
    "swarmd.ranks": BASE | {"swarmd.config", "swarmd.tasks", "swarmd.logs", "swarmd.seeds", "swarmd.swarm"},
    "swarmd.worker": BASE | {"swarmd.config", "swarmd.tasks", "swarmd.seeds", "swarmd.swarm", "swarmd.ranks"},
    "swarmd.status": BASE | {"swarmd.config", "swarmd.logs", "swarmd.swarm"},
    "swarmd.web": BASE | {"swarmd.config", "swarmd.extension", "swarmd.status", "swarmd.swarm"},
    "swarmd.metrics": BASE | {"swarmd.config", "swarmd.extension", "swarmd.status", "swarmd.swarm", "swarmd.web"},
    "swarmd.tracking": BASE | {"swarmd.config", "swarmd.extension", "swarmd.status"},
    "swarmd.export": BASE | {"swarmd.config", "swarmd.tasks", "swarmd.checkpoints"},
    "swarmd.install": BASE | {"swarmd.config"},
    "swarmd.monitor": BASE | {
        "swarmd.config", "swarmd.logs", "swarmd.tasks", "swarmd.checkpoints", "swarmd.swarm", "swarmd.status",
        "swarmd.metrics", "swarmd.tracking", "swarmd.export", "swarmd.web",
    },
    "swarmd.daemon": BASE | {
        "swarmd.extension", "swarmd.logs", "swarmd.seeds", "swarmd.config", "swarmd.tasks", "swarmd.checkpoints",
        "swarmd.swarm", "swarmd.ranks", "swarmd.worker", "swarmd.status", "swarmd.metrics", "swarmd.tracking",
        "swarmd.web", "swarmd.export",  # checkpoint.export_on_finish (daemon/checkpointer.py)
    },
    "swarmd.cli": BASE | {
        "swarmd.extension", "swarmd.logs", "swarmd.seeds", "swarmd.config", "swarmd.tasks", "swarmd.checkpoints",
        "swarmd.swarm", "swarmd.ranks", "swarmd.worker", "swarmd.status", "swarmd.metrics", "swarmd.tracking",
        "swarmd.export", "swarmd.install", "swarmd.monitor", "swarmd.daemon", "swarmd.web",
    },
    "swarmd.__main__": {"swarmd.cli"},
}
"""unit -> the other units it may import (its own modules it always may)."""

OBSERVED_ONLY_BY_THE_DAEMON = {"swarmd.swarm.upstream.optimizer", "swarmd.swarm.strategies.diloco_optimizer"}
OBSERVERS_NEVER: dict[str, set[str]] = {
    unit: OBSERVED_ONLY_BY_THE_DAEMON
    for unit in ("swarmd.status", "swarmd.web", "swarmd.metrics", "swarmd.tracking", "swarmd.monitor")
}
"""unit -> modules it may not import although the table lets it into their package: observers read the
snapshot (and swarm's records), never the optimizers."""

EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(module, imported module) -> why this edge is allowed for now: known violations of the table."""

CYCLE_ALLOWANCES: dict[tuple[str, str], str] = {}
"""Package-level edges left out of the cycle check, each the package shadow of EXCEPTIONS entries."""


def unit_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(unit, unit) -> the module edges behind it, for edges between different units."""
    edges = defaultdict(set)
    for module, targets in graph.items():
        for target in targets:
            if unit_of(module) != unit_of(target):
                edges[unit_of(module), unit_of(target)].add((module, target))
    return edges


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        allowed = MAY_IMPORT.get(unit, set())
        never = OBSERVERS_NEVER.get(unit, set())
        for target in sorted(targets):
            if (module, target) in EXCEPTIONS:
                continue
            if unit_of(target) != unit and unit_of(target) not in allowed:
                found.append(f"{module} -> {target}  ({unit} may not import {unit_of(target)})")
            elif target in never:
                found.append(f"{module} -> {target}  ({unit} reads the snapshot, not {target})")
    return found


def test_every_unit_has_a_row():
    units = {unit_of(module) for module in import_graph()}
    assert units - set(MAY_IMPORT) == set(), "place these in MAY_IMPORT: " + ", ".join(sorted(units - set(MAY_IMPORT)))
    assert set(MAY_IMPORT) - units == set(), "MAY_IMPORT rows without a module: " + ", ".join(sorted(set(MAY_IMPORT) - units))
    for unit, allowed in MAY_IMPORT.items():
        assert allowed <= set(MAY_IMPORT) and unit not in allowed, unit


def test_the_table_is_a_layering():
    """The table itself has no cycle: a cycle would need EXCEPTIONS, not table rows."""
    assert find_cycle(MAY_IMPORT) is None


def test_no_forbidden_import():
    forbidden = forbidden_edges(import_graph())
    assert not forbidden, f"{len(forbidden)} import(s) against the layers (tests/unit/test_layers.py):\n" + "\n".join(forbidden)


def test_every_exception_is_still_needed():
    graph = import_graph()
    stale = [f"{a} -> {b}" for a, b in EXCEPTIONS if b not in graph.get(a, set())]
    assert not stale, "EXCEPTIONS no longer imported (delete them): " + ", ".join(stale)
    allowed_anyway = [
        f"{a} -> {b}" for a, b in EXCEPTIONS
        if unit_of(b) in MAY_IMPORT.get(unit_of(a), set()) and b not in OBSERVERS_NEVER.get(unit_of(a), set())
    ]
    assert not allowed_anyway, "EXCEPTIONS the table already allows (delete them): " + ", ".join(allowed_anyway)


def test_no_package_level_import_cycle():
    edges = unit_edges(import_graph())
    stale = [f"{a} -> {b}" for a, b in CYCLE_ALLOWANCES if (a, b) not in edges]
    assert not stale, "CYCLE_ALLOWANCES no longer imported (delete them): " + ", ".join(stale)
    packages = defaultdict(set)
    for (source, target) in edges:
        if (source, target) not in CYCLE_ALLOWANCES:
            packages[source].add(target)
    cycle = find_cycle(packages)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle) + "; through " + "; ".join(
        f"{a} -> {b}" for source, target in zip(cycle, cycle[1:]) for a, b in sorted(edges[source, target])
    )


def test_the_checks_catch_what_they_should():
    """The checks fire on made-up graphs: an upward import, an observer reaching an optimizer, a package cycle."""
    graph = {
        "swarmd.swarm.dht": {"swarmd.daemon.lifecycle", "swarmd.errors"},
        "swarmd.metrics.collector": {"swarmd.swarm.upstream.optimizer", "swarmd.swarm.outcomes"},
        "swarmd.config.schema": {"swarmd.tracking.backends"},
    }
    assert forbidden_edges(graph) == [
        "swarmd.config.schema -> swarmd.tracking.backends  (swarmd.config may not import swarmd.tracking)",
        "swarmd.metrics.collector -> swarmd.swarm.upstream.optimizer  (swarmd.metrics reads the snapshot, not swarmd.swarm.upstream.optimizer)",
        "swarmd.swarm.dht -> swarmd.daemon.lifecycle  (swarmd.swarm may not import swarmd.daemon)",
    ]
    edges = unit_edges({"swarmd.swarm.dht": {"swarmd.status.snapshot"}, "swarmd.status.snapshot": {"swarmd.swarm.dht"}})
    assert find_cycle({a: {b} for a, b in edges}) is not None
