"""Whether a trainer takes the swarm's state before its first step: one model per swarm.

hivemind downloads state only when a peer is behind the swarm's epoch. Peers that start together at epoch 0 are
not behind anyone, so each would train its own model until the first parameter averaging. Here a trainer looks at
the peers that offer their state for download (hivemind's `<prefix>.all_averagers` record: peer -> priority, which
is the peer's local epoch, and swarmd's `<prefix>.client_donors` of clients behind NAT) and takes one's state when another trainer is ahead of it, or level with it and first in
peer-id order, so that of two peers starting together exactly one downloads, and a peer never goes back to an
older epoch than its own (e.g. one resumed from a checkpoint next to a fresh one).

A level peer whose parameters started from the very values this one did (both seeded by the run id at epoch 0,
swarmd/seeds.py, the usual case) has nothing to give but what this peer already holds: each peer's record says what
it started from (`start_values`, "<epoch>:<hash of the parameter values>", swarm/peer_records.py), and such a peer
does not count. That download is the parameters and the optimizer statistics, ~3x the model in fp32: on a 20 Mbit/s
link 45-60 s for a 9M-parameter model, during which the other peer trains alone and the downloader falls epochs
behind (docs/PERFORMANCE.md section 9).

Known gap: a peer decides once, before its first step. A first peer that comes LATER in peer-id order than a
second one starting a few seconds after it sees nothing on offer, keeps its own model, and the second, first in id
order, keeps its own too: with different start values, two models until the first parameter averaging.
"""

from __future__ import annotations

import logging
import time
from typing import Mapping

__all__ = ["start_values", "offered_states", "start_values_of_peers", "level_offers", "should_take_swarm_state"]

logger = logging.getLogger(__name__)


def start_values(model, epoch: int) -> str:
    """"<epoch>:<hash>" of a module's parameter values (names, shapes, dtypes and bytes, on the host)."""
    import torch

    from swarmd.swarm.digests import parameter_digest

    with torch.no_grad():
        return f"{int(epoch)}:{parameter_digest(model, values=True).hexdigest()[:40]}"


def offered_states(optimizer, timeout: float = 10.0) -> dict[str, float]:
    """Other peers offering their state: base58 peer id -> priority (their local epoch). {} if none or unreadable.
    Reachable peers (`all_averagers`) and clients that offer theirs through forwarders (`client_donors`,
    swarm/upstream/state_forward.py). In a private swarm, insiders only, and never a peer excluded on evidence
    (state_stream.state_offers)."""
    from swarmd.swarm.averager_keys import CLIENT_DONORS
    from swarmd.swarm.upstream.state_stream import state_offers

    averager = optimizer.state_averager
    offers = {}
    # both asked at once: each is a DHT lookup of its own, and start-up waits on them (issue 37)
    asked = {key: optimizer.dht.get(f"{averager.prefix}.{key}", latest=True, return_future=True)
             for key in ("all_averagers", CLIENT_DONORS)}
    for key, future in asked.items():
        try:
            found = future.result(timeout)
        except Exception as e:  # noqa: BLE001 - a slow DHT costs the start-up download, not the start
            logger.warning("Could not read which peers offer their state (%r): not downloading it", e)
            return {}
        offers.update(state_offers(found, averager.peer_id, averager._allow_list, getattr(averager, "_exclusions", None)))
    return {peer.to_base58(): priority for peer, priority in offers.items()}


def level_offers(own_epoch: int, own_peer_id: str, offers: Mapping[str, float]) -> list[str]:
    """The offering peers level with this one that come first in peer-id order: whose start values matter."""
    return sorted(peer for peer, epoch in offers.items() if epoch == own_epoch and peer < own_peer_id)


def start_values_of_peers(dht, run_id: str, peers: list[str], *, timeout: float) -> dict[str, str]:
    """The `start_values` that `peers` published in their records: peer -> value, for those that published one
    within `timeout` (records come every few seconds, the first one just as a peer starts to train)."""
    from swarmd.swarm.peer_records import PeerRecords

    records = PeerRecords(run_id)
    deadline = time.monotonic() + timeout
    found: dict[str, str] = {}
    while True:
        try:
            raw = records.fetch(dht).result(timeout)
            found = {peer["peer_id"]: peer["start_values"] for peer in records.parse(raw)[0] if peer["start_values"]}
        except Exception as e:  # noqa: BLE001 - unreadable records cost a download, not the start
            logger.debug("Could not read the peer records (%r)", e)
        if all(peer in found for peer in peers) or time.monotonic() >= deadline:
            return {peer: found[peer] for peer in peers if peer in found}
        time.sleep(0.5)


def should_take_swarm_state(
    own_epoch: int,
    own_peer_id: str,
    offers: Mapping[str, float],
    *,
    own_start: str = "",
    starts: Mapping[str, str] = {},  # noqa: B006 - read only
) -> bool:
    """True when another peer's state should replace this one's before training (see the module docstring):
    a peer ahead, or a level peer first in peer-id order that did not start from this peer's values `own_start`
    (`starts`: what the offering peers started from, as their records say; a peer missing there counts)."""
    if any(epoch > own_epoch for epoch in offers.values()):
        return True
    return any(not own_start or starts.get(peer) != own_start for peer in level_offers(own_epoch, own_peer_id, offers))
