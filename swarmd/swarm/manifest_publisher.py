"""The extension that serves and follows the run's manifest: the founder's (signed at start from its config with the
run's key, swarm/manifest_update.py `founder_manifest`) or the one a joiner verified before it started
(cli/run.py `join_by_manifest`).

Every peer of the run stores the newest version it follows again each `interval`, and reads the run's entries back
every `poll_interval`: what it ignores there (forged, malformed, another key) is counted and logged; a newer version
under the run's key is applied at this peer's next epoch boundary (swarm/manifest_update.py: the live keys change
at once, the others are reported as needing a restart). The founder also watches its stored manifest, which
`swarmd run update` replaces, and publishes a new version as soon as it sees it."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension

__all__ = ["ManifestPublisher", "manifest_publisher"]

logger = logging.getLogger("swarmd.manifest")


class ManifestPublisher(Extension):
    def __init__(self, envelope: Optional[bytes], *, interval: float = 60.0, poll_interval: float = 5.0,
                 expiration: float = 300.0, dht_timeout: float = 10.0):
        self.envelope = envelope  # a joiner's verified manifest; None: the founder signs its own at start
        self.interval = interval
        self.poll_interval = poll_interval
        self.expiration = expiration
        self.dht_timeout = dht_timeout
        self.manifest = None  # the newest version this peer follows (and serves)
        self.started_version: Optional[int] = None
        self.started: Optional[dict] = None  # the run-wide settings this peer started with
        self.applied: Optional[dict] = None  # the same, with the live changes applied since
        self.pending = None  # a newer version, applied at the next epoch boundary
        self.restart_needed: tuple = ()
        self.published_total = 0
        self.ignored_total = 0
        self._pending_epoch: Optional[int] = None
        self._founder = envelope is None
        self._stored_seen: Optional[tuple] = None
        self._publish_now: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None

    async def start(self, view: DaemonView) -> None:
        from swarmd.swarm.manifest import decode, manifest_config, summary
        from swarmd.swarm.manifest_update import founder_manifest

        config = view.config
        if self._founder:
            self.manifest = await asyncio.to_thread(founder_manifest, config)  # RSA signing: off the loop
            self._stored_seen = self._stored_stat(config)
        else:
            self.manifest = decode(self.envelope, run_id=config.run_id)
        self.started_version = self.manifest.version
        self.started = manifest_config(config)
        self.applied = copy.deepcopy(self.started)
        if self.manifest.config != self.started:  # a founder whose settings are not its manifest's: apply at once
            self.pending, self._pending_epoch = self.manifest, None
        role = "founder" if self._founder else "member"
        logger.info("Serving the manifest of %s as a %s", summary(self.manifest), role)

    def record_validators(self, view: DaemonView) -> list[Any]:
        from swarmd.swarm.manifest_records import ManifestValidator

        if self.manifest is None:
            return []
        return [ManifestValidator(self.manifest.run_id, self.manifest.fingerprint)]

    def ready(self, view: DaemonView) -> None:
        if self.manifest is not None and view.dht is not None:
            self._publish_now = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._serve_forever(view), name="manifest-publisher")

    async def tick(self, view: DaemonView, snapshot: Any) -> None:
        if self.manifest is None:
            return
        if self._founder:
            self._read_stored(view)
        if self.pending is not None and (self._pending_epoch is None or snapshot.local_epoch is None
                                         or snapshot.local_epoch != self._pending_epoch):
            self._apply(view, snapshot.local_epoch)

    def snapshot_fields(self) -> dict[str, Any]:
        from swarmd.swarm.manifest_update import ManifestInfo

        if self.manifest is None:
            return {}
        return {"manifest": ManifestInfo(
            version=self.manifest.version, key_fingerprint=self.manifest.fingerprint,
            started_version=self.started_version, restart_needed=self.restart_needed,
            pending_version=self.pending.version if self.pending is not None else None,
            ignored_total=self.ignored_total,
        )}

    def stopping(self, view: DaemonView) -> None:
        self._cancel()

    async def close(self) -> None:
        self._cancel()

    # --- following newer versions ----------------------------------------------------------------------

    def _found(self, newer, view: DaemonView, where: str) -> None:
        current = self.pending or self.manifest
        if newer.version <= current.version or newer.fingerprint != self.manifest.fingerprint:
            return
        self.pending = newer
        self._pending_epoch = view.snapshot().local_epoch
        logger.info("Found the run's manifest v%d (%s; this peer follows v%d): applying it at the next epoch boundary",
                    newer.version, where, self.manifest.version)

    def _apply(self, view: DaemonView, epoch: Optional[int]) -> None:
        from swarmd.swarm.manifest_update import decide

        newer, self.pending = self.pending, None
        decision = decide(self.started, self.applied, newer.config)
        applied, restart = [], list(decision.restart)
        for key, value in decision.live.items():
            try:
                applied.append(self._apply_live(view, key, value))
                _set(self.applied, key, copy.deepcopy(value))
            except Exception as e:  # noqa: BLE001 - a key that could not change live needs a restart
                logger.warning("The run's manifest v%d: %s could not change live (%s)", newer.version, key, e)
                restart.append(key)
        self.restart_needed = tuple(sorted(set(restart)))
        self.manifest = newer
        if self._publish_now is not None:
            self._publish_now.set()  # serve the newest version at once
        at = f"at epoch {epoch}" if epoch is not None else "at start"
        logger.info("Applied the run's manifest v%d %s%s", newer.version, at,
                    f": {'; '.join(applied)}" if applied else " (nothing that changes live)")
        if self.restart_needed:
            logger.warning("The run's manifest v%d changes %s since this peer started: restart this peer to apply "
                           "(restart needed; it trains on with the settings it started with)", newer.version,
                           ", ".join(self.restart_needed))

    def _apply_live(self, view: DaemonView, key: str, value: Any) -> str:
        if key == "network.allowed_peers":
            from swarmd.swarm import allowlist

            allow_list = allowlist.installed()
            if allow_list is None:
                raise RuntimeError("this peer runs no private swarm")
            before = allow_list.peers
            allow_list.publish(value)
            after = allow_list.peers
            return f"network.allowed_peers {len(after - {allow_list.own_peer_id})} peer(s) ({len(after - before)} " \
                   f"added, {len(before - after)} removed)"
        section, _, name = key.partition(".")
        if section != "swarm":
            raise RuntimeError("not a live key")
        before = _get(self.applied, key)
        view.retune({name: value})
        return f"{key} {before} -> {value}"

    def _read_stored(self, view: DaemonView) -> None:
        """The founder's stored manifest, replaced by `swarmd run update`: a newer version is published at once."""
        from swarmd.swarm.manifest import BadManifest, decode, stored_manifest_path

        seen = self._stored_stat(view.config)
        if seen == self._stored_seen:
            return
        self._stored_seen = seen
        try:
            stored = decode(stored_manifest_path(view.config.state_path, self.manifest.run_id).read_bytes(),
                            run_id=self.manifest.run_id)
        except (OSError, BadManifest) as e:
            logger.warning("The run's stored manifest cannot be read (%s); serving v%d", e, self.manifest.version)
            return
        self._found(stored, view, "signed by swarmd run update")
        if self.pending is stored and self._publish_now is not None:
            self._publish_now.set()

    def _stored_stat(self, config) -> Optional[tuple]:
        from swarmd.swarm.manifest import stored_manifest_path

        try:
            stat = stored_manifest_path(config.state_path, config.run_id).stat()
        except OSError:
            return None
        return stat.st_ino, stat.st_mtime_ns, stat.st_size

    # --- serving ---------------------------------------------------------------------------------------

    async def _serve_forever(self, view: DaemonView) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        next_publish = 0.0
        while True:
            try:
                if loop.time() >= next_publish or self._publish_now.is_set():
                    self._publish_now.clear()
                    await self._publish(view)
                    next_publish = loop.time() + self.interval
                await self._read(view)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - serving the manifest must not stop training
                failures += 1
                level = logging.WARNING if failures in (1, 10, 100) else logging.DEBUG
                logger.log(level, "The run's manifest: %r (failure %d in a row; retrying)", e, failures)
            try:
                await asyncio.wait_for(self._publish_now.wait(), self.poll_interval)
            except asyncio.TimeoutError:
                pass

    async def _publish(self, view: DaemonView) -> None:
        from swarmd.swarm.manifest_records import publish

        served = self.pending if self.pending is not None and self._founder else self.manifest
        for future in publish(view.dht, served, expiration=self.expiration):
            await asyncio.wait_for(future, self.dht_timeout)
        self.published_total += 1

    async def _read(self, view: DaemonView) -> None:
        from swarmd.swarm.manifest import choose
        from swarmd.swarm.manifest_records import describe_ignored, manifest_key
        from swarmd.swarm.peer_records import entries

        found = await asyncio.wait_for(
            view.dht.get(manifest_key(self.manifest.run_id), latest=True, return_future=True), self.dht_timeout)
        choice = choose(entries(found), self.manifest.run_id, self.manifest.fingerprint)
        ignored = choice.malformed + choice.other_key
        if ignored > self.ignored_total:
            logger.warning("Ignored manifest entries of run %s: %s", self.manifest.run_id, describe_ignored(choice))
        self.ignored_total = max(self.ignored_total, ignored)
        if choice.manifest is not None:
            self._found(choice.manifest, view, "in the swarm")

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


def _get(data: dict, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def manifest_publisher(config, envelope: Optional[bytes]) -> Optional[ManifestPublisher]:
    """A joiner's (it verified `envelope`) or the founder's (it holds the run's key in its state dir); else None."""
    from swarmd.swarm.manifest import run_key_path

    if envelope is not None or run_key_path(config.state_path, config.run_id).exists():
        return ManifestPublisher(envelope)
    return None
