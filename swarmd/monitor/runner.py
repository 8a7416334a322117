"""The monitor's loop: read the swarm every `interval` seconds, log its totals, serve them, keep its model.

A light client of the DHT (status/remote.py RemoteSwarm: client mode, publishes nothing, not counted as a peer)
reads every peer's signed record and hivemind's progress. Each read becomes `SwarmTotals` (monitor/totals.py),
logged to the config's tracking backends (through the same fan-out a peer uses, off this loop) and served on a
/metrics endpoint of its own: one scrape target for the whole swarm. The same port serves the swarm's web page at
`/` and its data at `/api/status` (monitor/page.py), from the same reads. Every `keep_every` seconds the StateKeeper
downloads the swarm's state and writes it as a checkpoint and an export; it keeps the model once more when the
monitor stops. SIGTERM or SIGINT stops it between reads.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Optional

from swarmd.monitor.page import SwarmPage
from swarmd.monitor.totals import SwarmTotals, swarm_totals

__all__ = ["Monitor", "MonitorMetrics"]

logger = logging.getLogger("swarmd.monitor")


class MonitorMetrics:
    """The swarm's totals as Prometheus gauges, in a registry of their own."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        gauge = lambda name, doc: Gauge(name, doc, registry=self.registry)  # noqa: E731
        self.alive_peers = gauge("swarmd_monitor_peers", "Peers of the run with a live record (the monitor not counted).")
        self.trainers = gauge("swarmd_monitor_trainers", "Of them, peers that train (not auxiliary).")
        self.samples_per_second = gauge("swarmd_monitor_samples_per_second", "The trainers' samples/s, summed.")
        self.global_epoch = gauge("swarmd_monitor_global_epoch", "The swarm's global epoch (hivemind's progress).")
        self.loss = gauge("swarmd_monitor_loss", "Training loss averaged over the samples trained since the last read.")
        self.kept_epoch = gauge("swarmd_monitor_kept_epoch", "Global epoch of the model the monitor kept last (-1: none).")
        self.kept_epoch.set(-1)
        self.rounds = Counter(
            "swarmd_monitor_averaging_rounds",
            "The peers' reports of averaging rounds, by outcome (each peer of a round reports it: one round of 2 "
            "peers counts 2).", ["outcome"],
            registry=self.registry,
        )
        self.reads_failed = Counter("swarmd_monitor_reads_failed", "Reads of the DHT that did not answer in time.",
                                    registry=self.registry)

    def update(self, totals: SwarmTotals) -> None:
        self.alive_peers.set(totals.alive_peers)
        self.trainers.set(totals.trainers)
        self.samples_per_second.set(totals.samples_per_second)
        if totals.global_epoch is not None:
            self.global_epoch.set(totals.global_epoch)
        if totals.loss is not None:
            self.loss.set(totals.loss)
        self.rounds.labels("success").inc(totals.rounds_succeeded)
        self.rounds.labels("failed").inc(totals.rounds_failed)


class Monitor:
    def __init__(self, config, swarm, *, interval: float, keep_every: float, metrics_listen: Optional[str]):
        self.config, self.swarm = config, swarm  # swarm: a started status/remote.py RemoteSwarm
        self.interval, self.keep_every, self.metrics_listen = interval, keep_every, metrics_listen
        self.metrics = MonitorMetrics()
        self.page = SwarmPage(config.run_id)
        self.server = None  # the HTTP server of the page and /metrics
        self.keeper = None
        self._stop = threading.Event()
        self._previous: dict[str, dict] = {}
        self._reads = 0

    def stop(self, *_signal) -> None:
        self._stop.set()

    def _handle_stop_signals(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.stop)

    def run(self) -> int:
        from swarmd.tracking.backends import build_backends
        from swarmd.tracking.base import LoggerFanout

        self._handle_stop_signals()
        self._serve_metrics()
        tracking = LoggerFanout(build_backends(self.config))
        tracking.start()
        if self.keep_every > 0:
            from swarmd.monitor.keeper import StateKeeper

            self.keeper = StateKeeper(self.config, self.swarm.dht)
            self._handle_stop_signals()  # again: its hivemind averager set SIGINT to be ignored
        next_keep = time.monotonic() + min(self.keep_every, 30.0)  # a first model soon, then every keep_every
        try:
            while not self._stop.is_set():
                self._read_once(tracking)
                if self.keeper is not None and time.monotonic() >= next_keep:
                    self._keep()
                    next_keep = time.monotonic() + self.keep_every
                self._stop.wait(self.interval)
            if self.keeper is not None:
                self._keep()  # the newest model on the way out: the peers may be gone after this
        finally:
            tracking.close(timeout=10.0)
            if self.keeper is not None:
                self.keeper.close()
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()
        return 0

    def _read_once(self, tracking) -> None:
        from swarmd.status.remote import SwarmUnreadable

        try:
            snapshot = self.swarm.snapshot()
        except SwarmUnreadable as e:
            self.metrics.reads_failed.inc()
            logger.warning("The swarm could not be read: %s", e)
            return
        peers = [dict(p) for p in snapshot.peers]
        totals = swarm_totals(peers, self._previous, snapshot.global_epoch)
        self.page.update(_as_dict(snapshot), totals, self._previous)
        self._previous = {p["peer_id"]: p for p in peers}
        self._reads += 1
        self.metrics.update(totals)
        tracking.log(totals.scalars(), step=self._reads, axis="local_step")
        logger.info(
            "swarm: epoch %s, %d peer(s) (%d training), %.1f samples/s, loss %s, averaging: %d ok / %d failed peer "
            "reports (from at least %d round(s))",
            totals.global_epoch if totals.global_epoch is not None else "?", totals.alive_peers, totals.trainers,
            totals.samples_per_second, f"{totals.loss:.4g}" if totals.loss is not None else "?",
            totals.rounds_succeeded, totals.rounds_failed, totals.rounds_at_least,
        )

    def _keep(self) -> None:
        try:
            kept = self.keeper.keep()
        except Exception as e:  # noqa: BLE001 - a failed download or a full disk must not stop the monitor
            logger.warning("Could not keep the swarm's model: %s", e)
            return
        if kept is not None:
            self.metrics.kept_epoch.set(kept.epoch)

    def _serve_metrics(self) -> None:
        if not self.metrics_listen:
            return
        from swarmd.monitor.page import serve_page

        self.server = serve_page(self.page, self.metrics.registry, self.metrics_listen)
        host, port = self.server.server_address[:2]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        logger.info("Swarm metrics at http://%s/metrics, the swarm's page at http://%s/", address, address)


def _as_dict(snapshot) -> dict:
    """A Snapshot (status/remote.py) as the page keeps it; a test's stand-in may be any object with attributes."""
    return snapshot.to_dict() if hasattr(snapshot, "to_dict") else dict(vars(snapshot))
