"""The `swarmd` command line. Sub-commands live in their own modules; heavy imports stay inside commands."""

from __future__ import annotations

import sys

import typer

from swarmd import __version__
from swarmd.config.task_resolver import use_task_resolver
from swarmd.errors import ExitCode, SwarmdError

__all__ = ["app", "main"]

app = typer.Typer(
    name="swarmd",
    help="A swarm peer daemon for decentralized deep-learning training (hivemind).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"swarmd {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Exit codes: 0 ok, 1 failure while running (or no daemon), 2 usage/config error, 3 could not start."""


def _resolve_task(name: str) -> type:
    """The task registry, imported at the first config a command loads (`swarmd status` loads none)."""
    from swarmd.tasks.registry import resolve_task

    return resolve_task(name)


use_task_resolver(_resolve_task)  # config sits below the tasks: its loader finds them through this hook


def _register() -> None:
    from swarmd.cli import config_cmd, export, join, monitor, prepare, run, service, status, tasks

    join.register(app)
    status.register(app)
    app.add_typer(config_cmd.app, name="config")
    app.add_typer(service.app, name="service")
    tasks.register(app)
    app.add_typer(prepare.app, name="prepare")
    export.register(app)
    monitor.register(app)
    run.register(app)


_register()


def main() -> None:
    """Entry point: user errors become one line on stderr and their exit code, never a traceback."""
    try:
        app(standalone_mode=False)
    except SwarmdError as e:
        print(f"swarmd: error: {e}", file=sys.stderr)
        sys.exit(int(e.exit_code))
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("swarmd: aborted", file=sys.stderr)
        sys.exit(int(ExitCode.FAILURE))
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        # click's usage errors (typer vendors click, so they are matched by shape rather than class)
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(int(ExitCode.USAGE))
        raise
