"""A record of averaging rounds: what the status, the metrics and the peer record report about them.

Written from hivemind's threads (the optimizer step, the background state averager), read from the event
loop; everything goes through one lock. No torch or hivemind import here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Optional

__all__ = ["AveragingRound", "AveragingLog", "KINDS", "OUTCOMES"]

KINDS = ("gradients", "state", "outer")  # outer: a DiLoCo round of pseudo-gradients (swarm/diloco.py)
# rejected: averaged fine, result implausible; local: a DiLoCo outer step on this peer's own pseudo-gradient
OUTCOMES = ("success", "failed", "skipped", "rejected", "local")


@dataclass(frozen=True)
class AveragingRound:
    kind: str  # gradients | state | outer
    outcome: str  # success | failed | skipped | rejected | local
    group_size: int  # peers in the group, this one included (1 when skipped or failed)
    duration_seconds: float
    epoch: int
    time: float  # unix time when the round ended
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class AveragingLog:
    history: int = 50
    _rounds: deque = field(init=False)
    _counts: dict = field(init=False)
    _last_by_kind: dict = field(init=False)  # survives the history window
    _listeners: list = field(init=False)  # callables(AveragingRound), e.g. the metrics histogram
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self):
        self._rounds = deque(maxlen=self.history)
        self._counts = {(kind, outcome): 0 for kind in KINDS for outcome in OUTCOMES}
        self._last_by_kind = {}
        self._listeners = []

    def add_listener(self, callback) -> None:
        """Call `callback(round)` for every round recorded from now on (from the recording thread)."""
        with self._lock:
            self._listeners.append(callback)

    def record(
        self, kind: str, outcome: str, *, group_size: int, duration: float, epoch: int, error: str = ""
    ) -> AveragingRound:
        if kind not in KINDS or outcome not in OUTCOMES:
            raise ValueError(f"unknown averaging round {kind}/{outcome}")
        item = AveragingRound(kind, outcome, group_size, round(duration, 4), epoch, time.time(), error[:200])
        with self._lock:
            self._rounds.append(item)
            self._counts[kind, outcome] += 1
            self._last_by_kind[kind] = item
            listeners = list(self._listeners)
        for callback in listeners:
            callback(item)
        return item

    def last(self, kind: Optional[str] = None) -> Optional[AveragingRound]:
        with self._lock:
            if kind is not None:
                return self._last_by_kind.get(kind)
            return self._rounds[-1] if self._rounds else None

    def recent(self, limit: int = 10) -> list[AveragingRound]:
        with self._lock:
            return list(self._rounds)[-limit:]

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)
