"""Dial the swarm's recorded peers this one is not connected to (swarm/address_records.py says why).

Runs in hivemind's DHT process (`DHT.run_coroutine`), where the DHT's P2P lives: p2pd's `connect` with the recorded
addresses (hivemind's P2P has no public call for it: its private `_client`, fenced in
tests/unit/test_hivemind_contract.py). Once connected, p2pd knows where the peer is, and every later stream to it
(matchmaking, all-reduce parts, state downloads) goes over that connection.
"""

from __future__ import annotations

import asyncio
import logging

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

__all__ = ["connect_to", "DIAL_TIMEOUT"]

logger = logging.getLogger(__name__)

DIAL_TIMEOUT = 5.0  # seconds for one peer's addresses; dials run together


async def connect_to(_dht, node, targets: dict[str, list[str]]) -> dict[str, str]:
    """Connect the DHT's p2pd to each of `targets` (peer id -> addresses) that it is not connected to yet:
    peer id -> "connected", "already", or why not."""
    connected = {info.peer_id.to_base58() for info in await node.p2p.list_peers()}
    own = node.p2p.peer_id.to_base58()

    async def dial(peer_id: str, maddrs: list[str]) -> str:
        if peer_id in connected or peer_id == own:
            return "already"
        try:
            await asyncio.wait_for(
                node.p2p._client.connect(PeerID.from_base58(peer_id), [Multiaddr(m) for m in maddrs]), DIAL_TIMEOUT)
            return "connected"
        except Exception as e:  # noqa: BLE001 - the reason is the answer
            return f"not connected: {str(e).splitlines()[-1][:160] if str(e) else repr(e)}"

    results = await asyncio.gather(*(dial(peer, maddrs) for peer, maddrs in targets.items()))
    return dict(zip(targets, results))
