"""The dial-back check: which addresses a peer asks about, and what counts as a libp2p endpoint answering."""

import asyncio
import socket
import time

import pytest

from swarmd.swarm.reachability import (
    addresses_to_check,
    dial_libp2p,
    reachable_line,
    tcp_endpoint,
    unreachable_advice,
)

PEER = "/p2p/QmcPoL57BiCWeRTZg83a8SHk2wNEUVgM3i2ZbVjrCLyEci"


def test_tcp_endpoints_of_multiaddrs():
    assert tcp_endpoint("/ip4/198.18.0.1/tcp/31337" + PEER) == ("198.18.0.1", 31337)
    assert tcp_endpoint("/dns4/peer.example.org/tcp/4001") == ("peer.example.org", 4001)
    assert tcp_endpoint("/ip6/::1/tcp/4001") == ("::1", 4001)
    assert tcp_endpoint("/ip4/198.18.0.1/udp/4001/quic") is None
    assert tcp_endpoint("/ip4/198.18.0.1/tcp/4001/p2p/QmRelay/p2p-circuit") is None


def test_public_addresses_are_checked_first_and_loopback_only_alone():
    visible = ["/ip4/127.0.0.1/tcp/4001" + PEER, "/ip4/192.168.1.5/tcp/4001" + PEER, "/ip4/198.18.0.7/tcp/4001" + PEER]
    assert addresses_to_check(visible) == ["/ip4/198.18.0.7/tcp/4001"]
    assert addresses_to_check(visible[:2]) == ["/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.5/tcp/4001"]
    assert addresses_to_check(["/ip4/198.18.0.1/udp/1/quic"]) == []


def test_carrier_grade_nat_link_local_and_unique_local_addresses_are_local_too():
    visible = ["/ip4/100.72.3.4/tcp/4001", "/ip4/169.254.9.9/tcp/4001", "/ip6/fd12:3456::1/tcp/4001",
               "/ip6/fe80::1/tcp/4001", "/ip4/172.20.0.2/tcp/4001"]
    assert addresses_to_check(visible + ["/ip4/198.18.0.7/tcp/4001"]) == ["/ip4/198.18.0.7/tcp/4001"]
    assert addresses_to_check(visible) == visible[:4]  # none other: all of them, at most MAX_ADDRESSES


def test_a_peer_dialed_back_only_at_private_addresses_is_told_it_is_reachable_on_its_network_only():
    lan = reachable_line(["/ip4/192.168.1.5/tcp/31337"])
    assert lan.startswith("Reachable on its own network only") and "--announce-maddrs" in lan
    assert reachable_line(["/ip4/198.18.0.7/tcp/31337"]) == (
        "Reachable: a peer in the swarm dialed this one back at /ip4/198.18.0.7/tcp/31337")
    assert reachable_line(["/ip4/127.0.0.1/tcp/31337"]).startswith("Reachable: a peer")  # one machine's swarm


def test_the_advice_is_numbered_and_names_the_port():
    advice = unreachable_advice(["/ip4/198.18.0.7/tcp/31337"])
    assert "NOT reachable at /ip4/198.18.0.7/tcp/31337" in advice
    for step in ("1. open TCP port 31337", "2. behind NAT, announce", "3. or join with --client-mode", "4. "):
        assert step in advice


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_only_a_libp2p_endpoint_counts_as_reachable():
    hivemind = pytest.importorskip("hivemind")
    dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        host, port = tcp_endpoint(str(dht.get_visible_maddrs()[0]))

        async def not_libp2p(reader, writer):
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
            await writer.drain()
            writer.close()

        async def dial_all():
            other = await asyncio.start_server(not_libp2p, "127.0.0.1", 0)
            other_port = other.sockets[0].getsockname()[1]
            async with other:
                return await asyncio.gather(
                    dial_libp2p(host, port), dial_libp2p("127.0.0.1", _closed_port()), dial_libp2p("127.0.0.1", other_port)
                )

        assert asyncio.run(dial_all()) == [True, False, False]
    finally:
        dht.shutdown()


def test_the_mode_says_how_other_peers_reach_this_one():
    from swarmd.swarm.reachability import reachability_mode

    assert reachability_mode("unknown", True, ()) == "client"
    assert reachability_mode("no", True, ()) == "client"
    assert reachability_mode("yes", False, ()) == "direct"
    assert reachability_mode("no", False, ["/ip4/198.18.0.1/tcp/4001/p2p/QmRelay/p2p-circuit" + PEER]) == "relay"
    assert reachability_mode("no", False, ["/ip4/198.19.0.2/tcp/4001" + PEER]) == "unreachable"
    assert reachability_mode("unknown", False, ()) == "unknown"


def test_a_peer_behind_nat_is_told_in_one_line():
    from swarmd.swarm.reachability import client_line, unreachable_line

    client = client_line(["/ip4/198.19.0.2/tcp/31337"])
    assert "\n" not in client and "joins as a client" in client and "trains normally" in client
    warning = unreachable_line(["/ip4/198.19.0.2/tcp/31337"])
    assert "\n" not in warning and "--client-mode" in warning and "TCP port 31337" in warning


def _network(**fields):
    from swarmd.config.schema import NetworkConfig

    return NetworkConfig(**{"initial_peers": ["/ip4/198.18.0.1/tcp/31337" + PEER], **fields})


@pytest.mark.parametrize(
    "fields, probed, expected",
    [
        ({}, "no", True),  # nobody could dial it back: a client
        ({}, "yes", False),
        ({}, "unknown", False),  # plain hivemind initial peers, a private swarm: as configured
        ({"client_mode": True}, None, True),  # told: no probe
        ({"announce_maddrs": ["/ip4/198.18.0.9/tcp/31337"]}, None, False),  # a port forward: no probe
        ({"initial_peers": []}, None, False),  # a new swarm: nobody to ask
    ],
)
def test_a_peer_not_told_how_it_is_reached_joins_as_a_client_when_nobody_can_dial_it(monkeypatch, fields, probed,
                                                                                       expected):
    from swarmd.swarm import dht, reachability

    asked = []

    async def probe(initial_peers, host_maddrs):
        asked.append(initial_peers)
        return probed, ["/ip4/198.19.0.2/tcp/31337"]

    monkeypatch.setattr(reachability, "probe_before_joining", probe)
    assert asyncio.run(dht._joins_as_client(_network(**fields))) is expected
    assert bool(asked) == (probed is not None)


def test_a_client_gives_its_initial_peers_as_the_join_line():
    from swarmd.swarm.dht import join_addresses

    mine = ["/ip4/127.0.0.1/tcp/31337" + PEER, "/ip4/198.19.0.2/tcp/31337" + PEER]
    seed = ["/ip4/198.18.0.1/tcp/31337/p2p/QmSeed"]
    assert join_addresses(mine, False, seed) == mine[1:]
    assert join_addresses(mine, True, seed) == seed
    assert join_addresses(mine, True, []) == mine[1:]


def test_the_probe_of_a_peer_nobody_answers_is_unknown_within_its_bound():
    """No initial peer answers (a closed port): unknown, and the join goes on as configured."""
    from swarmd.swarm.reachability import PROBE_TIMEOUT, probe_before_joining

    closed = _closed_port()
    started = time.monotonic()
    state, _ = asyncio.run(probe_before_joining([f"/ip4/127.0.0.1/tcp/{closed}" + PEER], ["/ip4/127.0.0.1/tcp/0"]))
    assert state == "unknown"
    assert time.monotonic() - started < PROBE_TIMEOUT + 10
