"""The daemon's Prometheus metrics, in a registry of its own.

Two kinds, as Prometheus' client guidelines ask:
- state - epochs, swarm progress, throughput, loss, averaging rounds by outcome, checkpoints, p2pd's network
  bytes - is read at scrape time from the daemon's latest snapshot (status/snapshot.py), through the tables
  below, so /metrics and `swarmd status` never disagree;
- durations - of averaging rounds and of training steps - are events the daemon delivers on its tick
  (swarmd/extension.py), observed into Histograms.

A scrape runs on the HTTP server's thread and only reads the snapshot the loop last built (an immutable object).
No torch or hivemind import.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, StateSetMetricFamily
from prometheus_client.registry import Collector

from swarmd.status.snapshot import PEER_STATES, REACHABILITY_MODES, REACHABILITY_STATES, Snapshot
from swarmd.swarm.outcomes import KINDS, OUTCOMES, outcome_help

__all__ = ["SwarmdMetrics", "DaemonCollector", "GAUGES", "COUNTERS"]

logger = logging.getLogger(__name__)

AVERAGING_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# (name, help, value in the snapshot); a None value exports no sample rather than a made-up one.
GAUGES: tuple[tuple[str, str, Callable[[Snapshot], Optional[float]]], ...] = (
    ("swarmd_start_time_seconds", "Unix time the daemon started.", lambda s: s.started_at),
    ("swarmd_local_epoch", "This peer's epoch (global steps it has taken part in).", lambda s: s.local_epoch),
    ("swarmd_global_epoch", "The swarm's epoch, as this peer's progress tracker sees it.", lambda s: s.global_epoch),
    ("swarmd_swarm_peers", "Peers reporting progress in this run (this one included).", lambda s: s.num_peers),
    ("swarmd_swarm_clients", "Of swarmd_swarm_peers, those in client mode.", lambda s: s.num_clients),
    ("swarmd_epoch_samples_accumulated", "Samples the swarm has accumulated towards the current global epoch.",
     lambda s: s.samples_accumulated),
    ("swarmd_target_batch_size", "Samples the swarm accumulates per global epoch.", lambda s: s.target_batch_size),
    ("swarmd_epoch_eta_seconds", "Estimated seconds until the swarm's next epoch.", lambda s: s.eta_seconds),
    ("swarmd_samples_per_second", "This peer's throughput over its recent steps (wall time, averaging waits included).",
     lambda s: s.samples_per_second),
    ("swarmd_loss", "Mean training loss of the last few local steps.", lambda s: s.loss),
    ("swarmd_loss_scale", "The fp16 loss scale (fp16 peers only).", lambda s: s.loss_scale),
    ("swarmd_grad_norm", "L2 norm of the gradient the last global step used (the swarm's average, or local).",
     lambda s: s.grad_norm),
    ("swarmd_allowed_peers", "Peers on network.allowed_peers besides this one (absent: an open swarm).",
     lambda s: s.private.allowed_peers if s.private else None),
    ("swarmd_manifest_version", "Version of the run's signed manifest this peer follows (absent: no manifest).",
     lambda s: s.manifest.version if s.manifest else None),
    ("swarmd_manifest_restart_needed", "1 when the run's manifest changed settings that apply only at a restart of "
     "this peer (status manifest.restart_needed names them).",
     lambda s: float(bool(s.manifest.restart_needed)) if s.manifest else None),
    ("swarmd_incompatible_peers", "Peers whose records disagree with this peer's model or must-agree settings "
     "(left out of its peers).", lambda s: len(s.incompatible_peers)),
    ("swarmd_parameter_drift_ratio",
     "L2 distance of this peer's parameters from the swarm's average at the last state averaging, over its norm.",
     lambda s: s.parameter_drift),
    ("swarmd_checkpoint_last_success_timestamp_seconds", "Unix time the last checkpoint was written and verified.",
     lambda s: s.checkpoint.time if s.checkpoint else None),
)
COUNTERS: tuple[tuple[str, str, Callable[[Snapshot], Optional[float]]], ...] = (
    ("swarmd_samples", "Samples this peer has trained on since it started.", lambda s: s.samples_total),
    ("swarmd_steps", "Local training steps since the daemon started.", lambda s: s.steps_total),
    ("swarmd_checkpoint_failures", "Checkpoints that could not be written.",
     lambda s: s.checkpoint.failures_total if s.checkpoint else 0),
    ("swarmd_manifest_ignored", "Entries of the run's manifest record ignored: malformed, forged, or signed by "
     "another key than the run's.", lambda s: s.manifest.ignored_total if s.manifest else 0),
    ("swarmd_state_loads", "Downloads of the model and optimizer state from peers (catching up with the swarm), "
     "or of the parameters alone after a download the swarm outran.",
     lambda s: s.state_loads_total),
    ("swarmd_aggregation_outliers_clipped", "Senders this peer's share of an averaging round clipped as outliers "
     "or found pulling against the result (robust aggregation, swarm.aggregation), one per sender and round: the "
     "evidence against a peer that lies.",
     lambda s: s.outliers_clipped_total),
    ("swarmd_state_forwarded_bytes", "Bytes of the state of peers behind NAT (clients) this peer forwarded to joiners "
     "that could not reach them: what it pays for their joins.", lambda s: s.state_forwarded_bytes_total),
    ("swarmd_step_failures", "Training steps that raised an error.", lambda s: s.failures_total),
    ("swarmd_nonfinite_steps", "Training steps whose loss or gradients were not finite (not contributed).",
     lambda s: s.nonfinite_steps_total),
    ("swarmd_parameter_restores", "Times the parameters were restored from the in-memory backup.",
     lambda s: s.restores_total),
    ("swarmd_network_sent_bytes",
     "TCP payload bytes this peer's p2pd sent and had acknowledged (DHT, averaging, state downloads).",
     lambda s: s.network.sent_bytes if s.network else None),
    ("swarmd_network_received_bytes", "TCP payload bytes this peer's p2pd received.",
     lambda s: s.network.received_bytes if s.network else None),
    ("swarmd_tracking_failures", "Experiment-tracking backends dropped because they raised (tracking/).",
     lambda s: s.tracking.failures_total if s.tracking else None),
    ("swarmd_tracking_dropped_records", "Tracking records dropped because the backends fell behind.",
     lambda s: s.tracking.dropped_total if s.tracking else None),
    ("swarmd_rank_checksum_repairs", "Times this peer's ranks were found to hold different parameters and re-synced.",
     lambda s: s.ranks_repairs_total if s.ranks else None),
)
# per rank of a multi-device peer (training.devices), labelled {rank, device}: (name, help, field of RankReport)
RANK_GAUGES = (
    ("swarmd_rank_samples_per_second", "A rank's forward+backward throughput (its waits for the others excluded).",
     "samples_per_second"),
    ("swarmd_rank_cuda_allocated_bytes", "CUDA memory held by a rank's tensors.", "cuda_allocated_bytes"),
    ("swarmd_rank_cuda_reserved_bytes", "CUDA memory held by a rank's caching allocator.", "cuda_reserved_bytes"),
)


class SwarmdMetrics:
    """A fresh registry with the daemon's collector and the duration histograms the daemon's events feed."""

    def __init__(self, read_snapshot: Callable[[], Snapshot]):
        self.registry = CollectorRegistry()
        self.averaging_duration = Histogram(
            "swarmd_averaging_duration_seconds",
            "Wall time of averaging rounds that ran (skipped rounds are not observed).",
            ["kind", "outcome"],
            buckets=AVERAGING_BUCKETS,
            registry=self.registry,
        )
        self.overlapped_wait = Histogram(
            "swarmd_averaging_overlapped_wait_seconds",
            "Seconds the training still waited for a round it had overlapped with its steps (diloco overlap_steps); "
            "well above 0: raise overlap_steps.",
            ["kind"],
            buckets=AVERAGING_BUCKETS,
            registry=self.registry,
        )
        self.peer_wait = Histogram(
            "swarmd_averaging_peer_wait_seconds",
            "Seconds the training waited before a diloco round for the slowest peers to near the end of their inner "
            "steps; a large share of the round's time: this peer is faster than the others.",
            ["kind"],
            buckets=AVERAGING_BUCKETS,
            registry=self.registry,
        )
        self.step_duration = Histogram(
            "swarmd_step_duration_seconds",
            "Wall time of one local training step: forward, backward and optimizer.step (averaging waits included).",
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(DaemonCollector(read_snapshot))

    def observe_round(self, item) -> None:
        """A round that finished (swarm/averaging_log.py AveragingRound)."""
        if item.outcome != "skipped":
            self.averaging_duration.labels(item.kind, item.outcome).observe(item.duration_seconds)
        if item.waited_seconds is not None:
            self.overlapped_wait.labels(item.kind).observe(item.waited_seconds)
        if item.peer_wait_seconds is not None:
            self.peer_wait.labels(item.kind).observe(item.peer_wait_seconds)

    def observe_steps(self, seconds: Iterable[float]) -> None:
        for value in seconds:
            self.step_duration.observe(value)


class DaemonCollector(Collector):
    """Reads the daemon's latest snapshot at scrape time."""

    def __init__(self, read_snapshot: Callable[[], Snapshot]):
        self._read_snapshot = read_snapshot

    def collect(self) -> Iterable:
        s = self._read_snapshot()
        yield _info(s)
        yield StateSetMetricFamily("swarmd_state", "The daemon's state.", {name: s.state == name for name in PEER_STATES})
        yield StateSetMetricFamily(
            "swarmd_reachable", "Whether a peer in the swarm could dial this one back: yes, no, unknown.",
            {name: s.reachable == name for name in REACHABILITY_STATES},
        )
        yield StateSetMetricFamily(
            "swarmd_reachability", "How other peers reach this one: direct, client (over the connections it opens), "
            "relay, unreachable (not from peers behind NAT), unknown.",
            {name: s.reachability == name for name in REACHABILITY_MODES},
        )
        for name, documentation, value in GAUGES:
            yield _family(GaugeMetricFamily(name, documentation), value(s))
        for name, documentation, value in COUNTERS:
            yield _family(CounterMetricFamily(name, documentation), value(s))
        yield from _averaging(s)
        yield from _ranks(s)
        yield from _readings(s)
        yield from _refusals(s)
        yield from _exclusions(s)


