"""`swarmd tasks`: the task plug-ins this installation can run."""

from __future__ import annotations

import typer

__all__ = ["register"]


def tasks() -> None:
    """List the built-in tasks and those installed through the `swarmd.tasks` entry point."""
    from swarmd.tasks.registry import available_tasks, resolve_task
    from swarmd.errors import ConfigError

    for name, entry in available_tasks().items():
        try:
            description = resolve_task(name).description
        except ConfigError as e:
            description = f"(cannot be loaded: {e})"
        print(f"{name:<16} {entry.origin:<16} {description}")


def register(app: typer.Typer) -> None:
    app.command("tasks")(tasks)
