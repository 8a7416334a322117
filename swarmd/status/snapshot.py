"""The status snapshot: one typed record that `swarmd status` (JSON and view), /metrics, the peer records, the
systemd STATUS line and the progress log all read.

The daemon builds it in one place (`Daemon._refresh_snapshot`, on the event loop, every tick and on each change
of state) with `build_snapshot`, from the typed parts its owners report: the swarm's progress (SwarmProgress), the
worker's report with its readings (worker/stats.py WorkerReport, WorkerReadings, CudaMemory), the ranks' report
(ranks/local.py RanksReport, ranks/rank_stats.py RankReport), the averaging summary (swarm/averaging_log.py), the
checkpointer's CheckpointInfo; then each extension's typed fields (the private swarm's PrivateSwarmInfo, the
run manifest's ManifestInfo, the watchdog, the network bytes, the tracking). Every reader gets that same frozen
object (or its `to_dict()`, which is what the status socket serves). API_VERSION changes when a key of `to_dict()`
is renamed or removed, or its value changes shape (adding keys does not change it); tests/unit/test_snapshot_api.py
pins them.
No torch or hivemind import: `swarmd status` and the metrics read this.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from swarmd import __version__
from swarmd.swarm.averaging_log import AveragingRound, AveragingSummary
from swarmd.swarm.reachability_states import REACHABILITY_MODES, REACHABILITY_STATES
from swarmd.swarm.exclusion import PLACES as EXCLUSION_PLACES, REASONS as EXCLUSION_REASONS
from swarmd.swarm.manifest_update import ManifestInfo
from swarmd.swarm.outcomes import KINDS, OUTCOMES
from swarmd.swarm.private import PrivateSwarmInfo

__all__ = [
    "API_VERSION",
    "PEER_STATES",
    "REACHABILITY_STATES",
    "REACHABILITY_MODES",
    "Snapshot",
    "Identity",
    "SwarmProgress",
    "CheckpointInfo",
    "Evaluation",
    "WatchdogInfo",
    "NetworkBytes",
    "TrackingInfo",
    "build_snapshot",
    "read_swarm_progress",
    "progress_line",
]

API_VERSION = 1
_CUDA_ONLY = ("cuda_allocated_bytes", "cuda_reserved_bytes")  # keys of a rank's row (RankReport) a CPU rank lacks
PEER_STATES = ("starting", "joining", "training", "stopping")  # the daemon's states (`phase` is the worker's)


@dataclass(frozen=True)
class Identity:
    """Who this peer is: fixed by the config, completed as the start-up learns its device and peer id."""

    run_id: str
    public_name: str
    task: str
    precision: str
    client_mode: bool
    auxiliary: bool
    target_batch_size: int  # as configured; the swarm's tracker may report another
    started_at: float
    peer_id: Optional[str] = None
    visible_maddrs: tuple = ()
    device: Optional[str] = None
    compatibility: Optional[Mapping[str, Any]] = None  # swarm/compatibility.py fields, once the model is built
    start_values: str = ""  # what this peer's parameters started from (swarm/initial_state.py), once built

    @classmethod
    def from_config(cls, config, started_at: float) -> "Identity":
        return cls(
            run_id=config.run_id,
            public_name=config.daemon.public_name or socket.gethostname(),
            task=config.task.name,
            precision=config.training.precision,
            client_mode=config.network.client_mode,
            auxiliary=config.swarm.auxiliary,
            target_batch_size=config.swarm.target_batch_size,
            started_at=started_at,
        )


@dataclass(frozen=True)
class SwarmProgress:
    """hivemind's view of the run, read from the optimizer and its progress tracker."""

    local_epoch: int
    global_epoch: int
    num_peers: int
    num_clients: int
    samples_accumulated: int
    target_batch_size: int
    eta_seconds: Optional[float]
    state_loads_total: int
    parameter_drift: Optional[float] = None
    outliers_clipped_total: int = 0
    # bytes of other peers' state this peer forwarded to joiners that could not reach them (swarm/upstream/state_forward.py)
    state_forwarded_bytes_total: int = 0


@dataclass(frozen=True)
class CheckpointInfo:
    epoch: Optional[int] = None  # of the last checkpoint written (None: none yet)
    path: str = ""
    time: Optional[float] = None
    failures_total: int = 0


@dataclass(frozen=True)
class Evaluation:
    epoch: int
    metrics: dict


@dataclass(frozen=True)
class NetworkBytes:
    """p2pd's TCP payload bytes (DHT, averaging, state downloads) since the daemon started."""

    sent_bytes: int
    received_bytes: int


@dataclass(frozen=True)
class TrackingInfo:
    """The experiment-tracking backends (tracking/): which log, which were dropped after failing."""

    backends: tuple
    failed: tuple
    failures_total: int
    dropped_total: int  # records dropped because the backends fell behind


