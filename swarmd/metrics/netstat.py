"""Bytes a set of processes moved over TCP, from the kernel's per-socket counters (Linux sock_diag).

hivemind exposes no traffic counters, and its p2pd is started without libp2p's metrics endpoint (hivemind's
`P2P.create` has no way to pass `-metricsAddr`). But every byte a peer sends or receives - DHT, averaging, state
downloads; the averagers reach the network through the DHT's p2pd - goes through TCP sockets that p2pd owns. The
kernel keeps `tcpi_bytes_acked` and `tcpi_bytes_received` for each TCP socket (what `ss -ti` shows); we ask for
them over a NETLINK_SOCK_DIAG socket (no privileges needed for one's own sockets) and keep the sockets whose inodes
the given processes hold open (/proc/PID/fd).

The counts are TCP payload: libp2p framing and encryption included, TCP/IP headers and retransmissions excluded.
A socket's bytes stay counted after it closes (the last reading is kept), except what it moved between the last
reading and its close. QUIC/UDP is not counted (hivemind listens on TCP unless told otherwise).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Iterable, Optional

__all__ = ["TcpTraffic", "P2pdProcesses", "tcp_bytes_by_inode", "socket_inodes"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_ALL_TCP_STATES = 0xFFFFFFFF
_NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_INET_DIAG_REQ_V2 = struct.Struct("=BBBxI48x")  # family, protocol, extensions, pad, states, inet_diag_sockid
_INET_DIAG_MSG_SIZE = 72  # family, state, timer, retrans, sockid (48), expires, rqueue, wqueue, uid, inode
_INODE_OFFSET = 68
_RTA_HEADER = struct.Struct("=HH")
_TCP_INFO_BYTES = struct.Struct("=QQ")  # tcpi_bytes_acked, tcpi_bytes_received
_TCP_INFO_BYTES_OFFSET = 120


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """Inodes of the sockets these processes hold open (processes that vanished are skipped)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def tcp_bytes_by_inode() -> dict[int, tuple[int, int]]:
    """{socket inode: (bytes sent and acknowledged, bytes received)} for every TCP socket the kernel reports."""
    result: dict[int, tuple[int, int]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            payload = _INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), _ALL_TCP_STATES)
            header = _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(payload), _SOCK_DIAG_BY_FAMILY,
                                        _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
            sock.send(header + payload)
            _read_dump(sock, result)
    return result


def _read_dump(sock: socket.socket, result: dict[int, tuple[int, int]]) -> None:
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
            if length < _NLMSG_HEADER.size:
                return
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                (errno,) = struct.unpack_from("=i", data, offset + _NLMSG_HEADER.size)
                raise OSError(-errno, f"sock_diag: {os.strerror(-errno)}")
            if kind == _SOCK_DIAG_BY_FAMILY:
                _parse_socket(data[offset + _NLMSG_HEADER.size:offset + length], result)
            offset += (length + 3) & ~3


def _parse_socket(message: bytes, result: dict[int, tuple[int, int]]) -> None:
    if len(message) < _INET_DIAG_MSG_SIZE:
        return
    (inode,) = struct.unpack_from("=I", message, _INODE_OFFSET)
    offset = _INET_DIAG_MSG_SIZE
    while offset + _RTA_HEADER.size <= len(message):
        length, kind = _RTA_HEADER.unpack_from(message, offset)
        if length < _RTA_HEADER.size:
            return
        if kind == _INET_DIAG_INFO and length - _RTA_HEADER.size >= _TCP_INFO_BYTES_OFFSET + _TCP_INFO_BYTES.size:
            result[inode] = _TCP_INFO_BYTES.unpack_from(message, offset + _RTA_HEADER.size + _TCP_INFO_BYTES_OFFSET)
            return
        offset += (length + 3) & ~3


class TcpTraffic:
    """Monotonic totals of TCP bytes sent/received by the processes `pids()` names, updated on each `read()`.

    Thread-safe (scrapes may overlap). `read()` returns None where the kernel refuses sock_diag.
    """

    def __init__(self, pids):
        self._pids = pids
        self._lock = threading.Lock()
        self._open: dict[int, tuple[int, int]] = {}  # inode -> last reading of a socket still open
        self._closed_sent = 0
        self._closed_received = 0

    def read(self) -> Optional[tuple[int, int]]:
        with self._lock:
            inodes = socket_inodes(self._pids())
            try:
                counters = tcp_bytes_by_inode()
            except OSError:
                return None
            current = {inode: counters[inode] for inode in inodes if inode in counters}
            for inode, (sent, received) in self._open.items():
                now = current.get(inode)
                if now is None or now[0] < sent or now[1] < received:
                    # closed (or its inode reused) since the last reading: keep what it had moved by then
                    self._closed_sent += sent
                    self._closed_received += received
            self._open = current
            sent = self._closed_sent + sum(value[0] for value in current.values())
            received = self._closed_received + sum(value[1] for value in current.values())
            return sent, received


class P2pdProcesses:
    """The p2pd processes below `root` (default: this process), as a callable for TcpTraffic.

    That is the DHT's p2pd, which the averagers reach the network through too. The process tree is scanned again
    only when a remembered p2pd is gone, or every `refresh` seconds (p2pd starts after the metrics endpoint).
    """

    def __init__(self, root: Optional[int] = None, refresh: float = 10.0):
        self._root = root if root is not None else os.getpid()
        self._refresh = refresh
        self._pids: list[int] = []
        self._found_at = float("-inf")

    def __call__(self) -> list[int]:
        now = time.monotonic()
        gone = any(not os.path.exists(f"/proc/{pid}") for pid in self._pids)
        if gone or (not self._pids and now - self._found_at > 1.0) or now - self._found_at > self._refresh:
            self._pids = self._scan()
            self._found_at = now
        return list(self._pids)

    def _scan(self) -> list[int]:
        from swarmd.swarm.children import descendant_pids

        found = []
        for pid in descendant_pids(self._root):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == "p2pd":
                        found.append(pid)
            except OSError:
                continue
        return found
