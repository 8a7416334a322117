"""Observers of the daemon's life (metrics endpoint, systemd notification, peer records, ...).

Each one is a DaemonExtension: the lifecycle calls its hooks in order and never lets one failure stop training.
Adding a surface means writing one class and listing it in `build_extensions` - nothing in the lifecycle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DaemonExtension", "build_extensions"]


class DaemonExtension:
    """Do-nothing hooks; override what you need. All run on the event loop thread."""

    async def start(self, daemon) -> None:
        """Before the heavy start-up (the status socket is already answering "starting")."""

    def record_validators(self, daemon) -> list[Any]:
        """hivemind RecordValidators the DHT must register (e.g. for signed per-peer records)."""
        return []

    def ready(self, daemon) -> None:
        """The DHT is up, the optimizer is built and the worker is training."""

    async def tick(self, daemon, snapshot: dict[str, Any]) -> None:
        """Every daemon.tick_interval seconds while running, with the current snapshot."""

    def snapshot_fields(self, daemon) -> dict[str, Any]:
        """Extra keys for the status snapshot (must be cheap: called for every status request)."""
        return {}

    def stopping(self, daemon) -> None:
        """The graceful stop has begun."""

    async def close(self, daemon) -> None:
        """After hivemind has stopped; release what start() took."""


def build_extensions(config) -> list[DaemonExtension]:
    """The extensions this config asks for, in start order. Their modules import nothing heavy at import time."""
    from swarmd.daemon.systemd import systemd_notifier

    extensions: list[DaemonExtension] = []
    notifier = systemd_notifier()  # only when systemd started us (Type=notify sets $NOTIFY_SOCKET)
    if notifier is not None:
        extensions.append(notifier)
    if config.metrics.enabled:
        from swarmd.metrics.extension import MetricsExtension

        extensions.append(MetricsExtension(config.metrics.listen))
    from swarmd.swarm.announcer import PeerAnnouncer

    extensions.append(PeerAnnouncer())
    if config.logging.progress_interval:
        from swarmd.daemon.progress_log import ProgressLogger

        extensions.append(ProgressLogger(config.logging.progress_interval))
    if config.tracking.backends:
        from swarmd.tracking.extension import TrackingExtension

        extensions.append(TrackingExtension(config))
    return extensions
