"""A private swarm (`network.allowed_peers`): the extension that sets the gates up and reloads the list on SIGHUP.

At start, before the DHT and the averagers exist (they are forked from this process and inherit what it sets):
this peer's identity key becomes hivemind's signing key (swarm/upstream/identity.py), the list is published to the state dir
and installed as the process's allow list (swarm/allowlist.py), and the DHT gets the record validator
(swarm/upstream/record_gate.py); the averagers' handlers check the installed list (swarm/upstream/averager_gate.py). Anything that
fails here stops the daemon with a config error: a private swarm must never fall back to an open one.

On SIGHUP the list is read again (a file setting; an inline list stays as it is) and published; a list that no
longer reads is logged and the previous one kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from swarmd.config.peer_list import AllowListError, read_allowed_peers
from swarmd.extension import DaemonView, Extension
from swarmd.errors import ConfigError

__all__ = ["ACTIVE_LIST_FILE", "PrivateSwarm", "PrivateSwarmInfo"]

logger = logging.getLogger("swarmd.private")

ACTIVE_LIST_FILE = "allowed_peers.active"  # in the state dir: the list every process of this peer reads


@dataclass(frozen=True)
class PrivateSwarmInfo:
    """What the status shows of a private swarm (the snapshot's `private`; None in an open swarm)."""

    allowed_peers: int  # peer ids on the list besides this peer
    refusals: dict = field(default_factory=dict)  # {where (swarm/allowlist.py WHERE): requests and records refused}


class PrivateSwarm(Extension):
    def __init__(self, setting):
        self.setting = setting  # network.allowed_peers: a list of peer ids, or a file's path
        self.allow_list = None  # swarm/allowlist.py AllowList, once started
        self._validator = None

    async def start(self, view: DaemonView) -> None:
        from swarmd.swarm import allowlist
        from swarmd.swarm.dht import IDENTITY_FILE
        from swarmd.swarm.upstream.identity import load_or_create_identity
        from swarmd.swarm.upstream.record_gate import AllowListValidator

        config = view.config
        peers = self._read()
        try:
            own_peer_id = load_or_create_identity(config.state_path / IDENTITY_FILE)
        except (OSError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"network.allowed_peers: this peer's identity cannot be used to sign its records ({e})"
            ) from None
        self.allow_list = allowlist.AllowList(config.state_path / ACTIVE_LIST_FILE, own_peer_id)
        self.allow_list.start(peers)
        allowlist.install(self.allow_list)
        self._validator = AllowListValidator(config.run_id, self.allow_list)
        source = f" (from {self.setting}; SIGHUP reads it again)" if isinstance(self.setting, str) else ""
        logger.info("A private swarm: %d peer(s) besides this one (%s) may take part%s",
                    len(peers - {own_peer_id}), own_peer_id, source)

    def record_validators(self, view: DaemonView) -> list[Any]:
        return [self._validator] if self._validator is not None else []

    def reload(self, view: DaemonView) -> None:
        if self.allow_list is None:
            return
        if not isinstance(self.setting, str):
            logger.info("SIGHUP: network.allowed_peers is a list in the config, not a file: nothing to read again")
            return
        try:
            peers = read_allowed_peers(self.setting)
        except AllowListError as e:
            logger.error("SIGHUP: network.allowed_peers: %s; keeping the previous list", e)
            return
        before = self.allow_list.peers
        self.allow_list.publish(peers)
        after = self.allow_list.peers
        logger.info("SIGHUP: network.allowed_peers read again: %d peer(s) (%d added, %d removed)",
                    len(after - {self.allow_list.own_peer_id}), len(after - before), len(before - after))

    def snapshot_fields(self) -> dict[str, Any]:
        return {"private": self.info()} if self.allow_list is not None else {}

    def info(self) -> PrivateSwarmInfo:
        return PrivateSwarmInfo(
            allowed_peers=len(self.allow_list.peers - {self.allow_list.own_peer_id}),
            refusals=self.allow_list.refusals(),
        )

    def _read(self) -> frozenset:
        try:
            return read_allowed_peers(self.setting)
        except AllowListError as e:
            raise ConfigError(f"config error: network.allowed_peers: {e}") from None


def private_swarm(network) -> Optional[PrivateSwarm]:
    """The extension for `network.allowed_peers`, or None for an open swarm."""
    return PrivateSwarm(network.allowed_peers) if network.allowed_peers is not None else None
