"""Task names -> task classes, resolved lazily.

Built-in tasks are listed here by import path; third-party tasks come from the `swarmd.tasks` entry-point group
of installed packages. Nothing is imported until a task is asked for by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points

from swarmd.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "BUILTIN_TASKS", "TaskEntry", "available_tasks", "resolve_task"]

ENTRY_POINT_GROUP = "swarmd.tasks"
BUILTIN_TASKS = {
    "swin": "swarmd.tasks.swin:SwinTask",
    "albert": "swarmd.tasks.albert:AlbertTask",
}


@dataclass(frozen=True)
class TaskEntry:
    name: str
    target: str  # "module:attribute"
    origin: str  # "built-in" or the distribution that registered it
    conflict: str = ""  # set when two registrations claim the same name with different targets


def available_tasks() -> dict[str, TaskEntry]:
    """Every task name that can be resolved, without importing any task module."""
    tasks = {name: TaskEntry(name, target, "built-in") for name, target in BUILTIN_TASKS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        origin = ep.dist.name if ep.dist is not None else "unknown package"
        known = tasks.get(ep.name)
        if known is None:
            tasks[ep.name] = TaskEntry(ep.name, ep.value, origin)
        elif known.target != ep.value:
            tasks[ep.name] = TaskEntry(
                ep.name, known.target, known.origin, conflict=f"{origin} also registers {ep.name!r} as {ep.value}"
            )
    return dict(sorted(tasks.items()))


def resolve_task(name: str) -> type:
    """Import and return the task class registered under `name`; ConfigError with the choices if there is none."""
    from swarmd.tasks.base import Task

    tasks = available_tasks()
    entry = tasks.get(name)
    if entry is None:
        raise ConfigError(f"task.name: unknown task {name!r}; available: {', '.join(tasks)} (see `swarmd tasks`)")
    if entry.conflict:
        raise ConfigError(f"task.name: {name!r} is registered twice ({entry.conflict}); uninstall one of them")
    module_name, _, attribute = entry.target.partition(":")
    try:
        task_cls = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"task {name!r} ({entry.target}, from {entry.origin}) cannot be loaded: {e}") from None
    if not (isinstance(task_cls, type) and issubclass(task_cls, Task)):
        raise ConfigError(f"task {name!r} ({entry.target}) is not a swarmd.tasks.Task subclass")
    return task_cls


def build_task(config, *, device, seed: int, rank: int = 0, ranks: int = 1):
    """The run's task (`config.task`) to train with on `device`: the one place a training task is made (the
    daemon's rank 0 and every other rank alike)."""
    from swarmd.tasks.base import TaskContext

    training = config.training
    context = TaskContext(
        state_dir=config.state_path, device=device, precision=training.precision, batch_size=training.batch_size,
        seed=seed, rank=rank, ranks=ranks,
    )
    return resolve_task(config.task.name)(config.task.settings, context)


def build_task_for_the_model(config):
    """The run's task to build its model on the host, not to train (`swarmd export`, the monitor's keeper): cpu,
    fp32, batch 1 (a run's batch may exceed the data the machine has), prepared (ALBERT needs its tokenizer, Swin
    its number of classes)."""
    import torch

    from swarmd.tasks.base import TaskContext

    context = TaskContext(state_dir=config.state_path, device=torch.device("cpu"), precision="fp32", batch_size=1, seed=0)
    task = resolve_task(config.task.name)(config.task.settings, context)
    task.prepare()
    return task
