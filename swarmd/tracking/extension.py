"""What a peer logs to its tracking backends, read from the status snapshot at each tick.

`epoch_scalars(snapshot)` turns one snapshot into the scalars of the epoch this peer has just reached; the
`SnapshotDiff` decides what is new since the last tick, so each thing is logged once at the step it belongs to:

  on reaching an epoch E (step E)   lr, fp16 loss scale, throughput, swarm size, averaging totals, bytes,
                                    the task's step metrics, CUDA memory: the state this epoch's steps run with
  when epoch E's loss bucket closes loss_metrics/epoch_avg_loss at step E (mean over this peer's steps in E)
  per averaging round               averaging/<kind>_* at the round's epoch
  per evaluation                    eval/<metric> at the evaluated epoch
  every tracking.log_every_steps    loss_metrics/recent_avg_loss on the local_step axis

The functions read the snapshot's attributes (status/snapshot.py Snapshot and its typed parts); a value it does
not carry (None, or metrics off for the network bytes) is simply not logged. The tick only puts records on the
fan-out's queue: no backend runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterator, Optional

from swarmd.extension import DaemonView, Extension
from swarmd.status.snapshot import Evaluation, Snapshot, TrackingInfo

__all__ = ["TrackingExtension", "SnapshotDiff", "epoch_scalars", "averaging_scalars", "evaluation_scalars"]

logger = logging.getLogger("swarmd.tracking")

_GIB = 1024**3
_CLOSE_TIMEOUT = 20.0  # seconds for the backends to flush at shutdown (a wandb upload may take a while)


def epoch_scalars(snapshot: Snapshot) -> dict[str, float]:
    """The scalars of the epoch `snapshot.local_epoch` (names in the style of torchtitan's metrics)."""
    scalars: dict[str, float] = {}

    def put(name: str, value) -> None:
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)):
            scalars[name] = float(value)

    s = snapshot
    for index, lr in enumerate(s.learning_rates):
        put(f"lr/group_{index}", lr)
    put("loss_metrics/loss_scale", s.loss_scale)
    put("loss_metrics/grad_norm", s.grad_norm)

    put("throughput/local_samples_per_second", s.samples_per_second)
    if s.peers:  # each peer's signed record (this one's included) carries its recent throughput
        put("throughput/swarm_samples_per_second", sum(p.get("samples_per_second") or 0.0 for p in s.peers))
    put("throughput/samples_total", s.samples_total)
    put("throughput/steps_total", s.steps_total)

    put("swarm/local_epoch", s.local_epoch)
    put("swarm/global_epoch", s.global_epoch)
    put("swarm/num_peers", s.num_peers)
    put("swarm/num_clients", s.num_clients)
    put("swarm/target_batch_size", s.target_batch_size)

    for kind, outcomes in s.averaging.items():
        for outcome, count in outcomes.items():
            put(f"averaging/{kind}_{outcome}_total", count)
    put("averaging/state_loads_total", s.state_loads_total)

    if s.network is not None:
        put("network/sent_bytes_total", s.network.sent_bytes)
        put("network/received_bytes_total", s.network.received_bytes)

    for name, value in s.step_metrics.items():
        put(f"train_metrics/{name}", value)

    for device in s.cuda_memory:  # worker/stats.py CudaMemory
        put(f"memory/{device.device}/allocated(GiB)", device.allocated_bytes / _GIB)
        put(f"memory/{device.device}/reserved(GiB)", device.reserved_bytes / _GIB)
    return scalars


def averaging_scalars(round_) -> dict[str, float]:
    """One averaging round (swarm/averaging_log.py AveragingRound): did it succeed, how long, with how many."""
    kind = round_.kind
    return {
        f"averaging/{kind}_success": 1.0 if round_.outcome == "success" else 0.0,
        f"averaging/{kind}_duration(s)": float(round_.duration_seconds or 0.0),
        f"averaging/{kind}_group_size": float(round_.group_size or 0),
    }


