"""The dial-back check: which addresses a peer asks about, and what counts as a libp2p endpoint answering."""

import asyncio
import socket

import pytest

from swarmd.swarm.reachability import addresses_to_check, dial_libp2p, tcp_endpoint, unreachable_advice

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
