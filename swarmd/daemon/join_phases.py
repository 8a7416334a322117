"""How long each phase of a join took, and the one line that says so once the peer holds the swarm's state.

The phases overlap (daemon/parallel_start.py: the model is built while the reachability probe runs, and what the
optimizer imports is imported while the DHT bootstraps), so each is timed on its own and the total is the wall time
from the process's start, not their sum.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator, Optional

__all__ = ["PHASES", "JoinPhases", "process_start_time"]

# in the order of the summary line: name in the line -> what it covers
PHASES = {
    "imports": "torch and hivemind, before anything else can start",
    "model": "the task prepared, its model built, a checkpoint loaded, the start values hashed",
    "DHT": "the reachability probe, the DHT process started and bootstrapped",
    "optimizer": "hivemind.Optimizer built: its averagers' processes, offloaded state",
    "look-up": "waiting for the swarm's progress and whose state to take",
    "download": "the swarm's state downloaded and applied",
}


def process_start_time() -> float:
    """Unix time this process started (from /proc, to 10 ms), or now where /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class JoinPhases:
    """Phase -> seconds, from any thread; `summary()` is the line the worker logs once it holds the swarm's state."""

    def __init__(self, started: Optional[float] = None):
        self.started = process_start_time() if started is None else started
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - began)

    def add(self, phase: str, seconds: float) -> None:
        """`seconds` more (or fewer: a wait inside a timed phase that it should not count) of `phase`."""
        if phase not in PHASES:
            raise ValueError(f"unknown join phase {phase!r}; one of {', '.join(PHASES)}")
        with self._lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def summary(self, now: Optional[float] = None) -> str:
        """"Joined in X s: imports a s, model b s, DHT c s, ..." (phases that did not happen are left out)."""
        total = (time.time() if now is None else now) - self.started
        return f"Joined in {total:.1f} s: {self.so_far()} (phases overlap)"

    def so_far(self) -> str:
        """"imports a s, model b s, ...": the phases timed so far (daemon/startup_watch.py quotes it too)."""
        with self._lock:
            parts = [f"{name} {self.seconds[name]:.1f} s" for name in PHASES if name in self.seconds]
        return ", ".join(parts) or "no phase timed"
