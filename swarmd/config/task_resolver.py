"""How the config loader finds a task by name: a hook the layers above the tasks fill in.

load_config validates everything under `task` but `name` with the named task's own settings model (its `Config`),
which only the task plug-in knows. The config layer sits below the tasks (they build on config.schema.StrictModel)
and does not import them: each process that loads configs registers the task registry here once, before its first
load_config, with `use_task_resolver(swarmd.tasks.registry.resolve_task)` (the swarmd CLI, a compute rank,
tests/conftest.py, the benchmarks). Light on purpose (no pydantic, no yaml): the CLI registers at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

__all__ = ["TaskResolver", "resolve_task_class", "use_task_resolver"]

TaskResolver = Callable[[str], type]
"""task.name -> the task's class (ConfigError naming the choices when there is none)."""

_resolver: Optional[TaskResolver] = None


def use_task_resolver(resolver: TaskResolver) -> None:
    """From now on, load_config resolves `task.name` with `resolver` (swarmd.tasks.registry.resolve_task)."""
    global _resolver
    _resolver = resolver


def resolve_task_class(name: str) -> type:
    """The class of the task named `name`, through the registered resolver."""
    if _resolver is None:
        raise RuntimeError(
            "load_config cannot resolve task settings: no task resolver registered; call "
            "swarmd.config.task_resolver.use_task_resolver(swarmd.tasks.registry.resolve_task) first"
        )
    return _resolver(name)