@dataclass(frozen=True)
class WatchdogInfo:
    """systemd's watchdog (only when it is on): the worker's current activity against its allowance."""

    timeout_seconds: float
    activity: str
    activity_seconds: float
    allowance_seconds: float
    progressing: bool


@dataclass(frozen=True)
class Snapshot:
    # who
    run_id: str
    public_name: Optional[str] = None
    task: Optional[str] = None
    precision: Optional[str] = None
    client_mode: bool = False
    auxiliary: bool = False
    started_at: float = 0.0
    api_version: int = API_VERSION
    swarmd_version: str = __version__
    peer_id: Optional[str] = None
    device: Optional[str] = None  # rank 0's
    devices: tuple = ()  # one per rank, rank 0's first
    visible_maddrs: tuple = ()
    # what it is doing
    state: str = "starting"  # one of PEER_STATES
    phase: str = "starting"  # the worker's: joining, training, assisting, restarting, stopped, failed
    uptime_seconds: float = 0.0
    # the swarm, as hivemind's tracker sees it (None until the optimizer exists)
    local_epoch: Optional[int] = None
    global_epoch: Optional[int] = None
    num_peers: Optional[int] = None
    num_clients: Optional[int] = None
    samples_accumulated: Optional[int] = None
    target_batch_size: Optional[int] = None
    eta_seconds: Optional[float] = None
    state_loads_total: int = 0
    # senders this peer's share of the all-reduces clipped as outliers, one per sender and round
    # (swarm/upstream/robust_aggregation.py): the evidence against a peer that lies
    outliers_clipped_total: int = 0
    # bytes of clients' state (peers behind NAT) this peer forwarded to joiners (swarm/upstream/state_forward.py)
    state_forwarded_bytes_total: int = 0
    # peers this one excluded on evidence (swarm/exclusion.py ExcludedPeer each: peer_id, reason, since, until,
    # clipped_rounds, rounds_seen, capped_claims, exclusions, returned_rounds, refused_states), exclusions made by
    # reason, refusals of them by place
    excluded_peers: tuple = ()
    # peers with evidence against them, not (yet) excluded (swarm/exclusion.py SuspectedPeer each: peer_id,
    # clipped_rounds, rounds_seen, returned_rounds, capped_claims, refused_states): asked last for the state, no
    # partner in a state round of two
    suspected_peers: tuple = ()
    exclusions_total: dict = field(default_factory=lambda: {reason: 0 for reason in EXCLUSION_REASONS})
    exclusion_refusals: dict = field(default_factory=lambda: {place: 0 for place in EXCLUSION_PLACES})
    # L2 distance of this peer's parameters from the swarm's average at the last state averaging, over the average's
    # norm (None until one): how far failed or rejected gradient rounds let it drift between parameter averagings
    parameter_drift: Optional[float] = None
    # the worker
    samples_per_second: float = 0.0
    samples_total: int = 0
    steps_total: int = 0
    compute_seconds_total: float = 0.0
    optimizer_seconds_total: float = 0.0  # inside hivemind.Optimizer.step: accumulation, averaging waits, updates
    loss: Optional[float] = None
    loss_history: tuple = ()  # ((epoch, mean loss), ...)
    rate_history: tuple = ()  # ((epoch, samples/s), ...)
    step_metrics: dict = field(default_factory=dict)  # the task's extras of the last step (e.g. train accuracy)
    # the worker's readings of each epoch (worker/stats.py WorkerReadings)
    learning_rates: tuple = ()  # per param group
    # the local epoch the worker read learning_rates, loss_scale, grad_norm and cuda_memory at: for a moment after
    # the optimizer's epoch changed they are still the previous epoch's
    readings_epoch: Optional[int] = None
    loss_scale: Optional[float] = None  # fp16 only
    grad_norm: Optional[float] = None  # of the (averaged) gradient of the last global step
    cuda_memory: tuple = ()  # worker/stats.py CudaMemory of each of the worker's CUDA devices
    failures_total: int = 0
    nonfinite_steps_total: int = 0
    restores_total: int = 0
    last_error: str = ""
    evaluation: Optional[Evaluation] = None
    checkpoint: Optional[CheckpointInfo] = None
    # the peer's ranks (training.devices; empty for a one-rank peer): ranks/rank_stats.py RankReport per rank
    ranks: tuple = ()
    ranks_dead: Optional[str] = None  # "rank 1 (cpu) was killed by SIGKILL"
    ranks_repairs_total: int = 0  # replicas found to differ (checksum) and re-broadcast
    # averaging rounds (swarm/outcomes.py names the kinds and outcomes)
    last_averaging: Optional[AveragingRound] = None
    averaging: dict = field(default_factory=dict)  # {kind: {outcome: rounds}}, every kind and outcome present
    last_averaging_by_kind: dict = field(default_factory=dict)  # {kind: AveragingRound}
    recent_averaging: tuple = ()  # the newest rounds, oldest first
    # added by the extensions (swarmd/extension.py `snapshot_fields`)
    metrics_address: Optional[str] = None  # where /metrics is bound (None: off, or the port was taken)
    peers: tuple = ()  # the swarm's peer records (swarm/peer_records.py PeerRecord fields + last_seen_seconds, self)
    peer_records_rejected_total: int = 0
    reachable: str = "unknown"  # one of REACHABILITY_STATES
    reachability: str = "unknown"  # one of REACHABILITY_MODES
    compatibility: Optional[dict] = None  # what peers must agree on (swarm/compatibility.py), once the model is built
    start_values: str = ""  # "<epoch>:<hash>" of the parameters this peer started training from (initial_state.py)
    incompatible_peers: tuple = ()  # ({peer_id, public_name, difference}, ...): records left out of `peers`
    # the peers' published rounds (swarm/round_records.py RoundsRecord fields each): the flight recorder's read
    swarm_rounds: tuple = ()
    # a private swarm (network.allowed_peers): None in an open swarm; its two fields are top-level keys in to_dict()
    private: Optional[PrivateSwarmInfo] = None
    watchdog: Optional[WatchdogInfo] = None
    network: Optional[NetworkBytes] = None  # from the metrics extension (None: metrics off)
    tracking: Optional[TrackingInfo] = None
    # the run's signed manifest (swarm/manifest_publisher.py; remote mode: the newest the swarm serves): None without
    manifest: Optional[ManifestInfo] = None
    # remote mode (status/remote.py): a light DHT client watching a run
    mode: str = "local"
    initial_peers: tuple = ()
    observer_peer_id: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: what the status socket serves (the keys and shapes of API_VERSION)."""
        data: dict[str, Any] = {}
        for name, value in dataclasses.asdict(self).items():
            if name == "private":  # API 1 has a private swarm's figures at the top, null and {} in an open swarm
                data["allowed_peers"] = value["allowed_peers"] if value else None
                data["refusals"] = value["refusals"] if value else {}
            elif name == "ranks":  # API 1's row of a CPU rank has no CUDA keys
                data[name] = tuple({k: v for k, v in row.items() if v is not None or k not in _CUDA_ONLY}
                                   for row in value)
            else:
                data[name] = value
        return data

    def averaging_total(self, outcomes) -> int:
        """Rounds of every kind that ended in one of `outcomes`."""
        return sum(count for by_outcome in self.averaging.values() for name, count in by_outcome.items() if name in outcomes)

    def with_fields(self, fields: Mapping[str, Any]) -> "Snapshot":
        """A copy with extension fields set; an unknown field raises TypeError naming it."""
        return dataclasses.replace(self, **fields)


def read_swarm_progress(optimizer) -> SwarmProgress:
    """SwarmOptimizer (hivemind.Optimizer) -> SwarmProgress; read on the loop thread at each tick."""
    progress = optimizer.tracker.global_progress
    return SwarmProgress(
        local_epoch=optimizer.local_epoch,
        global_epoch=progress.epoch,
        num_peers=progress.num_peers,
        num_clients=progress.num_clients,
        samples_accumulated=progress.samples_accumulated,
        target_batch_size=progress.target_batch_size,
        eta_seconds=_eta(progress.eta_next_epoch, time.time()),
        state_loads_total=optimizer.state_loads_total,
        parameter_drift=getattr(getattr(optimizer, "state_averager", None), "last_parameter_drift", None),
        outliers_clipped_total=getattr(optimizer, "outliers_clipped_total", 0),
        state_forwarded_bytes_total=getattr(optimizer, "state_forwarded_bytes_total", 0),
    )


def build_snapshot(
    identity: Identity,
    state: str,
    *,
    progress: Optional[SwarmProgress] = None,
    worker=None,  # worker/stats.py WorkerReport
    averaging: Optional[AveragingSummary] = None,
    checkpoint: Optional[CheckpointInfo] = None,
    ranks=None,  # ranks/local.py RanksReport (empty for a one-rank peer)
) -> Snapshot:
    """The snapshot from what the daemon's parts report (any may be None while starting).

    Each part fills its own fields; a field two parts claim is a TypeError here, not a silent overwrite."""
    written = checkpoint is not None and (checkpoint.epoch is not None or checkpoint.failures_total)
    return Snapshot(
        **_identity_fields(identity),
        state=state,
        phase=worker.phase if worker is not None else state,
        uptime_seconds=round(time.time() - identity.started_at, 3),
        target_batch_size=progress.target_batch_size if progress is not None else identity.target_batch_size,
        checkpoint=checkpoint if written else None,
        **_ranks_fields(ranks, identity.device),
        **_progress_fields(progress),
        **_worker_fields(worker),
        **_averaging_fields(averaging),
    )


def _identity_fields(identity: Identity) -> dict[str, Any]:
    return dict(
        run_id=identity.run_id,
        public_name=identity.public_name,
        task=identity.task,
        precision=identity.precision,
        client_mode=identity.client_mode,
        auxiliary=identity.auxiliary,
        started_at=identity.started_at,
        peer_id=identity.peer_id,
        device=identity.device,
        visible_maddrs=tuple(identity.visible_maddrs),
        compatibility=dict(identity.compatibility) if identity.compatibility else None,
        start_values=identity.start_values,
    )


def _ranks_fields(ranks, device: Optional[str]) -> dict[str, Any]:
    if ranks is None or not ranks.devices:  # one rank: the identity's device
        return dict(devices=(device,) if device else ())
    return dict(
        devices=tuple(ranks.devices),
        ranks=tuple(ranks.ranks),
        ranks_dead=ranks.dead,
        ranks_repairs_total=ranks.repairs_total,
    )


def _progress_fields(progress: Optional[SwarmProgress]) -> dict[str, Any]:
    if progress is None:
        return {}
    return dict(
        local_epoch=progress.local_epoch,
        global_epoch=progress.global_epoch,
        num_peers=progress.num_peers,
        num_clients=progress.num_clients,
        samples_accumulated=progress.samples_accumulated,
        eta_seconds=progress.eta_seconds,
        state_loads_total=progress.state_loads_total,
        parameter_drift=progress.parameter_drift,
        outliers_clipped_total=progress.outliers_clipped_total,
        state_forwarded_bytes_total=progress.state_forwarded_bytes_total,
    )


def _worker_fields(worker) -> dict[str, Any]:
    if worker is None:
        return {}
    readings = worker.readings
    return dict(
        samples_per_second=round(worker.samples_per_second, 3),
        samples_total=worker.samples_total,
        steps_total=worker.steps_total,
        compute_seconds_total=round(worker.compute_seconds_total, 3),
        optimizer_seconds_total=round(worker.optimizer_seconds_total, 3),
        loss=worker.loss,
        loss_history=tuple((epoch, loss) for epoch, loss in worker.loss_history),
        rate_history=tuple((epoch, round(rate, 3)) for epoch, rate in worker.rate_history),
        step_metrics=dict(worker.step_metrics),
        learning_rates=tuple(readings.learning_rates),
        readings_epoch=readings.epoch,
        loss_scale=readings.loss_scale,
        grad_norm=readings.grad_norm,
        cuda_memory=tuple(readings.cuda_memory),
        failures_total=worker.failures_total,
        nonfinite_steps_total=worker.nonfinite_steps_total,
        restores_total=worker.restores_total,
        last_error=worker.last_error,
        evaluation=Evaluation(*worker.evaluation) if worker.evaluation else None,
    )


def _averaging_fields(summary: Optional[AveragingSummary]) -> dict[str, Any]:
    """Every kind and outcome present (0 until a round), then the summary's rounds."""
    table = {kind: {outcome: 0 for outcome in OUTCOMES} for kind in KINDS}
    if summary is None:
        return dict(averaging=table)
    for (kind, outcome), count in summary.counts.items():
        table.setdefault(kind, {})[outcome] = count
    return dict(
        averaging=table,
        last_averaging=summary.last,
        last_averaging_by_kind=dict(summary.last_by_kind),
        recent_averaging=tuple(summary.recent),
    )


