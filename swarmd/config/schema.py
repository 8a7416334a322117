"""The configuration schema: every setting swarmd has, its default, its range and what it means.

The defaults here ARE the embedded default: `swarmd join` with no flags trains the micro Swin task on a small
image folder that swarmd generates, on the CPU, as a one-peer swarm. Task-specific settings live in each task's
own `Config` model (see swarmd/tasks); this file holds what every task shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from swarmd.config.multiaddr import check_multiaddr
from swarmd.config.names import RUN_ID_PATTERN
from swarmd.config.peer_list import read_allowed_peers
from swarmd.config.paths import default_state_dir

__all__ = [
    "DEFAULT_PORT",
    "StrictModel",
    "NetworkConfig",
    "SwarmConfig",
    "DiLoCoConfig",
    "TrainingConfig",
    "CheckpointConfig",
    "DaemonConfig",
    "MetricsConfig",
    "LoggingConfig",
    "TrackingConfig",
    "TaskSection",
    "SwarmdConfig",
    "RUN_WIDE_KEYS",
    "scope_of",
    "run_wide_part",
    "default_state_dir",
]

DEFAULT_PORT = 31337
"""TCP port a peer listens on by default (all interfaces). Open it in your firewall, or use --client-mode."""


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, values are not silently coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


Compression = Literal["none", "fp16", "scaled-fp16", "uint8", "quantile8", "blockwise8"]


class NetworkConfig(StrictModel):
    """How this peer reaches the swarm (the hivemind DHT and its p2pd)."""

    initial_peers: list[str] = Field(
        default_factory=list,
        description="Multiaddrs of running peers to join (each ending in /p2p/<peer id>). Empty: start a new swarm.",
    )
    host_maddrs: list[str] = Field(
        default_factory=lambda: [f"/ip4/0.0.0.0/tcp/{DEFAULT_PORT}"],
        description="Where p2pd listens. Default: all interfaces on TCP 31337. Use tcp/0 for a random free port.",
    )
    announce_maddrs: list[str] = Field(
        default_factory=list,
        description="Public addresses to announce (e.g. behind port forwarding). Port 0 is not allowed here.",
    )
    client_mode: bool = Field(
        False, description="Do not accept inbound connections (behind NAT/firewall); still trains and averages."
    )
    use_relay: bool = Field(True, description="Allow relayed connections through other peers (libp2p circuit relay).")
    use_auto_relay: bool = Field(False, description="Look for relays to become reachable when behind NAT.")
    bootstrap_attempts: int = Field(3, ge=1, le=100, description="Tries to reach the initial peers before giving up.")
    bootstrap_retry_delay: float = Field(2.0, ge=0, description="Seconds between bootstrap tries (doubles each try).")
    allowed_peers: Optional[list[str] | str] = Field(
        None,
        description="A private swarm: the peer ids that may take part (a list, or the path of a file with one per "
        "line and # comments; the file is read again on SIGHUP). Others are refused: their DHT records ignored, "
        "their matchmaking, all-reduce and state-download requests answered with a refusal. None: an open swarm.",
    )

    @field_validator("initial_peers")
    @classmethod
    def _check_initial_peers(cls, value: list[str]) -> list[str]:
        return [check_multiaddr(addr, require_peer_id=True) for addr in value]

    @field_validator("allowed_peers")
    @classmethod
    def _check_allowed_peers(cls, value):
        if value is not None:
            read_allowed_peers(value)  # a bad id or an unreadable file fails here, with the key named
        return value

    @field_validator("host_maddrs")
    @classmethod
    def _check_host_maddrs(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one listen address is needed, e.g. /ip4/0.0.0.0/tcp/31337")
        return [check_multiaddr(addr) for addr in value]

    @field_validator("announce_maddrs")
    @classmethod
    def _check_announce_maddrs(cls, value: list[str]) -> list[str]:
        for addr in value:
            parts = check_multiaddr(addr).split("/")
            if any(proto in ("tcp", "udp") and port == "0" for proto, port in zip(parts, parts[1:])):
                raise ValueError(f"{addr!r}: announced addresses need an explicit port, not 0")
        return value


class DiLoCoConfig(StrictModel):
    """swarm.strategy: diloco (docs/DILOCO.md). Every peer takes `inner_steps` steps of the task's own optimizer on its
    own, then the swarm averages the pseudo-gradients (outer parameters minus local ones) and takes one outer Nesterov
    step: one global epoch. Peers of one run must agree on all of these."""

    inner_steps: int = Field(
        500, ge=1, description="H: local steps of the task's optimizer per outer step (one global epoch)."
    )
    outer_lr: float = Field(0.7, gt=0, description="Learning rate of the outer SGD on the averaged pseudo-gradient.")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Momentum of the outer SGD.")
    nesterov: bool = Field(True, description="Nesterov momentum for the outer SGD (DiLoCo's choice).")
    max_straggler_wait: float = Field(
        30.0,
        ge=0,
        description="Seconds a peer that finished its inner steps waits for slower peers to come within "
        "matchmaking_time of finishing theirs; then the round goes without them (they download the result). "
        "0: never wait. At most 2 x averaging_timeout, the watchdog's allowance for an optimizer step.",
    )
    average_state_every: int = Field(
        0,
        ge=0,
        description="Also average the outer parameters every this many outer steps (twice the traffic of that "
        "step). 0: only at the first outer step, which makes peers that started from different seeds equal.",
    )
    state_check_tolerance: float = Field(
        1e-3,
        ge=0,
        description="Each outer round compares a fingerprint of every member's outer state (float64 L1 and L2 "
        "norms of the outer parameters and momentum); when two differ by more than this (relative), the group "
        "averages its outer state before the step, as after a lone step. Peers of one outer step should hold "
        "the same state, so a difference means one took a state that was not the swarm's; fp16 on the wire makes them "
        "differ by far less than the default. 0: no check.",
    )

    overlap_steps: int = Field(
        0,
        ge=0,
        description="Streaming DiLoCo's overlap (tau; torchft's fragment_sync_delay): send the pseudo-gradient this "
        "many inner steps before the H-th and keep computing while the swarm averages it; the outer step lands at "
        "the H-th. Size it to the outer round's seconds x inner steps per second (status shows both) so that a slow "
        "link costs no compute. 0: no overlap (the round runs after the H-th step, the peer waits for it).",
    )
    overlap_mixing: float = Field(
        0.5,
        ge=0,
        le=1,
        description="With overlap_steps: how much of this peer's own parameters stay in the model after the outer "
        "step (torchft's fragment_update_alpha): model = outer + overlap_mixing x (own - outer). 0 drops the "
        "progress of the overlapped steps, 1 keeps the own parameters and leaves the outer step to the next "
        "pseudo-gradient.",
    )

    @model_validator(mode="after")
    def _check_settings(self) -> "DiLoCoConfig":
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError("nesterov needs outer_momentum above 0 (or nesterov: false)")
        if self.overlap_steps >= self.inner_steps:
            raise ValueError(
                f"overlap_steps {self.overlap_steps} must be below inner_steps {self.inner_steps}: the pseudo-gradient "
                "is sent that many steps before the round's end; lower overlap_steps or raise inner_steps"
            )
        return self


class AggregationConfig(StrictModel):
    """How this peer reduces its share of every all-reduce (gradients, parameters, DiLoCo's pseudo-gradients):
    swarm/upstream/robust_aggregation.py, docs/FAULTS.md. Peers need not agree: each reduces its own share its own way."""

    method: Literal["mean", "centered_clip"] = Field(
        "centered_clip",
        description="centered_clip: each sender's part is clipped to tau x the median sender's distance from the "
        "coordinate-wise median before it is averaged (CenteredClip), so one sender cannot move the result by more "
        "than its weight's share of that radius per iteration; with agreeing senders it is the mean. mean: "
        "hivemind's plain weighted mean.",
    )
    tau: float = Field(
        1.0,
        gt=0,
        le=100,
        description="The clip radius, relative: tau x the (lower) median of the senders' distances from their "
        "coordinate-wise median. Larger lets honest outliers count fully and an attacker further.",
    )
    iterations: int = Field(3, ge=1, le=50, description="CenteredClip iterations, starting from the median.")
    max_weight_ratio: float = Field(
        2.0, ge=0, le=1000, description="A sender's weight (the samples it claims) counts at most this many times "
        "the senders' lower median weight: one sender claiming 100x the samples cannot set the average. Raise it "
        "in a swarm of very different machines (a GPU peer beside CPU peers); 0: weights as claimed.",
    )
    judge_direction: bool = Field(
        True, description="Count a sender whose update (gradients, DiLoCo's pseudo-gradients) points away from the "
        "round's result over this peer's share (cosine below 0, by direction_sigmas) as an outlier in that round, as "
        "if clipped: a sign flip at honest scale stays within the clip radius. The result is the same either way. "
        "Off where honest peers' data differ so much that their updates disagree.",
    )
    direction_sigmas: float = Field(
        3.0, ge=0, le=100, description="With judge_direction: a sender counts as pointing away only where its cosine "
        "with the result is below -direction_sigmas / sqrt(the values judged), beyond what chance explains (two "
        "unrelated directions in d values are at a cosine of about 1/sqrt(d)): at the loss's noise floor an honest "
        "update's cosine over a small share is that chance. 0: any cosine below 0.",
    )
    far_ratio: float = Field(
        100.0, ge=0, le=1e6, description="A sender further from the senders' coordinate-wise median than this many "
        "times the median sender's distance is left out of that part's aggregate instead of clipped (a clipped "
        "sender still pulls the result by its weight's share of the radius per iteration: two senders of six "
        "sending gradients x -1e6 turned it halfway to theirs). Honest senders were at most 26x. 0: clipped like the "
        "others; otherwise at least 2.",
    )

    @field_validator("far_ratio")
    @classmethod
    def _far_ratio_off_or_beyond_the_outlier_bound(cls, value: float) -> float:
        if 0 < value < 2:  # robust_aggregation.OUTLIER_RADII: nearer than that a sender is no outlier at all
            raise ValueError("must be 0 (far senders clipped, not left out) or at least 2")
        return value


class ExclusionConfig(StrictModel):
    """Exclusion on evidence (swarm/exclusion.py, docs/FAULTS.md): peers that robust aggregation keeps clipping, or
    whose progress claims keep being capped, are refused by this peer for a growing time. Each peer decides alone."""

    enabled: bool = Field(
        True, description="Exclude peers on evidence. Off: the evidence is still counted (and claims capped), "
        "nobody is excluded.",
    )
    rounds: int = Field(
        3, ge=1, le=1000, description="Evidence needed: clipped as an outlier in at least this many rounds (or its "
        "returned averages refused in this many rounds, or claims capped in this many global epochs) within `window`.",
    )
    share: float = Field(
        0.5, ge=0, lt=1, description="...and clipped in more than this share of the rounds it sent to this peer's "
        "share within `window` (an honest peer clipped now and then is never excluded).",
    )
    window: float = Field(600.0, gt=0, description="Seconds of evidence that count.")
    base_seconds: float = Field(
        60.0, gt=0, description="The first exclusion of a peer, in seconds; each next one doubles."
    )
    max_seconds: float = Field(3600.0, gt=0, description="The longest exclusion, in seconds.")
    max_peers: int = Field(
        1024, ge=1, le=1_000_000, description="Peers the evidence table holds (peer ids come from strangers); when "
        "full, the one seen longest ago that is not excluded is forgotten.",
    )
    claim_rate_ratio: float = Field(
        8.0, ge=0, description="A peer's claimed samples/s is capped at this many times the swarm's median rate (and "
        "its samples at what that rate allows since the epoch began), and a round's sender claiming a weight (samples) "
        "above 2x this ratio x the round's median counts as an outlier there; 0: claims are not checked. Raise it in "
        "a swarm of very different machines.",
    )

    @model_validator(mode="after")
    def _check_times(self) -> "ExclusionConfig":
        if self.max_seconds < self.base_seconds:
            raise ValueError(f"max_seconds {self.max_seconds:g} must be at least base_seconds {self.base_seconds:g}")
        return self


class SwarmConfig(StrictModel):
    """hivemind.Optimizer: how peers accumulate, average and stay in sync. Peers of one run should agree on these."""

    target_batch_size: int = Field(
        1024, ge=1, description="Samples the whole swarm accumulates per global epoch (one optimizer step)."
    )
    matchmaking_time: float = Field(
        5.0, gt=0, description="Seconds to look for averaging partners. 3-5 on a LAN, 10-15 over the internet."
    )
    averaging_timeout: float = Field(
        30.0, gt=0, description="Give up an averaging round after this many seconds and use local gradients."
    )
    allreduce_timeout: Optional[float] = Field(None, gt=0, description="Per all-reduce attempt; default: averaging_timeout.")
    next_chunk_timeout: Optional[float] = Field(
        None,
        gt=0,
        description="Seconds an all-reduce waits for a peer's next part before it goes on without that peer's share "
        "(hivemind's sender timeout; a reducer's results get twice as long), and a state download for its next "
        "chunk. Default: matchmaking_time, as hivemind. Raise it over slow links, where a part can queue behind "
        "seconds of other traffic: at 20 Mbit/s a 2-s timeout cut DiLoCo rounds short (docs/PERFORMANCE.md "
        "section 9); 10 s held.",
    )
    load_state_timeout: float = Field(
        120.0, gt=0, description="Seconds per attempt to download the model and optimizer state from a peer."
    )
    load_state_attempts: int = Field(
        3, ge=1, description="Attempts to download state from peers before training on from the local state."
    )
    refresh_parameters: bool = Field(
        True,
        description="A sync peer whose state download ended with the swarm two or more epochs further on downloads "
        "the swarm's parameters alone (a third of the bytes; its optimizer statistics stay those of the download, a "
        "few epochs old) up to 3 times before the whole state again. false: the whole state every time (hivemind's "
        "way). Plain hivemind peers serve only the whole state. docs/PERFORMANCE.md section 5.",
    )
    refresh_one_behind: bool = Field(
        False,
        description="Whether a sync peer whose state download ended exactly one epoch behind the swarm takes the "
        "parameters again too. false: it takes the swarm's epoch with its parameters a step stale (hivemind's rule, "
        "one epoch behind is close enough), weighing next to nothing in state rounds until one evens it out, and "
        "joins the swarm's current round instead of chasing the next (docs/PERFORMANCE.md section 5).",
    )
    state_round_search: float = Field(
        2.0,
        ge=0,
        description="Under gradient averaging, how long a state round looks for its group past its start, in "
        "matchmaking times; a peer that found none by then came after the swarm's round and trains on (its next "
        "step waits on the round). 0: as long as averaging_timeout, hivemind's way. docs/PERFORMANCE.md section 5.",
    )
    round_epoch_check: bool = Field(
        True,
        description="Every gradient round sends the epoch its peer averages; a sync peer whose group averaged a later "
        "epoch (it was one behind: hivemind matches rounds without their epochs) takes the swarm's parameters again "
        "at its next step, instead of training one epoch behind until hivemind's once-an-epoch check sends it to "
        "download the whole state. false: hivemind's way. docs/PERFORMANCE.md section 5.",
    )
    step_on_partial_average: bool = Field(
        True,
        description="A sync gradient round that brought back only part of the average (a reducer failed, was late, "
        "or returned an implausible part): this peer steps on the average where it came and on its own gradient "
        "where it did not, and the group averages its parameters at the epoch's end. false: its own gradient "
        "everywhere, which holds it further from its group until then. docs/FAULTS.md.",
    )
    catch_up_by_averaging: Optional[bool] = Field(
        None,
        description="A peer whose state download ended with the swarm further on (epochs shorter than a download) "
        "takes the swarm's epoch with its older state and gets the swarm's parameters in the next state averaging, "
        "weighing 1e-6 in every average until then, instead of downloading again (hivemind's way, which chases a "
        "swarm whose epochs stay shorter than a download; swarmd first downloads the parameters alone, a third of "
        "the bytes). Default: on for strategy diloco, whose state takes "
        "minutes over slow links; off for sync, where waiting for the next state averaging (every "
        "average_state_every epochs) took longer than a second download on loopback (docs/PERFORMANCE.md "
        "section 5). Turn it on for a sync peer whose link downloads the state in many epochs.",
    )
    use_local_updates: bool = Field(
        False, description="Step the optimizer on local gradients every step and average parameters instead."
    )
    average_state_every: int = Field(
        10,
        ge=1,
        description="Average parameters every this many global epochs. With gradient averaging the parameters only "
        "drift when a round fails, so 10 repairs that at 40% fewer bytes than every epoch (4.45 -> 2.65 MB/epoch, "
        "same loss; benchmarks/wire_bytes.py). With use_local_updates it is the local-SGD period: set it.",
    )
    delay_state_averaging: bool = Field(True, description="Average parameters in the background.")
    delay_grad_averaging: bool = Field(
        False, description="Average gradients in the background (with delay_optimizer_step: DPU, one step stale)."
    )
    delay_optimizer_step: Optional[bool] = Field(
        None, description="Run the optimizer step in the background. Default: same as delay_grad_averaging."
    )
    offload_optimizer: Optional[bool] = Field(
        None, description="Keep the optimizer on the host. Default: on unless use_local_updates (hivemind's rule)."
    )
    reuse_grad_buffers: bool = Field(False, description="Accumulate into .grad buffers to save memory.")
    grad_compression: Compression = Field(
        "fp16",
        description="Wire format for gradients. fp16 sends 0.56x the bytes of none at the same loss "
        "(benchmarks/wire_bytes.py); none for bit-exact averaging.",
    )
    state_averaging_compression: Compression = Field("none", description="Wire format for parameter averaging.")
    load_state_compression: Compression = Field("none", description="Wire format for state downloads.")
    state_stream: bool = Field(
        True,
        description="Download the swarm's state as raw tensor bytes on one libp2p stream (swarm/upstream/state_stream.py; "
        "3.6x faster than hivemind's protobuf parts on loopback), from the peers that serve it; false: hivemind's RPC "
        "from every peer. Either way this peer serves both. docs/PERFORMANCE.md section 5.",
    )
    average_opt_statistics: list[str] = Field(
        default_factory=list, description="Optimizer statistics to average too, e.g. [exp_avg_sq]."
    )
    auxiliary: bool = Field(
        False, description="A helper that only takes part in averaging (no training); needs inbound connections."
    )
    prescheduled_averaging: bool = Field(
        True,
        description="Start matchmaking before the epoch ends so the round is ready in time (sync: the gradient "
        "round; diloco: the outer round, during the last inner steps). swarmd skips it while the peer is alone "
        "(hivemind would matchmake forever and burn a CPU core).",
    )
    guard_gradient_norm_ratio: float = Field(
        10.0,
        ge=0,
        description="Reject an averaged gradient that is NaN/Inf or whose norm exceeds this many times this peer's "
        "own gradient (a garbage contribution: hivemind averages whatever it receives), and step on the local "
        "gradient instead. 0: off.",
    )
    guard_parameter_change: float = Field(
        1.0,
        ge=0,
        description="Restore the last good parameters when one global epoch moved them by more than this fraction "
        "of their norm (poisoned parameter averaging); state downloaded from peers is exempt. 0: off.",
    )
    guard_download_loss_ratio: float = Field(
        100.0,
        ge=0,
        description="Refuse a downloaded state whose loss on this peer's next batch is more than this many times "
        "the largest loss of this peer's own last 16 steps (a donor that stepped its state uphill, or sends "
        "garbage): this peer's last good parameters come back, its optimizer statistics start afresh, and the "
        "donors count as evidence (swarm.exclusion). A joiner with no steps of its own judges nothing. 0: off.",
    )
    clip_local_grad_norm: Optional[float] = Field(
        None,
        gt=0,
        description="Clip each local step's gradient to this global norm before it joins the swarm's average, as "
        "hivemind's ALBERT example does (HF Trainer's max_grad_norm); task.optim.max_grad_norm clips the averaged "
        "gradient instead. Under strategy diloco, each inner step's gradient is clipped. Needs "
        "reuse_grad_buffers: false. null: off.",
    )
    averager_opts: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for hivemind's averagers (advanced), plus swarmd's "
        "matchmaking_poll_interval (seconds between matchmaking reads of the DHT; default matchmaking_time / 10), "
        "declare_interval (seconds that changes to the state declaration coalesce; default 1) and "
        "assemble_when_triggered (a leader starts its gradient round once it is due and someone follows; default "
        "true for the gradient averager only); "
        "0 / false: hivemind's behaviour (swarm/upstream/averager_pace.py).",
    )
    tracker_opts: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for hivemind's ProgressTracker (advanced), plus report_interval: "
        "the least seconds between progress publications to the DHT (default 0.5; further from the epoch's end they "
        "go out every quarter of the time left, at most every max_refresh_period; 0: after every step, as upstream).",
    )
    strategy: Literal["sync", "diloco"] = Field(
        "sync",
        description="sync: hivemind.Optimizer, one averaging round per global epoch of target_batch_size samples "
        "(the settings above). diloco: swarm.diloco's inner steps between rounds of pseudo-gradient averaging, for "
        "slow links (docs/DILOCO.md). Every peer of a run must use the same strategy.",
    )
    diloco: DiLoCoConfig = Field(default_factory=DiLoCoConfig, description="Settings of strategy: diloco.")
    aggregation: AggregationConfig = Field(
        default_factory=AggregationConfig,
        description="How this peer reduces its share of each averaging round: robustly against senders that lie.",
    )
    exclusion: ExclusionConfig = Field(
        default_factory=ExclusionConfig,
        description="Which peers this peer refuses on evidence (robust aggregation's outliers, implausible claims).",
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> "SwarmConfig":
        delay_opt = self.delay_grad_averaging if self.delay_optimizer_step is None else self.delay_optimizer_step
        offload = (not self.use_local_updates) if self.offload_optimizer is None else self.offload_optimizer
        if self.delay_grad_averaging and not delay_opt:
            raise ValueError("delay_grad_averaging needs delay_optimizer_step: true")
        if delay_opt and not offload:
            raise ValueError("delay_optimizer_step needs offload_optimizer: true")
        if self.use_local_updates and (self.reuse_grad_buffers or self.delay_grad_averaging):
            raise ValueError("use_local_updates cannot be combined with reuse_grad_buffers or delay_grad_averaging")
        return self

    @model_validator(mode="after")
    def _check_local_clipping(self) -> "SwarmConfig":
        if self.clip_local_grad_norm is not None and self.reuse_grad_buffers:
            raise ValueError("clip_local_grad_norm needs reuse_grad_buffers: false (.grad would hold the epoch's sum)")
        return self

    @model_validator(mode="after")
    def _check_strategy(self) -> "SwarmConfig":
        if self.strategy != "diloco":
            return self
        # DiLoCo steps the task's optimizer on every local step and averages once per H steps: the sync strategy's
        # ways of accumulating, delaying and offloading have nothing to act on, so setting them is a mistake.
        contradictions = [
            ("use_local_updates", self.use_local_updates, "diloco always steps locally"),
            ("reuse_grad_buffers", self.reuse_grad_buffers, "inner steps consume .grad at every step"),
            ("delay_grad_averaging", self.delay_grad_averaging, "diloco averages pseudo-gradients, not gradients"),
            ("delay_optimizer_step", bool(self.delay_optimizer_step), "the outer step runs in the foreground"),
            ("offload_optimizer", self.offload_optimizer is not None, "diloco keeps the outer optimizer on the host "
             "and the task's optimizer with the model"),
            ("auxiliary", self.auxiliary, "auxiliary peers are not supported with diloco"),
            ("average_opt_statistics", bool(self.average_opt_statistics), "diloco averages the outer momentum "
             "with the parameters, and the inner optimizer's statistics stay each peer's own"),
        ]
        for name, is_set, why in contradictions:
            if is_set:
                raise ValueError(f"{name} does not apply to strategy: diloco ({why}); remove it or use strategy: sync")
        if self.diloco.max_straggler_wait > 2 * self.averaging_timeout:
            raise ValueError(
                f"diloco.max_straggler_wait {self.diloco.max_straggler_wait:g} exceeds 2 x averaging_timeout "
                f"({2 * self.averaging_timeout:g} s), the watchdog's allowance for an optimizer step; lower it or "
                "raise averaging_timeout"
            )
        return self


class TrainingConfig(StrictModel):
    """What this peer computes locally. These may differ from peer to peer."""

    device: str = Field("auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:N.")
    devices: Optional[Literal["auto"] | list[str]] = Field(
        None,
        description="Data-parallel ranks inside this one peer, one per entry: auto (every visible CUDA GPU, else "
        "the CPU) or a list such as [cuda:0, cuda:1] ([cpu, cpu]: CPU ranks over gloo). Rank 0 hosts hivemind; "
        "batch_size is per rank, so the peer contributes ranks x batch_size per step. Unset: one rank on "
        "training.device. If both are set, training.device must be auto or the first entry (rank 0's device).",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Autocast precision of forward/backward.")
    batch_size: int = Field(32, ge=1, description="Samples per local step (per peer).")
    seed: Optional[int] = Field(
        None,
        description="Seed for initialisation and data order. Unset: the initialisation seed derives from run_id "
        "(every peer of a run builds the same model) and the data order from the peer id (each peer its own), as do "
        "the random draws after the model is built (dropout, drop path, augmentations).",
    )
    max_epochs: int = Field(0, ge=0, description="Stop (exit 0) once the local epoch reaches this. 0: run forever.")
    finish_wait_seconds: float = Field(
        60.0,
        ge=0,
        description="At training.max_epochs, keep serving this peer's state up to this long while other peers of the "
        "swarm are still at an earlier epoch, so that a peer an epoch behind takes the last model from it rather than "
        "stopping with its own; the wait ends as soon as none is behind. 0: stop at once.",
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads on the CPU; 0 leaves torch's default.")
    max_consecutive_failures: int = Field(
        5, ge=1, description="A training step that raises is retried with backoff; this many in a row end the daemon."
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
            return value
        raise ValueError(f"{value!r} is not a device: use auto, cpu, cuda or cuda:N")

    @field_validator("devices", mode="before")
    @classmethod
    def _split_devices(cls, value: Any) -> Any:
        # `--devices cuda:0,cuda:1`, SWARMD_TRAINING__DEVICES and --set arrive as one comma-separated string
        if isinstance(value, str) and value != "auto":
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("devices")
    @classmethod
    def _check_devices(cls, value: Optional[str | list[str]]) -> Optional[str | list[str]]:
        if value is None or value == "auto":
            return value
        from swarmd.config.devices import check_device_list  # local: one place knows what a rank's device is

        return check_device_list(value)

    @model_validator(mode="after")
    def _check_device_and_devices(self) -> "TrainingConfig":
        from swarmd.config.devices import conflict_between

        conflict = conflict_between(self.device, self.devices)
        if conflict:
            raise ValueError(conflict)
        return self


class CheckpointConfig(StrictModel):
    """Checkpoints of model, optimizer and epoch (safetensors + JSON), written atomically; each records the run's
    config (run_id, task, swarm, training), so `swarmd export --state-dir DIR` needs nothing else."""

    enabled: bool = Field(True, description="Save checkpoints, and resume from the newest at start.")
    every_epochs: int = Field(10, ge=1, description="Save every this many global epochs (and always at shutdown).")
    keep: int = Field(3, ge=1, description="Keep this many newest checkpoints.")
    dir: str = Field(
        "checkpoints",
        description="Where the checkpoints go: relative to state_dir (the default, <state_dir>/checkpoints) or an "
        "absolute path, e.g. on a larger disk. One per peer, as the state dir. `swarmd export` then needs "
        "--set checkpoint.dir=... too.",
    )
    export_on_finish: bool = Field(
        False,
        description="When the run reaches training.max_epochs, also write the last checkpoint as `swarmd export` "
        "would, into export-epoch-<N> beside it in checkpoint.dir (kept when old checkpoints are pruned).",
    )


class DaemonConfig(StrictModel):
    """The process itself."""

    shutdown_timeout: float = Field(
        60.0, gt=0, description="Bound on a graceful stop (SIGTERM); past it, children are killed and the exit is 1."
    )
    tick_interval: float = Field(1.0, gt=0, description="Seconds between status refreshes (and watchdog pings).")
    public_name: Optional[str] = Field(None, description="A name shown to other peers; default: the host name.")
    background_priority: Literal["normal", "nice", "idle"] = Field(
        "normal",
        description="CPU priority of hivemind's processes (DHT, p2pd, averagers) against the training: normal, "
        "nice (nice 10: faster training on a dedicated CPU peer, slower DHT answers on an oversubscribed one) or "
        "idle (SCHED_IDLE: only where cores sit idle, e.g. a GPU peer; on a busy CPU peer it starves the DHT). "
        "docs/PERFORMANCE.md section 10.",
    )


class MetricsConfig(StrictModel):
    """The Prometheus endpoint."""

    enabled: bool = True
    listen: str = Field(
        "127.0.0.1:9464",
        description="host:port of /metrics. Binding beyond localhost exposes run and peer ids to that network.",
    )

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{value!r} is not host:port, e.g. 127.0.0.1:9464")
        return value


class LoggingConfig(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "plain", "json", "rich"] = Field(
        "auto", description="auto: rich on a terminal, plain single-line records otherwise (journald)."
    )
    hivemind_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="Level for hivemind's own loggers (info shows every averaging round)."
    )
    progress_interval: float = Field(
        15.0, ge=0, description="Seconds between progress lines (epoch, peers, samples/s, loss) in the log; 0: none."
    )


class TensorBoardTrackingConfig(StrictModel):
    log_dir: Optional[str] = Field(
        None,
        description="Where the event files go, one sub-directory per daemon start. Default: <state_dir>/tracking/tensorboard.",
    )


class WandbTrackingConfig(StrictModel):
    """Weights & Biases. Unset keys fall back to wandb's own WANDB_* variables, then to swarmd's default."""

    project: Optional[str] = Field(None, description="Default: $WANDB_PROJECT, else the run_id.")
    entity: Optional[str] = Field(None, description="Team or user. Default: $WANDB_ENTITY, else your default entity.")
    name: Optional[str] = Field(None, description="This peer's run name. Default: $WANDB_NAME, else daemon.public_name.")
    mode: Optional[Literal["online", "offline", "disabled"]] = Field(
        None, description="offline needs no account (upload later with `wandb sync`). Default: $WANDB_MODE, else online."
    )
    dir: Optional[str] = Field(None, description="Where wandb keeps its files. Default: $WANDB_DIR, else <state_dir>/tracking.")


class TrackingConfig(StrictModel):
    """Experiment tracking: this peer's curves (loss, learning rate, throughput, averaging, evaluation) in
    TensorBoard and/or Weights & Biases (docs/TRACKING.md). Written by a thread of its own; a backend that fails
    is dropped with a warning and training goes on."""

    backends: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description="Backends to log to, e.g. [tensorboard, wandb]. Each needs its extra: pip install 'swarmd[wandb]'.",
    )
    log_every_steps: int = Field(
        20,
        ge=0,
        description="Also log the recent loss every this many local steps (at most once per daemon.tick_interval); "
        "0: per epoch only.",
    )
    tensorboard: TensorBoardTrackingConfig = Field(default_factory=TensorBoardTrackingConfig)
    wandb: WandbTrackingConfig = Field(default_factory=WandbTrackingConfig)

    @field_validator("backends")
    @classmethod
    def _check_backends(cls, value: list[str]) -> list[str]:
        from swarmd.config.optional_packages import missing_package  # finds the package without importing it

        if len(set(value)) != len(value):
            raise ValueError("each backend once")
        for backend in value:
            problem = missing_package(backend)
            if problem:
                raise ValueError(problem)
        return value


class TaskSection(BaseModel):
    """`task.name` picks the plug-in; every other key under `task` is validated by that task's own Config."""

    model_config = ConfigDict(extra="allow")

    name: str = Field("swin", description="A task from `swarmd tasks` (built in: swin, albert).")
    _settings: Optional[BaseModel] = PrivateAttr(default=None)

    @property
    def settings(self) -> BaseModel:
        if self._settings is None:
            raise RuntimeError("task settings are resolved by swarmd.config.load_config")
        return self._settings


class SwarmdConfig(StrictModel):
    """The whole configuration of one peer."""

    run_id: str = Field(
        "swin-micro",  # the embedded default is configs/swin-micro.yaml: one run, whichever of the two a peer used
        pattern=RUN_ID_PATTERN,
        description="Name of the training run: peers with the same run_id train together.",
    )
    state_dir: str = Field(
        default_factory=default_state_dir,
        description="Identity, checkpoints, generated data and the status socket. One per daemon.",
    )
    task: TaskSection = Field(default_factory=TaskSection)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _check_roles(self) -> "SwarmdConfig":
        if self.network.client_mode and self.swarm.auxiliary:
            raise ValueError("an auxiliary peer serves others, so it cannot be in client_mode")
        return self

    @model_validator(mode="after")
    def _check_auxiliary_ranks(self) -> "SwarmdConfig":
        devices = self.training.devices
        if self.swarm.auxiliary and isinstance(devices, list) and len(devices) > 1:
            raise ValueError("training.devices: an auxiliary peer does not train, so it runs one rank; drop the list")
        return self

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    @property
    def checkpoint_path(self) -> Path:
        """checkpoint.dir, resolved against the state dir."""
        return self.state_path / Path(self.checkpoint.dir).expanduser()  # an absolute dir replaces the state dir

    def run_record(self) -> dict[str, Any]:
        """What a checkpoint records of the config it was trained with: the run-wide sections (run_id, swarm,
        training) and the task's settings. Not this machine's own (state_dir, network, daemon, checkpoint,
        metrics, logging, tracking): paths, addresses and packages that need not exist where it is exported."""
        data = self.to_dict()
        return {key: data[key] for key in ("run_id", "task", "swarm", "training")}

    def to_dict(self) -> dict[str, Any]:
        """The effective config as plain data, task settings included (what `swarmd config show` prints)."""
        data = self.model_dump(mode="json")
        task_settings = self.task._settings
        data["task"] = {"name": self.task.name, **(task_settings.model_dump(mode="json") if task_settings else {})}
        return data


# Which settings belong to the run (every peer of it must have the same: the run's manifest carries them,
# swarmd/swarm/manifest.py) and which to this peer (its machine, its paths, its addresses, what it reports).
# Dotted keys; the longest entry that a key starts with decides. A key under no entry is an error of this table
# (tests/unit/test_manifest.py walks the whole schema).
RUN_WIDE_KEYS: dict[str, bool] = {
    "run_id": True,
    "task": True,  # the task, the model, the data's identity and preparation, the optimizer and its schedule
    "task.data.path": False,  # where this machine keeps the prepared data
    "task.data.num_workers": False,  # this machine's loader processes
    "swarm": True,  # the strategy and its settings, target batch, matchmaking, compression, aggregation
    "swarm.auxiliary": False,  # this peer's role
    "swarm.exclusion": False,  # whom this peer refuses on evidence: each peer's own judgement
    "swarm.state_round_search": False,  # how long this peer looks for a state round it may have come late to
    "swarm.round_epoch_check": False,  # whether this peer acts on a round's group being an epoch ahead of it
    "swarm.step_on_partial_average": False,  # what this peer steps on after a partial gradient round
    "training": True,  # batch size, precision, seed, max_epochs
    "training.device": False,
    "training.devices": False,
    "training.threads": False,
    "training.max_consecutive_failures": False,
    "training.finish_wait_seconds": False,  # how long this peer serves its last state to peers behind
    "network": False,  # this peer's addresses and how it reaches the swarm
    "network.allowed_peers": True,  # a private run's allow-list
    "state_dir": False,
    "checkpoint": False,
    "daemon": False,
    "metrics": False,
    "logging": False,
    "tracking": False,
}


def scope_of(dotted: str) -> bool:
    """True if the dotted key is run-wide (RUN_WIDE_KEYS); KeyError for a key no entry covers."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        entry = RUN_WIDE_KEYS.get(".".join(parts[:end]))
        if entry is not None:
            return entry
    raise KeyError(dotted)


def run_wide_part(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The run-wide keys of a config as plain data (SwarmdConfig.to_dict()), local ones left out."""
    kept: dict[str, Any] = {}
    for key, value in data.items():
        dotted = prefix + key
        nested = [entry for entry in RUN_WIDE_KEYS if entry.startswith(dotted + ".")]
        if isinstance(value, dict) and nested:
            part = run_wide_part(value, dotted + ".")
            if part or scope_of(dotted):
                kept[key] = part
        elif scope_of(dotted):
            kept[key] = value
    return kept
