"""`swarmd status` views drawn with rich. (A basic frame; the full live view is built in render_* below.)"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["render_once", "render_live", "build_view"]


def build_view(snapshot: dict[str, Any]):
    from rich.console import Group
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key in ("run_id", "peer_id", "state", "local_epoch", "global_epoch", "num_peers", "samples_per_second", "loss"):
        table.add_row(key, str(snapshot.get(key)))
    return Group(table)


def render_once(snapshot: dict[str, Any], console=None) -> None:
    from rich.console import Console

    (console or Console()).print(build_view(snapshot))


def render_live(read: Callable[[], dict[str, Any]], interval: float = 1.0) -> None:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(build_view(read()), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(build_view(read()))
        except KeyboardInterrupt:
            pass