def _info(s: Snapshot) -> InfoMetricFamily:
    labels = {"version": s.swarmd_version, "run_id": s.run_id, "task": s.task, "peer_id": s.peer_id,
              "public_name": s.public_name, "device": s.device}
    return InfoMetricFamily(
        "swarmd", "This peer: swarmd version, run, task, peer id, public name and device.",
        value={key: str(value or "") for key, value in labels.items()},
    )


def _averaging(s: Snapshot) -> Iterable:
    """Rounds by kind and outcome (every series present from the start, at 0), and the last group's size."""
    rounds = CounterMetricFamily(
        "swarmd_averaging_rounds", f"Averaging rounds this peer took part in, by kind and outcome ({outcome_help()}).",
        labels=["kind", "outcome"],
    )
    for kind in KINDS:
        for outcome in OUTCOMES:
            rounds.add_metric([kind, outcome], float(s.averaging.get(kind, {}).get(outcome, 0)))
    yield rounds
    group = GaugeMetricFamily(
        "swarmd_averaging_group_size",
        "Peers in the last averaging round of this kind, this one included (1: the round was skipped or failed).",
        labels=["kind"],
    )
    for kind, last in sorted(s.last_averaging_by_kind.items()):
        group.add_metric([kind], float(last.group_size))
    yield group


