"""Links like the internet on one machine: Linux network namespaces joined by a bridge, rate-limited with tbf.

Each peer gets its own namespace with one veth whose other end sits on a bridge in a namespace of its own, so
nothing is added to the root namespace but for a moment while a veth pair is created and moved. Each peer's link
is limited both ways: tbf on the veth inside the peer's namespace shapes what it sends (upload), tbf on the
bridge-side veth shapes what it receives (download). This kernel has tbf but not netem: bandwidth, no added delay.

Addresses come only from 198.18.0.0/15 (RFC 2544, reserved for benchmarking) and nothing routes out of the
namespaces. Every name starts with swd-<pid>-, so that `cleanup_leftovers()` can remove what a crashed earlier
run left behind (namespaces whose pid is gone) without touching a run in progress. Deleting a namespace removes
its interfaces, their qdiscs and the bridge with it. Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, TypeVar

__all__ = [
    "NAME_PREFIX", "SUBNET", "Lab", "TornDownOnExit", "tbf_settings", "tbf_args", "cleanup_leftovers", "leftovers",
    "in_namespace", "is_root",
]

NAME_PREFIX = "swd-"
SUBNET = "198.18.0"  # /24 inside 198.18.0.0/15; peer i is 198.18.0.(i+1)
_LEFTOVER = re.compile(rf"^{NAME_PREFIX}(\d+)-")
_CLONE_NEWNET = 0x40000000
_TBF_LATENCY_MS = 50  # queue length in time; a short queue drops bursts and TCP then under-fills the link
_TBF_TIMER_SECONDS = 0.004  # the bucket must cover a timer tick's worth of traffic (HZ 250) or the rate sags
_TBF_MIN_BURST = 64 * 1024  # at least one GSO super-packet, so veth offloads never meet a too-small bucket

T = TypeVar("T")


def is_root() -> bool:
    return os.geteuid() == 0


def tbf_settings(rate_mbit: float) -> tuple[int, int]:
    """(burst bytes, latency ms) of a tbf qdisc that holds `rate_mbit` megabits per second."""
    if rate_mbit <= 0:
        raise ValueError(f"a link rate must be positive, not {rate_mbit}")
    rate_bytes = rate_mbit * 1e6 / 8
    return max(_TBF_MIN_BURST, int(rate_bytes * _TBF_TIMER_SECONDS)), _TBF_LATENCY_MS


def tbf_args(rate_mbit: float) -> list[str]:
    """The `tc qdisc replace dev DEV root` tail for one direction of a link."""
    burst, latency = tbf_settings(rate_mbit)
    return ["tbf", "rate", f"{int(rate_mbit * 1000)}kbit", "burst", str(burst), "latency", f"{latency}ms"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _root_links() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show").stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def leftovers(prefix: str = NAME_PREFIX) -> list[str]:
    """Namespaces and root-namespace interfaces whose names start with `prefix`."""
    return [f"netns {name}" for name in _namespaces() if name.startswith(prefix)] + [
        f"link {name}" for name in _root_links() if name.startswith(prefix)
    ]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_namespace(name: str) -> None:
    # a namespace outlives `ip netns del` while processes run in it: end them first (they are ours by name)
    for pid in _ip("netns", "pids", name, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", name, check=False)


def cleanup_leftovers(prefix: str = NAME_PREFIX) -> list[str]:
    """Remove namespaces and links of earlier runs whose process is gone; returns what was removed."""
    removed = []
    for name in _namespaces():
        match = _LEFTOVER.match(name)
        if match and name.startswith(prefix) and not _pid_alive(int(match.group(1))):
            _remove_namespace(name)
            removed.append(f"netns {name}")
    for name in _root_links():
        match = _LEFTOVER.match(name)
        if match and name.startswith(prefix) and not _pid_alive(int(match.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    return removed


_libc = None


def in_namespace(namespace: str, function: Callable[[], T]) -> T:
    """Run `function` on a fresh thread that has entered `namespace`'s network namespace, and return its result.

    setns(CLONE_NEWNET) moves only the calling thread, so sockets it opens (a TCP connection, a sock_diag query)
    belong to that namespace; the thread ends afterwards and the rest of the process never leaves the root one.
    """
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    outcome: dict = {}

    def run():
        try:
            fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {namespace}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            outcome["value"] = function()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name=f"netns-{namespace}", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class TornDownOnExit:
    """A lab as a context manager: `start()` on entry, `close()` on exit, and `close()` too when `start()` fails
    half-way, so that no namespace outlives the `with` (shared by netlab.Lab and routerlab.RouterLab)."""

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Lab(TornDownOnExit):
    """`peers` namespaces on one bridge, each link limited to `rate_mbit` both ways. Use as a context manager."""

    peers: int
    rate_mbit: float
    prefix: str = field(default_factory=lambda: f"{NAME_PREFIX}{os.getpid()}-")
    _created: list[str] = field(default_factory=list, init=False)

    def __post_init__(self):
        if not 1 <= self.peers <= 200:
            raise ValueError(f"peers must be 1..200, not {self.peers}")
        if len(self._veth(self.peers - 1, "b")) > 15:
            raise ValueError(f"prefix {self.prefix!r} makes interface names longer than Linux's 15 characters")

    # --- names -----------------------------------------------------------------------------------------------

    def namespace(self, index: int) -> str:
        return f"{self.prefix}{index}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}br"

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def _veth(self, index: int, side: str) -> str:
        return f"{self.prefix}{index}{side}"  # side "p": in the peer's namespace, "b": on the bridge

    def exec_prefix(self, index: int) -> list[str]:
        """Arguments that run a command inside peer `index`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index)]

    # --- life cycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        bridge_ns, bridge = self.bridge_namespace, f"{self.prefix}br"
        self._add_namespace(bridge_ns)
        _ip("-n", bridge_ns, "link", "add", bridge, "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", bridge, "up")
        for index in range(self.peers):
            namespace, inner, outer = self.namespace(index), self._veth(index, "p"), self._veth(index, "b")
            self._add_namespace(namespace)
            # created in the root namespace for a moment; moved at once (cleanup_leftovers catches a crash here)
            _ip("link", "add", inner, "netns", namespace, "type", "veth", "peer", "name", outer, "netns", bridge_ns)
            _ip("-n", bridge_ns, "link", "set", outer, "master", bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.address(index)}/24", "dev", inner)
            _ip("-n", namespace, "link", "set", inner, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        self.set_rate(self.rate_mbit)

    def set_rate(self, rate_mbit: float) -> None:
        """Limit every peer's link to `rate_mbit` both ways (replacing the previous limit)."""
        args = tbf_args(rate_mbit)
        for index in range(self.peers):
            for namespace, dev in ((self.namespace(index), self._veth(index, "p")),
                                   (self.bridge_namespace, self._veth(index, "b"))):
                _ip("netns", "exec", namespace, "tc", "qdisc", "replace", "dev", dev, "root", *args)
        self.rate_mbit = rate_mbit

    def qdiscs(self) -> list[str]:
        """`tc qdisc show` of every shaped interface (for a check that the limits are in place)."""
        lines = []
        for index in range(self.peers):
            for namespace, dev in ((self.namespace(index), self._veth(index, "p")),
                                   (self.bridge_namespace, self._veth(index, "b"))):
                result = _ip("netns", "exec", namespace, "tc", "qdisc", "show", "dev", dev)
                lines.append(f"{dev}: {result.stdout.strip()}")
        return lines

    def close(self) -> None:
        """Remove every namespace this lab made (their veths, qdiscs and the bridge go with them)."""
        for namespace in reversed(self._created):
            _remove_namespace(namespace)
        self._created.clear()
        for name in _root_links():
            if name.startswith(self.prefix):
                _ip("link", "del", name, check=False)

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
