"""A record of averaging rounds: what the status, the metrics and the peer record report about them.

Written from hivemind's threads (the optimizer step, the background state averager), read by the daemon's tick
on the event loop; everything goes through one lock. No torch or hivemind import here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Optional

from swarmd.swarm.outcomes import KINDS, OUTCOMES

__all__ = ["AveragingRound", "AveragingLog", "AveragingSummary", "KINDS", "OUTCOMES", "RoundTimeline", "timeline_phases"]

MAX_GROUP_PEERS = 64  # peers a round's timeline names (a group is as large as strangers make it)


@dataclass(frozen=True)
class RoundTimeline:
    """When one round's phases ran on this peer (unix times) and with whom: the flight recorder's entry.

    asked_at -> grouped_at: matchmaking, and for a pre-scheduled round the wait for this peer's trigger;
    grouped_at -> reduced_at: the all-reduce (sending, reducing its share, receiving); reduced_at -> ended_at:
    applying the result (the optimizer step, or the outer step). A time that was not seen is None: a round that
    failed before its group formed has no grouped_at."""

    asked_at: Optional[float]
    grouped_at: Optional[float]
    reduced_at: Optional[float]
    ended_at: float
    peers: tuple = ()  # the group's peer ids (base58), this peer's among them
    # what this peer's all-reduce sent and received over the network (swarm/upstream/round_traffic.py); None when
    # the round had no all-reduce (or its runner counted nothing)
    sent_bytes: Optional[int] = None
    received_bytes: Optional[int] = None

    @classmethod
    def of(cls, control, ended_at: Optional[float] = None) -> Optional["RoundTimeline"]:
        """The timeline of a finished round from its StepControl (stamped by swarm/upstream/partial_rounds.py); None for
        a round that had no control."""
        if control is None:
            return None
        gathered = None
        if control.done() and not control.cancelled() and control.exception() is None:
            gathered = control.result()
        peers = tuple(_peer_name(peer) for peer in list(gathered or ())[:MAX_GROUP_PEERS])
        return cls(
            asked_at=getattr(control, "asked_at", None),
            grouped_at=getattr(gathered, "grouped_at", None),
            reduced_at=getattr(gathered, "reduced_at", None),
            ended_at=time.time() if ended_at is None else ended_at,
            peers=peers,
            sent_bytes=getattr(gathered, "sent_bytes", None),
            received_bytes=getattr(gathered, "received_bytes", None),
        )

    def phases(self) -> dict:
        return timeline_phases(self.asked_at, self.grouped_at, self.reduced_at, self.ended_at)


def timeline_phases(asked_at, grouped_at, reduced_at, ended_at) -> dict:
    """{phase: seconds} of a round's timeline, for the phases whose both ends were seen (numbers: a timeline read
    back from JSON, or from another peer, may hold anything)."""
    marks = [("matchmaking", asked_at, grouped_at), ("all-reduce", grouped_at, reduced_at),
             ("applying", reduced_at, ended_at)]
    return {name: round(max(0.0, end - start), 4) for name, start, end in marks
            if isinstance(start, (int, float)) and isinstance(end, (int, float))}


def _peer_name(peer) -> str:
    return peer.to_base58() if hasattr(peer, "to_base58") else str(peer)[:64]


@dataclass(frozen=True)
class AveragingRound:
    kind: str  # see swarm/outcomes.py
    outcome: str
    group_size: int  # peers in the group, this one included (1 when skipped or failed)
    duration_seconds: float
    epoch: int
    time: float  # unix time when the round ended
    error: str = ""
    # for a round that ran behind the training (diloco overlap_steps): how long the training still waited for it
    waited_seconds: Optional[float] = None
    # for a diloco round: how long the training waited, before it sent, for the slowest peers to catch up
    peer_wait_seconds: Optional[float] = None
    timeline: Optional[RoundTimeline] = None  # for a round that had a group to look for

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AveragingSummary:
    """A consistent copy of the log, taken under its lock."""

    counts: dict  # {(kind, outcome): rounds}, every pair present
    last: Optional[AveragingRound]
    last_by_kind: dict  # {kind: AveragingRound}
    recent: tuple  # the newest rounds, oldest first


@dataclass
class AveragingLog:
    history: int = 50
    _rounds: deque = field(init=False)
    _counts: dict = field(init=False)
    _last_by_kind: dict = field(init=False)  # survives the history window
    _unread: list = field(init=False)  # rounds recorded since the last take_new(), for the daemon's event channel
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self):
        self._rounds = deque(maxlen=self.history)
        self._counts = {(kind, outcome): 0 for kind in KINDS for outcome in OUTCOMES}
        self._last_by_kind = {}
        self._unread = []

    def record(
        self, kind: str, outcome: str, *, group_size: int, duration: float, epoch: int, error: str = "",
        waited: Optional[float] = None, peer_wait: Optional[float] = None, timeline: Optional[RoundTimeline] = None,
    ) -> AveragingRound:
        if kind not in KINDS or outcome not in OUTCOMES:
            raise ValueError(f"unknown averaging round {kind}/{outcome}")
        item = AveragingRound(
            kind, outcome, group_size, round(duration, 4), epoch, time.time(), error[:200],
            waited_seconds=_seconds(waited), peer_wait_seconds=_seconds(peer_wait), timeline=timeline,
        )
        with self._lock:
            self._rounds.append(item)
            self._counts[kind, outcome] += 1
            self._last_by_kind[kind] = item
            self._unread.append(item)
            if len(self._unread) > 10 * self.history:  # nobody reads: keep the newest only
                del self._unread[: len(self._unread) - self.history]
        return item

    def take_new(self) -> list[AveragingRound]:
        """The rounds recorded since the previous call (one reader: the daemon's tick)."""
        with self._lock:
            new, self._unread = self._unread, []
        return new

    def summary(self, recent: int = 10) -> AveragingSummary:
        with self._lock:
            return AveragingSummary(
                counts=dict(self._counts),
                last=self._rounds[-1] if self._rounds else None,
                last_by_kind=dict(self._last_by_kind),
                recent=tuple(list(self._rounds)[-recent:]),
            )

    def last(self, kind: Optional[str] = None) -> Optional[AveragingRound]:
        summary = self.summary(recent=0)
        return summary.last_by_kind.get(kind) if kind is not None else summary.last

    def counts(self) -> dict[tuple[str, str], int]:
        return self.summary(recent=0).counts


def _seconds(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)