def _refusals(s: Snapshot) -> Iterable:
    """A private swarm's refusals of peers outside its list, by where they tried to act (only when private)."""
    if s.private is None:
        return
    family = CounterMetricFamily(
        "swarmd_refused", "Records and requests of peers outside network.allowed_peers that this peer refused, by "
        "where: dht_records, join_group, aggregate_part, download_state.", labels=["where"],
    )
    for where, count in sorted(s.private.refusals.items()):
        family.add_metric([where], float(count))
    yield family


def _exclusions(s: Snapshot) -> Iterable:
    """Peers this one excluded on evidence (swarm/exclusion.py): how many now, how many exclusions by reason, and
    the excluded peers' requests refused by place (every series present from the start)."""
    yield GaugeMetricFamily("swarmd_peers_excluded", "Peers this peer excludes now on evidence (robust aggregation "
                            "clipped them repeatedly, or their progress claims were implausible).",
                            value=float(len(s.excluded_peers)))
    yield GaugeMetricFamily("swarmd_peers_suspected", "Peers with evidence against them in the exclusion window, not "
                            "enough to exclude them: asked last for the state, no partner in a state round of two.",
                            value=float(len(s.suspected_peers)))
    made = CounterMetricFamily("swarmd_exclusions", "Exclusions of peers on evidence since the daemon started, by "
                               "reason: clipped (outliers in robust aggregation), claims (implausible samples).",
                               labels=["reason"])
    for reason, count in sorted(s.exclusions_total.items()):
        made.add_metric([reason], float(count))
    yield made
    refused = CounterMetricFamily("swarmd_excluded_refused", "Requests of excluded peers refused, by where: "
                                  "join_group, aggregate_part, leader (not asked to lead), state_source (not "
                                  "downloaded from).", labels=["where"])
    for where, count in sorted(s.exclusion_refusals.items()):
        refused.add_metric([where], float(count))
    yield refused


def _ranks(s: Snapshot) -> Iterable:
    for name, documentation, key in RANK_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=["rank", "device"])
        for row in s.ranks:  # ranks/rank_stats.py RankReport
            if getattr(row, key) is not None:
                family.add_metric([str(row.rank), str(row.device)], float(getattr(row, key)))
        yield family


def _readings(s: Snapshot) -> Iterable:
    """What the worker reads each epoch: the learning rate per param group, the task's step metrics, and the
    CUDA memory of a one-rank peer (a peer of several ranks reports it per rank, above)."""
    lr = GaugeMetricFamily("swarmd_learning_rate", "Learning rate of each param group, read once per epoch.",
                           labels=["group"])
    for index, value in enumerate(s.learning_rates):
        lr.add_metric([str(index)], float(value))
    yield lr
    task = GaugeMetricFamily("swarmd_task_metric", "The task's own metrics of the last step (e.g. train accuracy).",
                             labels=["name"])
    for name, value in sorted(s.step_metrics.items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            task.add_metric([str(name)], float(value))
    yield task
    memory = GaugeMetricFamily("swarmd_cuda_memory_bytes", "CUDA memory of the worker's device: allocated by "
                               "tensors, reserved by the caching allocator.", labels=["device", "kind"])
    for row in s.cuda_memory:  # worker/stats.py CudaMemory
        memory.add_metric([str(row.device), "allocated"], float(row.allocated_bytes))
        memory.add_metric([str(row.device), "reserved"], float(row.reserved_bytes))
    yield memory


def _family(family, value):
    if value is not None:
        family.add_metric([], float(value))
    return family
