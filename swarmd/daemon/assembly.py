"""The composition root: which extensions a daemon runs, for a given config and environment.

Extensions depend on the leaf interface (swarmd/extension.py), the lifecycle on nothing of theirs; only this
module names both. Their modules import nothing heavy at import time.
"""

from __future__ import annotations

from swarmd.extension import Extension

__all__ = ["build_extensions"]


def build_extensions(config, *, manifest: bytes | None = None) -> list[Extension]:
    """The extensions this config asks for, in start order. `manifest`: the run's signed manifest a joiner
    took its config from (it serves it too)."""
    from swarmd.daemon.systemd import systemd_notifier

    extensions: list[Extension] = []
    # only when systemd started us (Type=notify sets $NOTIFY_SOCKET)
    notifier = systemd_notifier(shutdown_timeout=config.daemon.shutdown_timeout)
    if notifier is not None:
        extensions.append(notifier)
    if config.metrics.enabled:
        from swarmd.metrics.extension import MetricsExtension

        extensions.append(MetricsExtension(config.metrics.listen))
    from swarmd.swarm.private import private_swarm

    # before the announcer: its signature validator must use the identity key the private swarm installs
    private = private_swarm(config.network)
    if private is not None:
        extensions.append(private)
    from swarmd.swarm.exclusion import exclusions

    # before the DHT and the averagers exist: they are forked with the exclusion list installed
    excluding = exclusions(config.swarm)
    if excluding is not None:
        extensions.append(excluding)
    from swarmd.swarm.manifest_publisher import manifest_publisher

    # before the announcer: a joiner that finds peer records but no manifest takes the run for one without any
    publisher = manifest_publisher(config, manifest)
    if publisher is not None:
        extensions.append(publisher)
    from swarmd.swarm.announcer import PeerAnnouncer

    extensions.append(PeerAnnouncer(config.run_id))
    from swarmd.swarm.reachability import ReachabilityCheck

    extensions.append(ReachabilityCheck())
    if config.logging.progress_interval:
        from swarmd.daemon.progress_log import ProgressLogger

        extensions.append(ProgressLogger(config.logging.progress_interval))
    if config.tracking.backends:
        from swarmd.tracking.extension import TrackingExtension

        extensions.append(TrackingExtension(config))
    return extensions
