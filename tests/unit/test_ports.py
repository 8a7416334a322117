"""Whether a TCP port is taken, as a second peer must know before p2pd (which sets SO_REUSEPORT) binds it too."""

import socket

import pytest

from swarmd.swarm.ports import listening_on, port_taken_by


def listener(host: str = "127.0.0.1", port: int = 0, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    if reuse_port:  # as p2pd (libp2p) listens: a second SO_REUSEPORT socket binds the same port without an error
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


def test_a_port_another_peer_listens_on_is_taken_on_its_address_and_on_the_wildcard():
    with listener(reuse_port=True) as held:
        port = held.getsockname()[1]
        with listener(port=port, reuse_port=True):  # what a second p2pd does: no error to catch
            pass
        assert "127.0.0.1" in listening_on(port)
        assert port_taken_by("127.0.0.1", port) == "127.0.0.1"
        assert port_taken_by("0.0.0.0", port) == "127.0.0.1"  # the default host_maddrs next to it
        assert port_taken_by("127.0.0.2", port) is None  # another address of the family, not a wildcard
        assert port_taken_by("::1", port) is None  # another family
        assert port_taken_by("127.0.0.1", 0) is None  # port 0: any free port, never taken


def test_a_wildcard_listener_takes_the_port_on_every_address():
    with listener("0.0.0.0") as held:
        port = held.getsockname()[1]
        assert port_taken_by("127.0.0.1", port) == "0.0.0.0"
        assert port_taken_by("0.0.0.0", port) == "0.0.0.0"


def test_ipv6_listeners_are_read_too():
    try:
        held = listener("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        port = held.getsockname()[1]
        assert port_taken_by("::1", port) == "::1" and port_taken_by("::", port) == "::1"
        assert port_taken_by("127.0.0.1", port) is None


def test_connections_of_a_peer_that_just_stopped_do_not_take_the_port():
    """TIME_WAIT after a restart: a probe bind would fail on it, the listening sockets say the port is free."""
    server = listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    server.close()
    assert port_taken_by("127.0.0.1", port) is None
    assert port_taken_by("0.0.0.0", port) is None
