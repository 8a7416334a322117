"""Whether a trainer takes the swarm's state before its first step: one model per swarm.

hivemind downloads state only when a peer is behind the swarm's epoch. Peers that start together at epoch 0 are
not behind anyone, so each would train its own model until the first parameter averaging. Here a trainer looks at
the peers that offer their state for download (hivemind's `<prefix>.all_averagers` record: peer -> priority, which
is the peer's local epoch) and takes one's state when another trainer is ahead of it, or level with it and first in
peer-id order, so that of two peers starting together exactly one downloads, and a peer never goes back to an
older epoch than its own (e.g. one resumed from a checkpoint next to a fresh one).
"""

from __future__ import annotations

import logging

__all__ = ["offered_states", "should_take_swarm_state"]

logger = logging.getLogger(__name__)


def offered_states(optimizer, timeout: float = 10.0) -> dict[str, float]:
    """Other peers offering their state: base58 peer id -> priority (their local epoch). {} if none or unreadable."""
    from hivemind.p2p import PeerID
    from hivemind.utils import ValueWithExpiration

    averager = optimizer.state_averager
    try:
        found = optimizer.dht.get(f"{averager.prefix}.all_averagers", latest=True, return_future=True).result(timeout)
    except Exception as e:  # noqa: BLE001 - a slow DHT costs the start-up download, not the start
        logger.warning("Could not read which peers offer their state (%r): not downloading it", e)
        return {}
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return {}
    own = averager.peer_id
    offers = {}
    for subkey, entry in found.value.items():
        priority = entry.value if isinstance(entry, ValueWithExpiration) else None
        if not isinstance(priority, (int, float)) or isinstance(priority, bool):
            continue  # None: a peer that stopped sharing
        try:
            peer = PeerID(subkey)
        except Exception:  # noqa: BLE001 - a malformed record is not a peer
            continue
        if peer != own:
            offers[peer.to_base58()] = float(priority)
    return offers


def should_take_swarm_state(own_epoch: int, own_peer_id: str, offers: dict[str, float]) -> bool:
    """True when another peer's state should replace this one's before training (see the module docstring)."""
    return any(epoch > own_epoch or (epoch == own_epoch and peer < own_peer_id) for peer, epoch in offers.items())
