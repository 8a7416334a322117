"""The dialer (swarmd/swarm/upstream/dialer.py) on a fake DHT node: it dials only the peers p2pd is not connected
to, with their recorded addresses, and answers why a dial failed instead of raising."""

import asyncio
import types

from hivemind.p2p import PeerID

from swarmd.swarm.upstream.dialer import connect_to

OWN, LINKED, MISSING, BROKEN = (PeerID.from_base58(p).to_base58() for p in (
    "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "QmW2XHoXMrKJ6AypvMUrkjk3kzcfNqmnAVkuzNYdMgDwsv",
    "QmNf18ogmP96PR3Jvo6WGNi4eznrVdjrrng1brNiUamVSQ", "QmXkooFAirDQNt27KX4b1XrnoKg9aDkt6ECLNRnWZkRs3u"))


def test_only_unconnected_peers_are_dialed_and_failures_are_answered():
    dialed = []

    async def connect(peer, maddrs):
        dialed.append((peer.to_base58(), [str(m) for m in maddrs]))
        if peer.to_base58() == BROKEN:
            raise ConnectionError("Connect failed. msg=dial backoff")

    async def list_peers():
        return [types.SimpleNamespace(peer_id=PeerID.from_base58(LINKED))]

    node = types.SimpleNamespace(p2p=types.SimpleNamespace(
        peer_id=PeerID.from_base58(OWN), list_peers=list_peers, _client=types.SimpleNamespace(connect=connect)))
    targets = {OWN: ["/ip4/198.18.0.1/tcp/1"], LINKED: ["/ip4/198.18.0.2/tcp/1"],
               MISSING: ["/ip4/198.18.0.3/tcp/31337", "/dns4/seed.example.org/tcp/31337"], BROKEN: ["/ip4/198.18.0.4/tcp/1"]}
    results = asyncio.run(connect_to(None, node, targets))
    assert results[OWN] == results[LINKED] == "already"
    assert results[MISSING] == "connected" and results[BROKEN] == "not connected: Connect failed. msg=dial backoff"
    assert sorted(dialed) == sorted([(MISSING, targets[MISSING]), (BROKEN, targets[BROKEN])])
