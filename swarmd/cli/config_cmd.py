"""`swarmd config show|validate`."""

from __future__ import annotations

from typing import Optional

import typer

__all__ = ["app"]

app = typer.Typer(help="Inspect and check configuration files.", no_args_is_help=True, add_completion=False)


@app.command("show")
def show(
    config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML config file."),
    assignments: list[str] = typer.Option(None, "--set", help="Override a key: --set swarm.matchmaking_time=5."),
) -> None:
    """Print the effective configuration (defaults < file < SWARMD_* environment < --set) as YAML."""
    import yaml

    from swarmd.config import load_config

    cfg = load_config(config, assignments=assignments or [])
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")


@app.command("validate")
def validate(path: str = typer.Argument(..., help="The YAML file to check.")) -> None:
    """Check a config file (exit 2 with the dotted path of the first problem)."""
    from swarmd.config import load_config

    cfg = load_config(path, environ={})
    print(f"{path}: ok (task {cfg.task.name}, run_id {cfg.run_id})")
