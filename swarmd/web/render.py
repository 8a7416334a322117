"""The HTML of the pages, rendered on the server with Jinja2 from a snapshot dict.

Autoescape is on for every template (a peer's name is chosen by a stranger), and no peer string is ever placed
inside a <script>: the page's script reads the same snapshot as JSON from api/status.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from swarmd import __version__
from swarmd.web.views import (
    CHARTS, MONITOR_CHARTS, monitor_items, page_title, peer_rows, round_rows, round_timeline, run_items,
    seen_round_rows,
)

__all__ = ["render_peer_page", "render_monitor_page", "TEMPLATES"]

TEMPLATES = Path(__file__).resolve().parent / "templates"


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,  # a misspelt field fails the tests instead of printing nothing
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_peer_page(snapshot: Mapping[str, Any], *, now: Optional[float] = None) -> str:
    """The daemon's own page: its run, its view of the swarm's peers, its curves and its recent rounds."""
    now = time.time() if now is None else now
    return _environment().get_template("peer.html").render(
        title=page_title(snapshot),
        name=str(snapshot.get("public_name") or snapshot.get("peer_id") or "swarmd"),
        run_id=str(snapshot.get("run_id") or ""),
        peer_id=str(snapshot.get("peer_id") or ""),
        rendered=time.strftime("%H:%M:%S UTC", time.gmtime(now)),
        items=run_items(snapshot),
        charts=CHARTS,
        peers=peer_rows(snapshot),
        rounds=round_rows(snapshot, now=now),
        timeline=round_timeline(snapshot),
        version=__version__,
    )


def render_monitor_page(status: Mapping[str, Any], *, now: Optional[float] = None) -> str:
    """The monitor's page (monitor/page.py `SwarmPage.status()`): the run, every peer, the swarm's curves over time
    and the rounds the peers reported."""
    now = time.time() if now is None else now
    read_at = status.get("read_at")
    read = (f"read {time.strftime('%H:%M:%S UTC', time.gmtime(read_at))}" if read_at is not None
            else "no read of the swarm yet")
    return _environment().get_template("monitor.html").render(
        title=f"{status.get('run_id') or ''} · swarmd monitor",
        run_id=str(status.get("run_id") or ""),
        read=read,
        items=monitor_items(status),
        charts=MONITOR_CHARTS,
        peers=peer_rows(status),
        rounds=seen_round_rows(status, now=now),
        timeline=round_timeline(status),
        version=__version__,
    )
