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

from swarmd.errors import ConfigError, SwarmdError
from swarmd.status.snapshot import Snapshot

__all__ = ["RemoteSwarm"]

logger = logging.getLogger(__name__)


class SwarmUnreadable(SwarmdError):
    """The DHT did not answer a read in time (the observer itself is fine)."""


class RemoteSwarm:
    """A light-client DHT reading one run. Use as a context manager: the DHT and its p2pd stop on exit."""

    def __init__(self, initial_peers: list[str], run_id: str, *, read_timeout: float = 10.0):
        from swarmd.config.multiaddr import check_multiaddr

        if not initial_peers:
            raise ConfigError("--initial-peers is needed to watch a swarm remotely")
        try:
            self.initial_peers = [check_multiaddr(addr, require_peer_id=True) for addr in initial_peers]
        except ValueError as e:
            raise ConfigError(f"--initial-peers: {e}") from None
        self.run_id = run_id
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
            import hivemind  # noqa: F401

        from swarmd.logs import route_hivemind_logs
        from swarmd.swarm.children import tie_children_to_this_process
        from swarmd.swarm.dht import start_observer_dht
        from swarmd.swarm.peer_records import PeerRecords
        from swarmd.swarm.progress_records import progress_validators

        route_hivemind_logs("error")
        tie_children_to_this_process()  # the DHT process and its p2pd die with this command, even on kill -9
        self.records = PeerRecords(self.run_id)
        from swarmd.swarm.round_records import RoundRecords

        self.round_records = RoundRecords(self.run_id)
        from swarmd.swarm.manifest_records import ManifestValidator

        validators = [*self.records.validators, *self.round_records.validators,
                      *progress_validators(self.run_id, self.records.signature),
                      ManifestValidator(self.run_id, None)]
        self.dht = start_observer_dht(self.initial_peers, record_validators=validators)

    def close(self) -> None:
        from swarmd.swarm.dht import stop_dht

        if self.dht is not None:
            dht, self.dht = self.dht, None
            stop_dht(dht)

    def snapshot(self) -> Snapshot:
        """The swarm now, as a Snapshot in remote mode (what only a local daemon knows is left unset)."""
        from concurrent.futures import TimeoutError as FutureTimeout

        from swarmd.swarm.peer_records import common_target_batch_size
        from swarmd.swarm.progress_records import swarm_progress
        from swarmd.swarm.round_records import parse_round_records

        from swarmd.swarm.manifest_records import manifest_key

        records_future = self.records.fetch(self.dht)
        progress_future = self.dht.get(self._progress_key, latest=True, return_future=True)
        manifest_future = self.dht.get(manifest_key(self.run_id), latest=True, return_future=True)
        rounds_future = self.round_records.fetch(self.dht)
        try:
            records = records_future.result(self.read_timeout)
            rounds = rounds_future.result(self.read_timeout)
            progress = progress_future.result(self.read_timeout)
            manifests = manifest_future.result(self.read_timeout)
        except FutureTimeout:
            raise SwarmUnreadable(f"the DHT did not answer within {self.read_timeout:.0f} s") from None
        peers, rejected = self.records.parse(records)
        swarm_rounds, rounds_rejected = parse_round_records(rounds)
        known = {peer["peer_id"] for peer in peers}
        swarm = swarm_progress(progress, common_target_batch_size(peers))
        return Snapshot(
            mode="remote",
            run_id=self.run_id,
            initial_peers=tuple(self.initial_peers),
            observer_peer_id=str(self.dht.peer_id),
            state="observing",
            phase="observing",
            client_mode=True,
            started_at=self.started_at,
            uptime_seconds=round(time.time() - self.started_at, 3),
            peers=tuple(peers),
            peer_records_rejected_total=rejected + rounds_rejected,
            swarm_rounds=tuple(record for record in swarm_rounds if record["peer_id"] in known),
            manifest=_manifest_info(manifests, self.run_id),
            **swarm,
        )


def _manifest_info(found, run_id: str):
    """The newest manifest the swarm serves for the run, if exactly one key signs it (an observer pins none)."""
    from swarmd.swarm.manifest import choose
    from swarmd.swarm.manifest_update import ManifestInfo
    from swarmd.swarm.peer_records import entries

    choice = choose(entries(found), run_id, None)
    if choice.manifest is None:
        return None
    return ManifestInfo(version=choice.manifest.version, key_fingerprint=choice.manifest.fingerprint,
                        started_version=choice.manifest.version, ignored_total=choice.malformed)
