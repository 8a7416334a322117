"""`swarmd status --initial-peers MADDR --run-id ID`: the swarm seen from anywhere, without a local daemon.

Joins the DHT as a light client: client mode (it accepts no connections and stores nothing for others), no
optimizer and no progress tracker, so it publishes nothing and is not counted in the swarm's `num_peers`. It reads
the peers' signed records (swarm/peer_records.py) and hivemind's progress records, and builds a snapshot with the
keys the local views use (`mode: "remote"`; what only a local daemon knows is None).

This module imports hivemind (and so torch); a local `swarmd status` does not import it.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from swarmd import __version__
from swarmd.errors import ConfigError, StartupError, SwarmdError

__all__ = ["RemoteSwarm"]

logger = logging.getLogger(__name__)


class SwarmUnreadable(SwarmdError):
    """The DHT did not answer a read in time (the observer itself is fine)."""


class RemoteSwarm:
    """A light-client DHT reading one run. Use as a context manager: the DHT and its p2pd stop on exit."""

    def __init__(self, initial_peers: list[str], run_id: str, *, start_timeout: float = 60.0, read_timeout: float = 10.0):
        from swarmd.config.multiaddr import check_multiaddr

        if not initial_peers:
            raise ConfigError("--initial-peers is needed to watch a swarm remotely")
        try:
            self.initial_peers = [check_multiaddr(addr, require_peer_id=True) for addr in initial_peers]
        except ValueError as e:
            raise ConfigError(f"--initial-peers: {e}") from None
        self.run_id = run_id
        self.start_timeout = start_timeout
        self.read_timeout = read_timeout
        self.dht = None
        self.records = None
        self._progress_key = f"{run_id}_progress"
        self.started_at = time.time()

    def __enter__(self) -> "RemoteSwarm":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        with warnings.catch_warnings():  # torch's deprecation notices on import are not the operator's news
            warnings.simplefilter("ignore")
            import hivemind

        from swarmd.logs import route_hivemind_logs
        from swarmd.swarm.children import tie_children_to_this_process
        from swarmd.swarm.peer_records import PeerRecords, progress_validators

        route_hivemind_logs("error")
        tie_children_to_this_process()  # the DHT process and its p2pd die with this command, even on kill -9
        self.records = PeerRecords(self.run_id)
        validators = self.records.validators + progress_validators(self.run_id, self.records.signature)
        try:
            self.dht = hivemind.DHT(
                initial_peers=self.initial_peers,
                client_mode=True,
                host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                record_validators=validators,
                start=True,
                await_ready=False,
            )
            self.dht.wait_until_ready(self.start_timeout)
        except Exception as e:  # noqa: BLE001 - every start failure becomes one line
            self.close()
            raise _explain(e, self.initial_peers) from None

    def close(self) -> None:
        if self.dht is not None:
            dht, self.dht = self.dht, None
            try:
                dht.shutdown()
                dht.join(timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def snapshot(self) -> dict[str, Any]:
        """The swarm now, with the keys of the local snapshot (those only a daemon knows are None)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        from swarmd.status.snapshot import API_VERSION
        from swarmd.swarm.peer_records import common_target_batch_size, swarm_progress

        records_future = self.records.fetch(self.dht)
        progress_future = self.dht.get(self._progress_key, latest=True, return_future=True)
        try:
            records = records_future.result(self.read_timeout)
            progress = progress_future.result(self.read_timeout)
        except FutureTimeout:
            raise SwarmUnreadable(f"the DHT did not answer within {self.read_timeout:.0f} s") from None
        peers, rejected = self.records.parse(records)
        swarm = swarm_progress(progress, common_target_batch_size(peers))
        now = time.time()
        return {
            "api_version": API_VERSION,
            "mode": "remote",
            "swarmd_version": __version__,
            "run_id": self.run_id,
            "initial_peers": self.initial_peers,
            "observer_peer_id": str(self.dht.peer_id),
            "peer_id": None,
            "public_name": None,
            "state": "observing",
            "started_at": self.started_at,
            "uptime_seconds": round(now - self.started_at, 3),
            "local_epoch": None,
            **swarm,
            "peers": peers,
            "peer_records_rejected_total": rejected,
            "loss": None,
            "loss_history": [],
            "recent_averaging": [],
            "averaging": {},
        }


def _explain(error: BaseException, initial_peers: list[str]) -> StartupError:
    text = str(error)
    if "bootstrap" in text.lower() or "failed to connect" in text.lower():
        return StartupError(
            f"none of the initial peers answered ({', '.join(initial_peers)}): check the address (as a peer printed "
            "it in its `To join:` line) and that the peer is running and reachable from here"
        )
    if isinstance(error, TimeoutError) or type(error).__name__ == "TimeoutError":
        return StartupError("the DHT did not become ready in time; check the network and try again")
    first = text.splitlines()[0] if text else type(error).__name__
    return StartupError(f"could not join the DHT as an observer: {first}")


