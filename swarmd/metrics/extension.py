"""The /metrics endpoint: an extension serving the daemon's own registry over HTTP, and the peer's web page.

The same port answers `/` with the peer's own page and `/api/status` with its snapshot (swarmd/web/app.py).
The HTTP server (swarmd/web/server.py) runs in a thread of its own, so a scrape or a page never waits on (or
stalls) the event loop: it reads the latest snapshot the loop built. It starts before the heavy start-up, so a
daemon that is still joining already answers (state, info). A port that cannot be bound is a warning, not a failed
start: metrics are an observer and training goes on without.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from swarmd.extension import AveragingRoundFinished, DaemonView, Event, Extension, StepsFinished

__all__ = ["MetricsExtension", "split_listen_address"]

logger = logging.getLogger("swarmd.metrics")


def split_listen_address(listen: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:9464`) -> (host, port); the config schema has already checked the form."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsExtension(Extension):
    def __init__(self, listen: str):
        self.listen = listen
        self.metrics = None
        self.address: Optional[str] = None  # host:port actually bound (the port is chosen by the OS for port 0)
        self.error: Optional[str] = None
        self._server = None
        self._traffic = None  # p2pd's TCP counters (metrics/netstat.py), read at each tick into the snapshot

    async def start(self, view: DaemonView) -> None:
        from prometheus_client import disable_created_metrics, make_wsgi_app

        from swarmd.metrics.collector import SwarmdMetrics
        from swarmd.metrics.netstat import P2pdProcesses, TcpTraffic
        from swarmd.web.app import PeerApp
        from swarmd.web.server import serve

        disable_created_metrics()  # no `_created` series: noise on every dashboard (this process exports only ours)
        host, port = split_listen_address(self.listen)
        self._traffic = TcpTraffic(P2pdProcesses())
        try:
            self.metrics = SwarmdMetrics(view.snapshot)
            app = PeerApp(view.snapshot, metrics_app=make_wsgi_app(self.metrics.registry))
            self._server, _thread = serve(app, host, port)
        except OSError as e:
            self.error = f"cannot listen on {self.listen}: {e.strerror or e}"
            logger.warning(
                "Metrics are off: %s; pick another address with --metrics-addr HOST:PORT (port 0: any free port)",
                self.error,
            )
            return
        except Exception as e:  # noqa: BLE001 - an observer must not stop training
            self.error = repr(e)
            logger.exception("Metrics are off: the endpoint failed to start")
            return
        bound_port = self._server.server_port
        self.address = f"[{host}]:{bound_port}" if ":" in host else f"{host}:{bound_port}"
        logger.info("Prometheus metrics at http://%s/metrics, this peer's page at http://%s/", self.address, self.address)

    def on_event(self, event: Event) -> None:
        if self.metrics is None:
            return
        if isinstance(event, AveragingRoundFinished):
            self.metrics.observe_round(event.round)
        elif isinstance(event, StepsFinished):
            self.metrics.observe_steps(event.seconds)

    def snapshot_fields(self) -> dict[str, Any]:
        from swarmd.status.snapshot import NetworkBytes

        fields: dict[str, Any] = {"metrics_address": self.address}
        traffic = self._traffic.read() if self._traffic is not None else None
        if traffic is not None:
            fields["network"] = NetworkBytes(*traffic)
        return fields

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(_stop_server, server)


def _stop_server(server) -> None:
    server.shutdown()
    server.server_close()
