"""Whether a TCP port is already listened on, from the kernel's tables of sockets (/proc/net/tcp and tcp6).

p2pd listens with SO_REUSEPORT, so a second peer on a port another peer holds binds it too: both run and print the
same address to join, and nothing fails. A probe bind would be fooled the other way, by connections of a peer that
has just stopped (TIME_WAIT). The listening sockets in the tables are what counts, whoever owns them (no privileges
needed), with a wildcard address (0.0.0.0, ::) on either side taking the port on every address of its family.
Where the tables do not exist (not Linux) nothing is reported. No torch or hivemind import.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["listening_on", "port_taken_by"]

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # TCP_LISTEN in the tables' `st` column


def listening_on(port: int, tables=_TABLES) -> list[str]:
    """The addresses of the sockets listening on TCP `port` (IPv4-mapped IPv6 ones as IPv4)."""
    return sorted({address for address, listening_port in _listeners(tables) if listening_port == port})


def port_taken_by(host: str, port: int, tables=_TABLES) -> Optional[str]:
    """The address of a socket already listening where binding (`host`, `port`) would: the same address, or a
    wildcard of the same family on either side. None when the port is free there; a port 0 (any free port) is never
    taken."""
    if port == 0:
        return None
    ours = ipaddress.ip_address(host)
    for text in listening_on(port, tables):
        theirs = ipaddress.ip_address(text)
        if theirs.version == ours.version and (theirs == ours or theirs.is_unspecified or ours.is_unspecified):
            return text
    return None


def _listeners(tables) -> Iterator[tuple[str, int]]:
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            yield _address(address), int(port, 16)


def _address(hexadecimal: str) -> str:
    """The tables write an address as 32-bit words in the host's byte order."""
    raw = b"".join(struct.pack("=I", int(hexadecimal[i:i + 8], 16)) for i in range(0, len(hexadecimal), 8))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)
