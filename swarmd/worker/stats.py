"""What the training worker measured: written by the worker thread, read by the daemon's tick.

Every write goes through a method that takes the lock, and the tick reads one consistent copy (`report()`).

It also holds the worker's heartbeat, `begin(activity, budget)`: what the worker is doing now, since when, and
how long that may legitimately take. systemd's watchdog is fed only while the current activity is within its
allowance (swarmd/daemon/systemd.py), so a hung training step lets the watchdog fire.

No torch import: the status and metrics code reads this.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["WorkerStats", "WorkerReport", "WorkerReadings", "CudaMemory", "Activity"]

# (what the worker is doing, seconds since it began, its budget in seconds or None)
Activity = tuple[str, float, Optional[float]]


@dataclass(frozen=True)
class CudaMemory:
    """One CUDA device's memory, from PyTorch's allocator counters (reading them needs no device sync)."""

    device: str  # "cuda:N"
    allocated_bytes: int  # held by tensors
    reserved_bytes: int  # held by the caching allocator (what nvidia-smi shows, minus the CUDA context)


@dataclass(frozen=True)
class WorkerReadings:
    """What the worker reads once per epoch (worker/readings.py epoch_readings), between steps."""

    epoch: Optional[int] = None  # the optimizer's local epoch they were read at
    learning_rates: tuple = ()  # per param group
    loss_scale: Optional[float] = None  # fp16 only
    grad_norm: Optional[float] = None  # of the (averaged) gradient of the last global step
    cuda_memory: tuple = ()  # CudaMemory of each of the worker's CUDA devices


@dataclass(frozen=True)
class WorkerReport:
    """A consistent copy of the stats at one moment."""

    phase: str
    steps_total: int
    samples_total: int
    samples_per_second: float
    loss: Optional[float]
    loss_history: tuple  # ((epoch, mean loss), ...)
    rate_history: tuple  # ((epoch, samples/s over its wall time), ...)
    compute_seconds_total: float
    optimizer_seconds_total: float
    failures_total: int
    nonfinite_steps_total: int
    restores_total: int
    last_error: str
    evaluation: Optional[tuple]  # (epoch, {metric: value}) of the last evaluation
    step_metrics: dict  # the task's extras of the last step (e.g. train accuracy)
    readings: WorkerReadings


@dataclass
class WorkerStats:
    phase: str = "starting"  # starting | joining | training | assisting | restarting | stopped | failed
    steps_total: int = 0
    samples_total: int = 0
    loss: Optional[float] = None  # mean over the last few steps
    compute_seconds_total: float = 0.0  # forward + backward
    optimizer_seconds_total: float = 0.0  # inside hivemind.Optimizer.step: accumulation, averaging waits, updates
    failures_total: int = 0  # training steps that raised
    nonfinite_steps_total: int = 0  # steps whose loss or gradients were NaN/Inf (not contributed)
    restores_total: int = 0  # times the parameters were restored from the in-memory backup
    last_error: str = ""
    evaluation: Optional[tuple] = None  # (epoch, results)
    step_metrics: dict = field(default_factory=dict)
    readings: WorkerReadings = field(default_factory=WorkerReadings)
    _window: deque = field(default_factory=lambda: deque(maxlen=50))  # (end time, samples, seconds, loss)
    _epoch_losses: deque = field(default_factory=lambda: deque(maxlen=200))  # (epoch, mean loss)
    _losses_this_epoch: list = field(default_factory=list)
    _epoch_rates: deque = field(default_factory=lambda: deque(maxlen=200))  # (epoch, samples/s)
    _samples_this_epoch: int = 0
    _epoch_began: Optional[float] = None  # clock time of the first step of this epoch's bucket
    _step_seconds: list = field(default_factory=list)  # for the metrics histogram, drained by the daemon's tick
    _lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic  # injectable, so tests age an activity without sleeping
    # (activity, clock time it began, budget in seconds or None): one tuple, so one atomic assignment
    _activity: tuple = ("starting", 0.0, None)

    def __post_init__(self):
        self._activity = ("starting", self.clock(), None)

    # --- the heartbeat -------------------------------------------------------------------------------------

    def begin(self, activity: str, budget: Optional[float] = None) -> None:
        """The worker starts `activity` (which is also a sign of life).

        `budget`: seconds it may legitimately take while waiting on others (averaging, a state download, a
        backoff), derived from the config by the worker. None for the worker's own work (a batch, forward,
        backward), which must show progress within one watchdog interval.
        """
        self._activity = (activity, self.clock(), budget)

    def activity(self) -> Activity:
        name, since, budget = self._activity
        return name, self.clock() - since, budget

    # --- writes (the worker thread) ------------------------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def record_step(
        self, *, samples: int, seconds: float, loss: float, optimizer_seconds: float = 0.0, metrics: Optional[dict] = None
    ) -> None:
        with self._lock:
            self.steps_total += 1
            self.samples_total += samples
            self.optimizer_seconds_total += optimizer_seconds
            self.compute_seconds_total += seconds - optimizer_seconds
            self._window.append((time.monotonic(), samples, seconds, loss))
            recent = [entry[3] for entry in list(self._window)[-10:] if math.isfinite(entry[3])]
            self.loss = sum(recent) / len(recent) if recent else None
            self._losses_this_epoch.append(loss)
            if self._epoch_began is None:
                self._epoch_began = self.clock() - seconds
            self._samples_this_epoch += samples
            self._step_seconds.append(seconds)
            if len(self._step_seconds) > 10_000:
                del self._step_seconds[:5_000]
            if metrics:
                self.step_metrics = dict(metrics)

    def end_epoch(self, epoch: int) -> None:
        """Close the loss bucket of the epoch that just ended (the loss trend in `swarmd status`)."""
        with self._lock:
            finite = [x for x in self._losses_this_epoch if math.isfinite(x)]
            if finite:
                self._epoch_losses.append((epoch, sum(finite) / len(finite)))
            self._losses_this_epoch = []
            if self._epoch_began is not None and self._samples_this_epoch:
                elapsed = self.clock() - self._epoch_began  # averaging waits included: the rate the swarm sees
                if elapsed > 0:
                    self._epoch_rates.append((epoch, self._samples_this_epoch / elapsed))
            self._samples_this_epoch, self._epoch_began = 0, self.clock()

    def record_failure(self, error: BaseException) -> None:
        """A training step raised."""
        with self._lock:
            self.failures_total += 1
            self.last_error = repr(error)

    def record_fatal(self, error: BaseException) -> None:
        """The worker gave up."""
        with self._lock:
            self.phase = "failed"
            self.last_error = repr(error)

    def record_nonfinite_step(self) -> None:
        with self._lock:
            self.nonfinite_steps_total += 1

    def record_restore(self) -> None:
        with self._lock:
            self.restores_total += 1

    def record_evaluation(self, epoch: int, results: dict) -> None:
        with self._lock:
            self.evaluation = (epoch, dict(results))

    def record_readings(self, readings: WorkerReadings) -> None:
        """What the worker reads once per epoch (worker/readings.py): learning rates, loss scale, CUDA memory."""
        with self._lock:
            self.readings = readings

    # --- reads (the daemon's tick) -------------------------------------------------------------------------

    def report(self) -> WorkerReport:
        with self._lock:
            return WorkerReport(
                phase=self.phase,
                steps_total=self.steps_total,
                samples_total=self.samples_total,
                samples_per_second=_rate(self._window),
                loss=self.loss,
                loss_history=tuple(self._epoch_losses),
                rate_history=tuple(self._epoch_rates),
                compute_seconds_total=self.compute_seconds_total,
                optimizer_seconds_total=self.optimizer_seconds_total,
                failures_total=self.failures_total,
                nonfinite_steps_total=self.nonfinite_steps_total,
                restores_total=self.restores_total,
                last_error=self.last_error,
                evaluation=self.evaluation,
                step_metrics=dict(self.step_metrics),
                readings=self.readings,
            )

    def drain_step_seconds(self) -> list[float]:
        with self._lock:
            drained, self._step_seconds = self._step_seconds, []
        return drained


def _rate(window) -> float:
    """Samples over wall time across the recent steps (averaging waits included)."""
    if len(window) < 2:
        return 0.0
    elapsed = window[-1][0] - window[0][0] + window[0][2]
    return sum(entry[1] for entry in window) / elapsed if elapsed > 0 else 0.0
