"""The extension that serves the run's manifest: the founder's (signed at start from its config with the run's
key, swarm/manifest.py `founder_manifest`) or the one a joiner verified before it started
(cli/run.py `join_by_manifest`). Every peer of the run stores it again each `interval`, and reads the run's
entries back: what it ignores there (forged, malformed, another key, older versions) is counted and logged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension

__all__ = ["ManifestPublisher", "manifest_publisher"]

logger = logging.getLogger("swarmd.manifest")


class ManifestPublisher(Extension):
    def __init__(self, envelope: Optional[bytes], *, interval: float = 60.0, expiration: float = 300.0,
                 dht_timeout: float = 10.0):
        self.envelope = envelope  # a joiner's verified manifest; None: the founder signs its own at start
        self.interval = interval
        self.expiration = expiration
        self.dht_timeout = dht_timeout
        self.manifest = None
        self.published_total = 0
        self.ignored_total = 0
        self._task: Optional[asyncio.Task] = None

    async def start(self, view: DaemonView) -> None:
        from swarmd.swarm.manifest import decode, founder_manifest, summary

        config = view.config
        if self.envelope is None:
            self.manifest = await asyncio.to_thread(founder_manifest, config)  # RSA signing: off the loop
            role = "founder"
        else:
            self.manifest = decode(self.envelope, run_id=config.run_id)
            role = "member"
        logger.info("Serving the manifest of %s as a %s", summary(self.manifest), role)

    def record_validators(self, view: DaemonView) -> list[Any]:
        from swarmd.swarm.manifest_records import ManifestValidator

        if self.manifest is None:
            return []
        return [ManifestValidator(self.manifest.run_id, self.manifest.fingerprint)]

    def ready(self, view: DaemonView) -> None:
        if self.manifest is not None and view.dht is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_forever(view), name="manifest-publisher")

    def stopping(self, view: DaemonView) -> None:
        self._cancel()

    async def close(self) -> None:
        self._cancel()

    async def _serve_forever(self, view: DaemonView) -> None:
        failures = 0
        while True:
            try:
                await self._serve_once(view)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - serving the manifest must not stop training
                failures += 1
                level = logging.WARNING if failures in (1, 10, 100) else logging.DEBUG
                logger.log(level, "The run's manifest: %r (failure %d in a row; retrying)", e, failures)
            await asyncio.sleep(self.interval)

    async def _serve_once(self, view: DaemonView) -> None:
        from swarmd.swarm.manifest import choose
        from swarmd.swarm.manifest_records import describe_ignored, manifest_key, publish
        from swarmd.swarm.peer_records import entries

        for future in publish(view.dht, self.manifest, expiration=self.expiration):
            await asyncio.wait_for(future, self.dht_timeout)
        self.published_total += 1
        found = await asyncio.wait_for(
            view.dht.get(manifest_key(self.manifest.run_id), latest=True, return_future=True), self.dht_timeout)
        choice = choose(entries(found), self.manifest.run_id, self.manifest.fingerprint)
        ignored = choice.malformed + choice.other_key
        if ignored > self.ignored_total:
            logger.warning("Ignored manifest entries of run %s: %s", self.manifest.run_id, describe_ignored(choice))
        self.ignored_total = max(self.ignored_total, ignored)
        newer = choice.manifest
        if newer is not None and newer.version > self.manifest.version:
            logger.warning("The run's manifest is now version %d (this peer started with %d): restart this peer to "
                           "apply it", newer.version, self.manifest.version)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


def manifest_publisher(config, envelope: Optional[bytes]) -> Optional[ManifestPublisher]:
    """A joiner's (it verified `envelope`) or the founder's (it holds the run's key in its state dir); else None."""
    from swarmd.swarm.manifest import run_key_path

    if envelope is not None or run_key_path(config.state_path, config.run_id).exists():
        return ManifestPublisher(envelope)
    return None
