"""The monitor's web page and its JSON API: what `swarmd monitor` serves beside /metrics, on the same port.

`SwarmPage` holds what the page shows, from the reads the monitor already makes (no read of its own): the last
snapshot of the swarm (status/remote.py, remote mode), the swarm's totals of that read (monitor/totals.py), the
curves over time (the swarm's samples/s and each training peer's, the sample-weighted loss), and the averaging
reports it saw (a peer's success or failure counter moved between two reads). The HTTP server's threads
(swarmd/web/server.py) read it under a lock while the monitor's loop writes it; the page and /api/status are the
peer page's app (swarmd/web/app.py) with the monitor's template. Strings the peers published go into the page
as they are: the templates escape them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import asdict
from typing import Any, Mapping, Optional

from swarmd.errors import ConfigError, StartupError
from swarmd.monitor.totals import SwarmTotals

__all__ = ["SwarmPage", "serve_page", "check_listen"]

HISTORY = 2880  # reads kept for the curves: a day at the default --interval of 30 s
ROUNDS = 60  # averaging reports kept for the rounds table
SWARM = "swarm"  # the label of the swarm's own curve


class SwarmPage:
    def __init__(self, run_id: str, *, history: int = HISTORY, rounds: int = ROUNDS):
        self.run_id = run_id
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._latest: dict[str, Any] = {}
        self._totals: dict[str, Any] = {}
        self._read_at: Optional[float] = None
        self._rates: dict[str, deque] = {SWARM: deque(maxlen=history)}  # label -> (time, samples/s)
        self._loss: deque = deque(maxlen=history)
        self._rounds: deque = deque(maxlen=rounds)  # newest first
        self._history = history
        self._reports = Counter()

    def update(self, snapshot: Mapping[str, Any], totals: SwarmTotals, previous: Mapping[str, Mapping[str, Any]],
               *, now: Optional[float] = None) -> None:
        """One read: `snapshot` the swarm (a Snapshot's dict), `previous` peer id -> its record at the read before."""
        now = time.time() if now is None else now
        peers = [dict(p) for p in snapshot.get("peers") or ()]
        with self._lock:
            self._latest, self._totals, self._read_at = dict(snapshot), asdict(totals), now
            self._rates[SWARM].append((now, totals.samples_per_second))
            if totals.loss is not None:
                self._loss.append((now, totals.loss))
            for peer in peers:
                if not peer.get("auxiliary"):
                    label = _label(peer)
                    self._rates.setdefault(label, deque(maxlen=self._history)).append(
                        (now, peer.get("samples_per_second") or 0.0))
            self._reports.update(succeeded=totals.rounds_succeeded, failed=totals.rounds_failed)
            for row in _seen_reports(peers, previous, now):
                self._rounds.appendleft(row)

    def status(self, *, now: Optional[float] = None) -> dict[str, Any]:
        """What /api/status serves and the page renders: the last snapshot (the peers' last_seen_seconds counted
        to `now`), with the run's task and strategy from the records, the totals, the curves and the rounds."""
        now = time.time() if now is None else now
        with self._lock:
            status = dict(self._latest) or {"run_id": self.run_id, "peers": []}
            peers = [dict(p) for p in status.get("peers") or ()]
            status.update(
                mode="monitor",
                read_at=self._read_at,
                uptime_seconds=round(now - self.started_at, 3),
                totals=self._last_totals(),
                reports_succeeded=self._reports["succeeded"],
                reports_failed=self._reports["failed"],
                throughput_over_time={"series": [
                    {"label": label, "points": [list(point) for point in points]}
                    for label, points in self._rates.items()
                ]},
                loss_over_time={"series": [{"label": SWARM, "points": [list(point) for point in self._loss]}]},
                seen_rounds=list(self._rounds),
            )
        for peer in peers:
            if peer.get("time") is not None:
                peer["last_seen_seconds"] = round(max(0.0, now - float(peer["time"])), 3)
        status["peers"] = peers
        status.update(_agreed(peers))
        return status

    def _last_totals(self) -> dict[str, Any]:
        """The last read's totals; its loss, the last one known (a read after no new samples has none)."""
        totals = dict(self._totals)
        if totals and totals.get("loss") is None and self._loss:
            totals["loss"] = self._loss[-1][1]
        return totals


def _label(peer: Mapping[str, Any]) -> str:
    """A curve's name: the peer's public name and the end of its id (names need not be unique)."""
    peer_id = str(peer.get("peer_id") or "")
    return f"{peer.get('public_name') or ''} …{peer_id[-6:]}"


def _seen_reports(peers, previous: Mapping[str, Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """A row per peer and outcome whose counter moved since the previous read (a restarted peer's starts at 0)."""
    rows = []
    for peer in peers:
        before = previous.get(peer.get("peer_id"))
        if before is None:
            continue
        for outcome, key in (("success", "averaging_success"), ("failed", "averaging_failed")):
            now_count, then = int(peer.get(key) or 0), int(before.get(key) or 0)
            count = now_count - then if now_count >= then else now_count
            if count > 0:
                rows.append({"time": now, "peer": str(peer.get("public_name") or ""), "peer_id": peer.get("peer_id"),
                             "epoch": peer.get("local_epoch"), "outcome": outcome, "count": count})
    return rows


def _agreed(peers) -> dict[str, Any]:
    """The task, and the strategy and model size, that most training peers' records name."""
    trainers = [p for p in peers if not p.get("auxiliary")] or list(peers)
    if not trainers:
        return {}

    def most(key):
        values = Counter(p.get(key) for p in trainers if p.get(key) not in (None, ""))
        return values.most_common(1)[0][0] if values else None

    return {"task": most("task"), "compatibility": {
        "strategy": most("strategy"), "inner_steps": most("inner_steps"), "parameters": most("parameters")}}


def check_listen(listen: str) -> tuple[str, int]:
    """`host:port` of the monitor's page and /metrics -> (host, port); a port another program listens on is a
    StartupError (exit 3) now, before the monitor joins the DHT."""
    from swarmd.metrics.extension import split_listen_address
    from swarmd.swarm.ports import port_taken_by

    try:
        host, port = split_listen_address(listen)
    except ValueError:
        raise ConfigError(f"--metrics-addr: {listen!r} is not HOST:PORT") from None
    try:
        holder = port_taken_by(host, port)
    except ValueError:  # a host name, not an address: binding will tell
        holder = None
    if holder is not None:
        raise StartupError(_taken(listen, f"TCP port {port} is already in use ({holder} listens on it)"))
    return host, port


def serve_page(page: SwarmPage, registry, listen: str):
    """Serve the page, /api/status and /metrics (`registry`'s) on `listen`; the server (`.shutdown()` it)."""
    from prometheus_client import make_wsgi_app

    from swarmd.web.app import PeerApp
    from swarmd.web.render import render_monitor_page
    from swarmd.web.server import serve

    host, port = check_listen(listen)
    app = PeerApp(page.status, metrics_app=make_wsgi_app(registry), render=render_monitor_page)
    try:
        server, _thread = serve(app, host, port)
    except OSError as e:
        raise StartupError(_taken(listen, e.strerror or str(e))) from None
    return server


def _taken(listen: str, why: str) -> str:
    return (f"cannot serve the monitor's page and /metrics on {listen}: {why}; pick another with --metrics-addr "
            "HOST:PORT (port 0: any free port)")
