"""The daemon's Prometheus metrics, in a registry of its own.

Two kinds, as Prometheus' client guidelines ask:
- state that hivemind (or the worker) owns - epochs, swarm progress, throughput, loss, checkpoints, network
  bytes - is read when Prometheus scrapes, by `DaemonCollector`, through the same `build_snapshot` that the
  status socket serves, so /metrics and `swarmd status` never disagree;
- events swarmd records itself - averaging rounds (count, duration, group size) and training step durations -
  feed a Counter, Histograms and a Gauge.

Scrapes run on the HTTP server's thread: everything read here is either immutable or behind the lock of the
object that owns it. No torch or hivemind import.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, StateSetMetricFamily
from prometheus_client.registry import Collector

from swarmd.metrics.netstat import TcpTraffic
from swarmd.swarm.averaging_log import KINDS, OUTCOMES

__all__ = ["SwarmdMetrics", "DaemonCollector"]

logger = logging.getLogger(__name__)

AVERAGING_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STATES = ("starting", "joining", "training", "stopping")


class SwarmdMetrics:
    """A fresh registry with the daemon's collector and the metrics swarmd increments itself."""

    def __init__(self, read_snapshot: Callable[[], dict], network: Optional[TcpTraffic] = None):
        self.registry = CollectorRegistry()
        self.averaging_rounds = Counter(
            "swarmd_averaging_rounds",
            "Averaging rounds this peer took part in, by kind (gradients/state) and outcome "
            "(success; failed: an error or timeout, local values used; skipped: no partners).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.averaging_duration = Histogram(
            "swarmd_averaging_duration_seconds",
            "Wall time of averaging rounds that ran (skipped rounds are not observed).",
            ["kind", "outcome"],
            buckets=AVERAGING_BUCKETS,
            registry=self.registry,
        )
        self.step_duration = Histogram(
            "swarmd_step_duration_seconds",
            "Wall time of one local training step: forward, backward and optimizer.step (averaging waits included).",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.averaging_group_size = Gauge(
            "swarmd_averaging_group_size",
            "Peers in the last averaging round of this kind, this one included (1: the round was skipped or failed).",
            ["kind"],
            registry=self.registry,
        )
        for kind in KINDS:
            for outcome in OUTCOMES:
                self.averaging_rounds.labels(kind, outcome)  # every series exists from the start, at 0
        self.registry.register(DaemonCollector(read_snapshot, network))
        self._watched = None

    def watch(self, averaging_log) -> None:
        """Count the rounds `averaging_log` has recorded and every round it records from now on."""
        if self._watched is averaging_log:
            return
        self._watched = averaging_log
        averaging_log.add_listener(self.observe_round)
        for (kind, outcome), count in averaging_log.counts().items():
            if count:
                self.averaging_rounds.labels(kind, outcome).inc(count)
        for kind in KINDS:
            last = averaging_log.last(kind)
            if last is not None:
                self.averaging_group_size.labels(kind).set(last.group_size)

    def observe_round(self, item) -> None:
        """An AveragingLog listener: called on hivemind's threads, so it must not raise."""
        try:
            self.averaging_rounds.labels(item.kind, item.outcome).inc()
            self.averaging_group_size.labels(item.kind).set(item.group_size)
            if item.outcome != "skipped":
                self.averaging_duration.labels(item.kind, item.outcome).observe(item.duration_seconds)
        except Exception:  # noqa: BLE001 - an observer must not break the optimizer's thread
            logger.debug("could not count an averaging round", exc_info=True)

    def observe_steps(self, stats) -> None:
        """Move the step durations the worker recorded since the last call into the histogram."""
        for seconds in stats.drain_step_seconds():
            self.step_duration.observe(seconds)


class DaemonCollector(Collector):
    """Reads the daemon's snapshot (and p2pd's TCP counters) at scrape time."""

    def __init__(self, read_snapshot: Callable[[], dict], network: Optional[TcpTraffic] = None):
        self._read_snapshot = read_snapshot
        self._network = network

    def collect(self) -> Iterable:
        s = self._read_snapshot()
        yield InfoMetricFamily(
            "swarmd",
            "This peer: swarmd version, run, task, peer id, public name and device.",
            value={
                "version": str(s.get("swarmd_version") or ""),
                "run_id": str(s.get("run_id") or ""),
                "task": str(s.get("task") or ""),
                "peer_id": str(s.get("peer_id") or ""),
                "public_name": str(s.get("public_name") or ""),
                "device": str(s.get("device") or ""),
            },
        )
        yield StateSetMetricFamily(
            "swarmd_state", "The daemon's state.", {state: s.get("state") == state for state in STATES}
        )
        yield _gauge("swarmd_start_time_seconds", "Unix time the daemon started.", s.get("started_at"))
        yield _gauge("swarmd_local_epoch", "This peer's epoch (global steps it has taken part in).", s.get("local_epoch"))
        yield _gauge("swarmd_global_epoch", "The swarm's epoch, as this peer's progress tracker sees it.", s.get("global_epoch"))
        yield _gauge("swarmd_swarm_peers", "Peers reporting progress in this run (this one included).", s.get("num_peers"))
        yield _gauge("swarmd_swarm_clients", "Of swarmd_swarm_peers, those in client mode.", s.get("num_clients"))
        yield _gauge(
            "swarmd_epoch_samples_accumulated",
            "Samples the swarm has accumulated towards the current global epoch.",
            s.get("samples_accumulated"),
        )
        yield _gauge("swarmd_target_batch_size", "Samples the swarm accumulates per global epoch.", s.get("target_batch_size"))
        yield _gauge("swarmd_epoch_eta_seconds", "Estimated seconds until the swarm's next epoch.", s.get("eta_seconds"))
        yield _counter("swarmd_samples", "Samples this peer has trained on since it started.", s.get("samples_total"))
        yield _counter("swarmd_steps", "Local training steps since the daemon started.", s.get("steps_total"))
        yield _gauge(
            "swarmd_samples_per_second",
            "This peer's throughput over its recent steps (wall time, averaging waits included).",
            s.get("samples_per_second"),
        )
        yield _gauge("swarmd_loss", "Mean training loss of the last few local steps.", s.get("loss"))
        checkpoint = s.get("checkpoint") or {}
        yield _gauge(
            "swarmd_checkpoint_last_success_timestamp_seconds",
            "Unix time the last checkpoint was written and verified.",
            checkpoint.get("time"),
        )
        yield _counter("swarmd_checkpoint_failures", "Checkpoints that could not be written.", checkpoint.get("failures_total", 0))
        yield _counter(
            "swarmd_state_loads",
            "Downloads of the model and optimizer state from peers (catching up with the swarm).",
            s.get("state_loads_total"),
        )
        yield _counter("swarmd_step_failures", "Training steps that raised an error.", s.get("failures_total"))
        yield _counter(
            "swarmd_nonfinite_steps", "Training steps whose loss or gradients were not finite (not contributed).",
            s.get("nonfinite_steps_total"),
        )
        yield _counter(
            "swarmd_parameter_restores", "Times the parameters were restored from the in-memory backup.",
            s.get("restores_total"),
        )
        traffic = self._network.read() if self._network is not None else None
        sent, received = traffic if traffic is not None else (None, None)
        yield _counter(
            "swarmd_network_sent_bytes",
            "TCP payload bytes this peer's p2pd sent and had acknowledged (DHT, averaging, state downloads).",
            sent,
        )
        yield _counter("swarmd_network_received_bytes", "TCP payload bytes this peer's p2pd received.", received)


def _gauge(name: str, documentation: str, value) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    if value is not None:
        family.add_metric([], float(value))
    return family


def _counter(name: str, documentation: str, value) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation)
    if value is not None:
        family.add_metric([], float(value))
    return family
