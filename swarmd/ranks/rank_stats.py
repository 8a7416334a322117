"""Per-rank figures for status, the TUI and metrics: samples/s and CUDA memory of every rank of this peer.

Fed on rank 0 by the worker with each step's StepTotals (the stats all_gather already brought every rank's
samples, compute seconds and memory); read by the daemon's tick. No torch import: the status code reads this.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = ["RankStats"]

_WINDOW_STEPS = 50  # the same window the worker's own samples/s uses (worker/stats.py)


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

    def snapshot(self) -> list[dict[str, Any]]:
        """One entry per rank: what `swarmd status --json` shows under "ranks"."""
        with self._lock:
            rows = []
            for rank, device in enumerate(self.devices):
                samples = sum(s for s, _ in self._window[rank])
                seconds = sum(t for _, t in self._window[rank])
                allocated, reserved = self._memory[rank]
                row: dict[str, Any] = {
                    "rank": rank,
                    "device": device,
                    "samples_total": self._samples_total[rank],
                    # compute throughput (forward + backward), not counting the waits for the other ranks
                    "samples_per_second": round(samples / seconds, 3) if seconds > 0 else 0.0,
                }
                if device.startswith("cuda"):
                    row["cuda_allocated_bytes"], row["cuda_reserved_bytes"] = allocated, reserved
                rows.append(row)
            return rows