def _eta(eta_next_epoch: float, now: float) -> Optional[float]:
    if eta_next_epoch is None or eta_next_epoch == float("inf") or eta_next_epoch != eta_next_epoch:
        return None
    return round(max(0.0, eta_next_epoch - now), 3)


def progress_line(s: Snapshot, *, with_phase: bool = False) -> str:
    """The one-line summary: the log's progress line, and (with the phase first) systemd's STATUS line.

    "training: epoch 12 (swarm at 13), 2 peers, 245.4 samples/s, loss 1.235, last round: gradients success with 2"
    """
    parts = []
    if s.local_epoch is not None:
        # only a swarm ahead is news: a swarm epoch below this peer's own is a view from before its own step
        behind = s.global_epoch is not None and s.global_epoch > s.local_epoch
        parts.append(f"epoch {s.local_epoch}" + (f" (swarm at {s.global_epoch})" if behind else ""))
    if s.num_peers is not None:
        parts.append(f"{s.num_peers} peer" + ("" if s.num_peers == 1 else "s"))
    parts.append(f"{s.samples_per_second or 0.0:.1f} samples/s")
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4g}")
    if s.last_averaging is not None:
        last = s.last_averaging
        parts.append(f"last round: {last.kind} {last.outcome} with {last.group_size}")
    line = ", ".join(parts)
    return f"{s.phase or s.state}: {line}" if with_phase else line
