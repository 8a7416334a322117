"""The seam between the daemon and what observes it (metrics, systemd, peer records, the progress log, ...).

A leaf module: it imports nothing of swarmd, so an extension depends on this interface, never on the Daemon.
Hooks (start, record_validators, ready, tick, on_event, snapshot_fields, reload, stopping, close) get a narrow `DaemonView` (the config, the latest snapshot, the worker's heartbeat, the DHT once joined)
and events through one channel (`on_event`), all on the event loop's thread. Which extensions run is decided at
the composition root (swarmd/daemon/assembly.py), not here; the lifecycle calls their hooks in order and never
lets one failure stop training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

__all__ = ["DaemonView", "Extension", "Event", "AveragingRoundFinished", "StepsFinished", "WorkerActivity"]

# (what the worker is doing, seconds since it began, its budget in seconds or None): see worker/stats.py `begin`
WorkerActivity = tuple[str, float, Optional[float]]


class DaemonView(Protocol):
    """What an extension may see of the daemon."""

    @property
    def config(self) -> Any:
        """The validated config (config/schema.py SwarmdConfig)."""

    @property
    def dht(self) -> Any:
        """The hivemind DHT once joined (None before, and for extensions that do not need it)."""

    def snapshot(self) -> Any:
        """The latest status snapshot (status/snapshot.py Snapshot), rebuilt every tick."""

    def worker_activity(self) -> Optional[WorkerActivity]:
        """The training worker's heartbeat now (None before it exists)."""

    def retune(self, changes: dict) -> None:
        """Change run-wide swarm settings while training (daemon/retune.py LIVE_SWARM_KEYS: key -> new value);
        ValueError for one that cannot change live."""


@dataclass(frozen=True)
class AveragingRoundFinished:
    round: Any  # swarm/averaging_log.py AveragingRound


@dataclass(frozen=True)
class StepsFinished:
    seconds: tuple  # wall time of each local step finished since the previous event


Event = AveragingRoundFinished | StepsFinished


class Extension:
    """Do-nothing hooks; override what you need. All run on the event loop's thread."""

    async def start(self, view: DaemonView) -> None:
        """Before the heavy start-up (the status socket is already answering "starting")."""

    def record_validators(self, view: DaemonView) -> list[Any]:
        """hivemind RecordValidators the DHT must register (e.g. for signed per-peer records)."""
        return []

    def ready(self, view: DaemonView) -> None:
        """The DHT is up, the optimizer is built and the worker is training."""

    async def tick(self, view: DaemonView, snapshot: Any) -> None:
        """Every daemon.tick_interval seconds once ready, with the snapshot just built."""

    def on_event(self, event: Event) -> None:
        """Something happened since the last tick (delivered by the tick, before `tick`)."""

    def snapshot_fields(self) -> dict[str, Any]:
        """Fields this extension owns in the snapshot (names of status/snapshot.py Snapshot fields)."""
        return {}

    def reload(self, view: DaemonView) -> None:
        """The operator asked to read changed settings again (SIGHUP)."""

    def stopping(self, view: DaemonView) -> None:
        """The graceful stop has begun."""

    async def close(self) -> None:
        """After hivemind has stopped; release what start() took."""
