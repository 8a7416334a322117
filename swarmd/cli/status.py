"""`swarmd status`: what the local daemon is doing (JSON, one frame, or a live view)."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer

__all__ = ["register"]


def status(
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="The daemon's state dir (default: SWARMD_STATE_DIR or the user's state dir)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the snapshot as JSON and exit."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit (works without a terminal)."),
) -> None:
    """Show the local daemon's state: epoch, swarm size, throughput, loss, averaging rounds."""
    from swarmd.status.client import read_status

    directory = state_dir or os.environ.get("SWARMD_STATE_DIR") or _default_state_dir()
    snapshot = read_status(directory)
    if as_json:
        json.dump(snapshot, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return
    from swarmd.status.render import render_once, render_live

    if once or not sys.stdout.isatty():
        render_once(snapshot)
    else:
        render_live(lambda: read_status(directory))


def _default_state_dir() -> str:
    from swarmd.config.paths import default_state_dir

    return default_state_dir()


def register(app: typer.Typer) -> None:
    app.command("status")(status)