def evaluation_scalars(evaluation: Evaluation) -> dict[str, float]:
    return {
        f"eval/{name}": float(value)
        for name, value in (evaluation.metrics or {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class SnapshotDiff:
    """Remembers what was logged; `records(snapshot)` yields (scalars, step, axis) for what is new."""

    def __init__(self, log_every_steps: int):
        self.log_every_steps = log_every_steps
        self._epoch: Optional[int] = None
        self._loss_epoch: Optional[int] = None
        self._round_time: Optional[float] = None
        self._eval_epoch: Optional[int] = None
        self._step_bucket: Optional[int] = None

    def records(self, snapshot: Snapshot) -> Iterator[tuple[dict[str, float], int, str]]:
        epoch = snapshot.local_epoch
        # "stopping": the daemon's last look (its ticks have ended) at a peer that was training
        trained = snapshot.state == "training" or (snapshot.state == "stopping" and self._epoch is not None)
        if epoch is None or not trained:
            return
        first = self._epoch is None
        # the worker reads the epoch's learning rates and gradient norm just after the optimizer's epoch changed: a
        # tick in between would log the previous epoch's under this one; the next tick logs them
        readings_epoch = snapshot.readings_epoch
        if epoch != self._epoch and (readings_epoch is None or readings_epoch >= epoch):
            self._epoch = epoch
            yield epoch_scalars(snapshot), epoch, "epoch"

        # Loss buckets close on the worker's thread just after the epoch changes: take each as it appears.
        for bucket_epoch, loss in snapshot.loss_history:
            if self._loss_epoch is None or bucket_epoch > self._loss_epoch:
                self._loss_epoch = bucket_epoch
                yield {"loss_metrics/epoch_avg_loss": float(loss)}, bucket_epoch, "epoch"

        rounds = sorted(snapshot.recent_averaging, key=lambda r: r.time)
        for round_ in rounds:
            if first or (self._round_time is not None and round_.time <= self._round_time):
                continue  # on the first tick: history from before tracking started is in the totals already
            yield averaging_scalars(round_), round_.epoch, "epoch"
        if rounds:
            self._round_time = max(self._round_time or 0.0, rounds[-1].time)

        evaluation = snapshot.evaluation
        if evaluation is not None and evaluation.epoch != self._eval_epoch:
            self._eval_epoch = evaluation.epoch
            scalars = evaluation_scalars(evaluation)
            if scalars:
                yield scalars, evaluation.epoch, "epoch"

        steps, loss = snapshot.steps_total, snapshot.loss
        if self.log_every_steps and loss is not None and steps:
            bucket = steps // self.log_every_steps
            if bucket != self._step_bucket:
                self._step_bucket = bucket
                yield {"loss_metrics/recent_avg_loss": float(loss)}, steps, "local_step"


class TrackingExtension(Extension):
    """Logs this peer's training to the configured backends; needs only the config and the snapshot."""

    def __init__(self, config, backends=None):
        from swarmd.tracking.backends import build_backends
        from swarmd.tracking.base import LoggerFanout

        self.fanout = LoggerFanout(build_backends(config) if backends is None else backends)
        self.diff = SnapshotDiff(config.tracking.log_every_steps)

    def ready(self, view: DaemonView) -> None:
        # Not in start(): a daemon that fails to start leaves no empty runs behind.
        self.fanout.start()

    async def tick(self, view: DaemonView, snapshot: Snapshot) -> None:
        self.observe(snapshot)

    def stopping(self, view: DaemonView) -> None:
        # The epoch a run stops at (training.max_epochs) comes a moment before the stop: with no tick in between,
        # its records were lost (CI, 2026-12-06: epochs 0-5 logged of 0-6)
        self.observe(view.snapshot())

    def observe(self, snapshot: Snapshot) -> None:
        for scalars, step, axis in self.diff.records(snapshot):
            self.fanout.log(scalars, step, axis)

    def snapshot_fields(self) -> dict[str, Any]:
        return {
            "tracking": TrackingInfo(
                backends=tuple(self.fanout.active),
                failed=tuple(self.fanout.failed),
                failures_total=self.fanout.failures_total,
                dropped_total=self.fanout.dropped_total,
            )
        }

    async def close(self) -> None:
        await asyncio.to_thread(self.fanout.close, _CLOSE_TIMEOUT)
