"""`swarmd status`: what the local daemon is doing (JSON, one frame, or a live view), or, with --initial-peers,
what a swarm is doing, seen from a light DHT client without a local daemon."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer

from swarmd.errors import ConfigError

__all__ = ["register"]


def status(
    state_dir: Optional[str] = typer.Option(
        None, "--state-dir", help="The daemon's state dir (default: SWARMD_STATE_DIR or the user's state dir)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the snapshot as JSON and exit."),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit (works without a terminal)."),
    initial_peers: list[str] = typer.Option(
        None,
        "--initial-peers",
        help="Remote mode: watch the swarm through this peer's DHT (repeatable), as a light client that is not "
        "counted as a peer; needs --run-id. No local daemon needed.",
    ),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Remote mode: the run to watch."),
) -> None:
    """Show the local daemon's state: epoch, swarm size, throughput, loss, peers, averaging rounds."""
    if initial_peers:
        _remote(initial_peers, run_id, state_dir=state_dir, as_json=as_json, once=once)
        return
    if run_id is not None:
        raise ConfigError("--run-id is for remote mode: pass --initial-peers too (a local daemon knows its run)")
    from swarmd.status.client import read_status

    directory = state_dir or os.environ.get("SWARMD_STATE_DIR") or _default_state_dir()
    snapshot = read_status(directory)
    _show(snapshot, lambda: read_status(directory), as_json=as_json, once=once)


def _remote(initial_peers: list[str], run_id: Optional[str], *, state_dir, as_json: bool, once: bool) -> None:
    if state_dir is not None:
        raise ConfigError("--state-dir names a local daemon; remote mode (--initial-peers) needs none")
    if not run_id:
        raise ConfigError("remote mode needs --run-id: the run to watch (the `To join:` line of a peer shows it)")
    from swarmd.config.names import is_run_id

    if not is_run_id(run_id):
        raise ConfigError(f"--run-id {run_id!r} is not a run id (letters, digits, '.', '_', '-')")
    from swarmd.status.remote import RemoteSwarm

    with RemoteSwarm(initial_peers, run_id) as swarm:
        _show(swarm.snapshot().to_dict(), lambda: swarm.snapshot().to_dict(), as_json=as_json, once=once)


def _show(snapshot: dict, read, *, as_json: bool, once: bool) -> None:
    if as_json:
        json.dump(snapshot, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
        return
    from swarmd.status.render import render_live, render_once

    if once or not sys.stdout.isatty():
        render_once(snapshot)
    else:
        render_live(read, first=snapshot)


def _default_state_dir() -> str:
    from swarmd.config.paths import default_state_dir

    return default_state_dir()


def register(app: typer.Typer) -> None:
    app.command("status")(status)
