"""Per-rank figures for status, the TUI and metrics: samples/s and CUDA memory of every rank of this peer.

Fed on rank 0 by the worker with each step's StepTotals (the stats all_gather already brought every rank's
samples, compute seconds and memory); read by the daemon's tick. No torch import: the status code reads this.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

__all__ = ["RankStats", "RankReport"]

_WINDOW_STEPS = 50  # the same window the worker's own samples/s uses (worker/stats.py)


@dataclass(frozen=True)
class RankReport:
    """One rank's figures: what `swarmd status --json` shows under "ranks" (a CPU rank's row has no CUDA keys)."""

    rank: int
    device: str
    samples_total: int
    samples_per_second: float  # compute throughput (forward + backward), not counting the waits for the other ranks
    cuda_allocated_bytes: Optional[int] = None  # CUDA ranks only: held by tensors at the last step
    cuda_reserved_bytes: Optional[int] = None  # and by the caching allocator


class RankStats:
    def __init__(self, devices: Sequence[str]):
        self.devices = [str(d) for d in devices]
        self._lock = threading.Lock()
        # per rank: (samples, compute seconds) of the last steps; memory of the last step
        self._window: list[deque] = [deque(maxlen=_WINDOW_STEPS) for _ in self.devices]
        self._memory: list[tuple[int, int]] = [(0, 0) for _ in self.devices]
        self._samples_total = [0 for _ in self.devices]

    def record(self, totals) -> None:
        """One step's StepTotals (from StepSync.average_gradients on rank 0)."""
        with self._lock:
            for step in totals.ranks:
                if step.rank >= len(self.devices):
                    continue  # torchrun: ranks on other nodes are not listed in this peer's devices
                self._window[step.rank].append((step.samples, step.compute_seconds))
                self._memory[step.rank] = (step.cuda_allocated_bytes, step.cuda_reserved_bytes)
                self._samples_total[step.rank] += step.samples

    def snapshot(self) -> tuple[RankReport, ...]:
        """One report per rank, rank 0's first."""
        with self._lock:
            rows = []
            for rank, device in enumerate(self.devices):
                samples = sum(s for s, _ in self._window[rank])
                seconds = sum(t for _, t in self._window[rank])
                allocated, reserved = self._memory[rank] if device.startswith("cuda") else (None, None)
                rows.append(RankReport(
                    rank=rank,
                    device=device,
                    samples_total=self._samples_total[rank],
                    samples_per_second=round(samples / seconds, 3) if seconds > 0 else 0.0,
                    cuda_allocated_bytes=allocated,
                    cuda_reserved_bytes=reserved,
                ))
            return tuple(rows)
