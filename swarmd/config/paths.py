"""Where a daemon keeps its state by default. Standard library only: `swarmd status` imports it."""

from __future__ import annotations

import os

__all__ = ["default_state_dir"]


def default_state_dir() -> str:
    """systemd's StateDirectory= when run as a service, else the XDG state dir of the user."""
    if os.environ.get("STATE_DIRECTORY"):
        return os.environ["STATE_DIRECTORY"].split(":")[0]
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(xdg, "swarmd")
