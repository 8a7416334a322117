import pytest

from swarmd.config.multiaddr import check_multiaddr

ID = "QmTHaX7imb5woUpi9SPeMv2xryqqAscAruYiyV3SNkQxQN"


@pytest.mark.parametrize(
    "addr",
    [
        f"/ip4/127.0.0.1/tcp/31337/p2p/{ID}",
        "/ip4/0.0.0.0/tcp/0",
        f"/ip6/::1/tcp/31337/p2p/{ID}",
        f"/dns/peer.example.org/tcp/31337/p2p/{ID}",
        f"/ip4/1.2.3.4/udp/31337/quic/p2p/{ID}",
    ],
)
def test_accepts(addr):
    assert check_multiaddr(addr) == addr


@pytest.mark.parametrize(
    "addr, message",
    [
        ("127.0.0.1:31337", "must start with '/'"),
        ("/ip4/127.0.0.1/tcp/", "ends with '/'"),
        ("/ip4/300.1.1.1/tcp/1", "not an IPv4 address"),
        ("/ip4/1.1.1.1/tcp/70000", "not a number in 0..65535"),
        ("/ip4/1.1.1.1/tcp/1/p2p/0OIl", "not a base58 peer id"),
        ("/ip4/1.1.1.1/sctp/1", "unknown protocol '/sctp'"),
        ("/tcp/1/ip4/1.1.1.1", "must begin with /ip4"),
        ("/ip4", "needs a value"),
    ],
)
def test_rejects(addr, message):
    with pytest.raises(ValueError, match=message):
        check_multiaddr(addr)


def test_initial_peer_needs_a_peer_id():
    with pytest.raises(ValueError, match="no peer id"):
        check_multiaddr("/ip4/1.2.3.4/tcp/31337", require_peer_id=True)


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_a_peer_id_cut_short_is_refused_with_the_fix(cut):
    """A wrapped `To join:` line pasted in part: hivemind would fail on it only after its start-up timeout."""
    with pytest.raises(ValueError, match="cut short or mistyped .*copy the whole address from the peer's `To join:` line"):
        check_multiaddr(f"/ip4/127.0.0.1/tcp/31337/p2p/{ID[:-cut]}", require_peer_id=True)
