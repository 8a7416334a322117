"""A light syntax check for libp2p multiaddrs.

hivemind has a full parser (hivemind.utils.multiaddr), but importing it imports hivemind and therefore torch,
which would make `swarmd config validate` take seconds. This check covers the address forms a swarm uses
(ip4/ip6/dns + tcp/udp + optional quic and p2p id) so a typo is caught with a clear message; the daemon still
parses the address with hivemind's parser before using it.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["check_multiaddr"]

_BASE58 = re.compile(r"^[1-9A-HJ-NP-Za-km-z]+$")
_HOST_PROTOCOLS = {"ip4", "ip6", "dns", "dns4", "dns6"}
_PORT_PROTOCOLS = {"tcp", "udp"}
_FLAG_PROTOCOLS = {"quic", "quic-v1", "ws", "wss", "p2p-circuit"}


def check_multiaddr(text: str, *, require_peer_id: bool = False) -> str:
    """Return `text` if it is a well-formed multiaddr, else raise ValueError saying what is wrong."""
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not a multiaddr: it must start with '/', e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...")
    parts = text.split("/")[1:]
    if not parts or parts[-1] == "":
        raise ValueError(f"{text!r} is not a multiaddr: it ends with '/'")
    seen_peer_id = False
    i = 0
    while i < len(parts):
        proto = parts[i]
        if proto in _FLAG_PROTOCOLS:
            i += 1
            continue
        if i + 1 >= len(parts):
            raise ValueError(f"{text!r} is not a multiaddr: '/{proto}' needs a value after it")
        value = parts[i + 1]
        if proto == "ip4":
            _check_ip(text, value, ipaddress.IPv4Address, "IPv4")
        elif proto == "ip6":
            _check_ip(text, value, ipaddress.IPv6Address, "IPv6")
        elif proto in _HOST_PROTOCOLS:
            if not value:
                raise ValueError(f"{text!r} is not a multiaddr: empty host name after /{proto}")
        elif proto in _PORT_PROTOCOLS:
            if not value.isdigit() or not 0 <= int(value) <= 65535:
                raise ValueError(f"{text!r} is not a multiaddr: port {value!r} is not a number in 0..65535")
        elif proto in ("p2p", "ipfs"):
            if not _BASE58.match(value) or len(value) < 32:
                raise ValueError(f"{text!r} is not a multiaddr: {value!r} is not a base58 peer id")
            _check_whole_peer_id(text, value)
            seen_peer_id = True
        else:
            raise ValueError(f"{text!r} is not a multiaddr: unknown protocol '/{proto}'")
        i += 2
    if parts[0] not in _HOST_PROTOCOLS and parts[0] not in ("p2p", "ipfs"):
        raise ValueError(f"{text!r} is not a multiaddr: it must begin with /ip4, /ip6 or /dns")
    if require_peer_id and not seen_peer_id:
        raise ValueError(
            f"{text!r} has no peer id: an initial peer must end with /p2p/<peer id>; copy the whole "
            "address that the first peer printed"
        )
    return text


def _check_whole_peer_id(text: str, value: str) -> None:
    """A peer id cut short (a wrapped line pasted in part) still looks like base58; hivemind only fails on it after
    its DHT's start-up timeout, with "Inconsistent multihash length". Its multihash says how long it must be."""
    from swarmd.config.peer_list import check_peer_id

    try:
        check_peer_id(value)
    except ValueError:
        raise ValueError(
            f"{text!r}: the peer id {value!r} is cut short or mistyped ({len(value)} characters; a whole one has 46 "
            "and starts with Qm, or 52 with 12D3KooW): copy the whole address from the peer's `To join:` line"
        ) from None


def _check_ip(text: str, value: str, cls: type, family: str) -> None:
    try:
        cls(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a multiaddr: {value!r} is not an {family} address") from None
