"""Home routers on one machine: public hosts on an "internet" bridge, home hosts each behind a masquerading router.

Layout (every box is a network namespace; names start with netlab's swd-<pid>- so that `cleanup_leftovers()`
removes what a crashed run left behind):

    public i  198.18.0.(1+i) ─┐
                              ├─ bridge "internet" (198.18.0.0/24, its own namespace)
    router i  198.18.0.(101+i)┘   WAN side
              198.19.i.1 ──────── LAN side ── home i  198.19.i.2 (default route via its router)

With `carrier=True` the home routers sit behind a second NAT, the carrier's (CGNAT, as many mobile and fibre
providers run): their WAN sides are on the carrier's network, and only the carrier router is on the internet:

    carrier   198.18.0.200 ──── WAN side on the internet bridge
              198.19.100.1 ──── bridge "carrier" (198.19.100.0/24, in the carrier's namespace)
    router i  198.19.100.(10+i)   WAN side on the carrier bridge (default route via the carrier)

With `forward_port=P` every home router forwards TCP port P of its WAN address to its home host (a port forward,
as a user sets one up in the router's settings), and lets those connections in.

A router forwards what its home host sends out and masquerades it (nftables, source NAT to its WAN address; Linux
keeps the source port when it is free, as most home routers do), and lets in only what belongs to a connection the
home side opened (`ct state established,related`): an unsolicited inbound connection is dropped and counted, to
the router itself or to the home host. Nothing routes 198.19.0.0/16 on the internet side, so a home address a peer
announces is useless to the others, as a 192.168.x.y address is on the real internet. Public hosts have no route
to anything but the bridge. Addresses come only from 198.18.0.0/15 (RFC 2544, reserved for benchmarking).

Needs root (CAP_NET_ADMIN), iproute2 and nft. Used by tests/swarm/test_router_lab.py and docs/NAT.md:

    sudo .venv/bin/python benchmarks/routerlab.py --homes 2        # build, check the NAT's rules, tear down
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netlab import (  # noqa: E402
    NAME_PREFIX, TornDownOnExit, _ip, _remove_namespace, _root_links, cleanup_leftovers, in_namespace, leftovers,
    tbf_args,
)

__all__ = [
    "RouterLab", "missing_tools", "router_rules", "reachability_matrix", "cleanup_leftovers", "leftovers",
    "INTERNET", "HOME", "CARRIER",
]

INTERNET = "198.18.0"  # public i: .(1+i); router i's WAN side: .(101+i); the carrier router's: .200
HOME = "198.19"  # home i's LAN: 198.19.i.0/24, its router .1, the home host .2
CARRIER = "198.19.100"  # the carrier's network: its router .1, home router i's WAN side .(10+i)
MAX_HOSTS = 10  # one digit in interface names: swd-<7-digit pid>-r9w is Linux's 15 characters
_DROPPED = re.compile(r"counter packets (\d+) bytes \d+ drop")


def missing_tools() -> list[str]:
    """What the lab needs and this machine lacks: root, iproute2's ip, nftables' nft."""
    missing = [] if os.geteuid() == 0 else ["root"]
    return missing + [tool for tool in ("ip", "nft") if shutil.which(tool) is None]


def router_rules(wan: str, lan: str, forward: Optional[tuple[str, int]] = None) -> str:
    """The router's nftables ruleset: masquerade out of the WAN side, admit inbound only for known connections;
    with `forward` = (home address, port), a port forward: TCP to that port of the WAN side goes to the home host."""
    forwarding = "" if forward is None else f"""
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{wan}" tcp dport {forward[1]} dnat ip to {forward[0]}:{forward[1]}
  }}"""
    admit_forwarded = "" if forward is None else "\n    ct status dnat accept"
    return f"""
table inet swarmd_router {{{forwarding}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{wan}" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    ct state established,related accept{admit_forwarded}
    iifname "{lan}" oifname "{wan}" accept
    counter drop
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    ct state established,related accept
    iifname {{ "lo", "{lan}" }} accept
    counter drop
  }}
}}
"""


@dataclass
class RouterLab(TornDownOnExit):
    """`public` hosts on the internet bridge and `homes` hosts behind a router each. Use as a context manager."""

    public: int
    homes: int
    rate_mbit: Optional[float] = None  # tbf on every internet-side link, both ways; None: unlimited
    carrier: bool = False  # the home routers behind a second NAT layer, the carrier's (see the module docstring)
    forward_port: Optional[int] = None  # every home router forwards this TCP port to its home host
    prefix: str = field(default_factory=lambda: f"{NAME_PREFIX}{os.getpid()}-")
    _created: list[str] = field(default_factory=list, init=False)

    def __post_init__(self):
        for name, count in (("public", self.public), ("homes", self.homes)):
            if not 0 <= count <= MAX_HOSTS:
                raise ValueError(f"{name} must be 0..{MAX_HOSTS}, not {count}")
        if len(f"{self.prefix}r0w") > 15:
            raise ValueError(f"prefix {self.prefix!r} makes interface names longer than Linux's 15 characters")

    # --- names and addresses -----------------------------------------------------------------------------------

    @property
    def internet_namespace(self) -> str:
        return f"{self.prefix}net"

    def public_namespace(self, index: int) -> str:
        return f"{self.prefix}p{index}"

    def router_namespace(self, index: int) -> str:
        return f"{self.prefix}r{index}"

    def home_namespace(self, index: int) -> str:
        return f"{self.prefix}h{index}"

    def public_address(self, index: int) -> str:
        return f"{INTERNET}.{1 + index}"

    @property
    def carrier_namespace(self) -> str:
        return f"{self.prefix}c"

    def router_address(self, index: int) -> str:
        """What the internet sees of home host `index`: its router's WAN address, or behind the carrier's NAT, the
        carrier router's (shared by every home)."""
        return f"{INTERNET}.200" if self.carrier else self.wan_address(index)

    def wan_address(self, index: int) -> str:
        """Router `index`'s own WAN address (on the carrier's network when there is one)."""
        return f"{CARRIER}.{10 + index}" if self.carrier else f"{INTERNET}.{101 + index}"

    def home_address(self, index: int) -> str:
        return f"{HOME}.{index}.2"

    def exec_prefix(self, namespace: str) -> list[str]:
        return ["ip", "netns", "exec", namespace]

    # --- life cycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        bridge = f"{self.prefix}br"
        self._add_namespace(self.internet_namespace)
        _ip("-n", self.internet_namespace, "link", "add", bridge, "type", "bridge")
        _ip("-n", self.internet_namespace, "link", "set", bridge, "up")
        for index in range(self.public):
            namespace = self.public_namespace(index)
            self._add_namespace(namespace)
            self._plug(namespace, f"{self.prefix}p{index}w", f"{self.prefix}p{index}b", self.public_address(index))
        if self.carrier:
            self._add_carrier()
        for index in range(self.homes):
            self._add_router(index)

    def _add_carrier(self) -> None:
        """The carrier's router: on the internet at .200, masquerading its bridge of home routers behind it."""
        carrier, bridge = self.carrier_namespace, f"{self.prefix}cbr"
        self._add_namespace(carrier)
        self._plug(carrier, f"{self.prefix}cw", f"{self.prefix}cb", f"{INTERNET}.200")
        _ip("-n", carrier, "link", "add", bridge, "type", "bridge")
        _ip("-n", carrier, "addr", "add", f"{CARRIER}.1/24", "dev", bridge)
        _ip("-n", carrier, "link", "set", bridge, "up")
        _run(self.exec_prefix(carrier) + ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        _run(self.exec_prefix(carrier) + ["nft", "-f", "-"], stdin=router_rules(f"{self.prefix}cw", bridge))

    def _plug(self, namespace: str, inner: str, outer: str, address: str) -> None:
        """A veth from `namespace` (`inner`, with `address`/24) to the internet bridge (`outer`)."""
        # created in the root namespace for a moment; moved at once (cleanup_leftovers catches a crash here)
        _ip("link", "add", inner, "netns", namespace, "type", "veth", "peer", "name", outer,
            "netns", self.internet_namespace)
        _ip("-n", self.internet_namespace, "link", "set", outer, "master", f"{self.prefix}br", "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", namespace, "link", "set", inner, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        if self.rate_mbit is not None:
            for ns, dev in ((namespace, inner), (self.internet_namespace, outer)):
                _run(self.exec_prefix(ns) + ["tc", "qdisc", "replace", "dev", dev, "root", *tbf_args(self.rate_mbit)])

    def _add_router(self, index: int) -> None:
        router, home = self.router_namespace(index), self.home_namespace(index)
        wan, lan, home_dev = f"{self.prefix}r{index}w", f"{self.prefix}r{index}l", f"{self.prefix}h{index}l"
        self._add_namespace(router)
        self._add_namespace(home)
        if self.carrier:  # the WAN side on the carrier's bridge, the carrier router its way out
            _ip("link", "add", wan, "netns", router, "type", "veth", "peer", "name", f"{self.prefix}r{index}b",
                "netns", self.carrier_namespace)
            _ip("-n", self.carrier_namespace, "link", "set", f"{self.prefix}r{index}b", "master", f"{self.prefix}cbr",
                "up")
            _ip("-n", router, "addr", "add", f"{self.wan_address(index)}/24", "dev", wan)
            _ip("-n", router, "link", "set", wan, "up")
            _ip("-n", router, "link", "set", "lo", "up")
            _ip("-n", router, "route", "add", "default", "via", f"{CARRIER}.1")
        else:
            self._plug(router, wan, f"{self.prefix}r{index}b", self.wan_address(index))
        _ip("link", "add", lan, "netns", router, "type", "veth", "peer", "name", home_dev, "netns", home)
        _ip("-n", router, "addr", "add", f"{HOME}.{index}.1/24", "dev", lan)
        _ip("-n", router, "link", "set", lan, "up")
        _ip("-n", home, "addr", "add", f"{self.home_address(index)}/24", "dev", home_dev)
        _ip("-n", home, "link", "set", home_dev, "up")
        _ip("-n", home, "link", "set", "lo", "up")
        _ip("-n", home, "route", "add", "default", "via", f"{HOME}.{index}.1")
        _run(self.exec_prefix(router) + ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        forward = None if self.forward_port is None else (self.home_address(index), self.forward_port)
        _run(self.exec_prefix(router) + ["nft", "-f", "-"], stdin=router_rules(wan, lan, forward))

    def dropped(self, index: Optional[int]) -> int:
        """Unsolicited inbound packets router `index` (None: the carrier's) has dropped so far (to itself or to the
        hosts behind it)."""
        namespace = self.carrier_namespace if index is None else self.router_namespace(index)
        rules = _run(self.exec_prefix(namespace) + ["nft", "list", "table", "inet", "swarmd_router"])
        return sum(int(count) for count in _DROPPED.findall(rules))

    def close(self) -> None:
        """Remove every namespace this lab made (their veths, rules and the bridge go with them)."""
        for namespace in reversed(self._created):
            _remove_namespace(namespace)
        self._created.clear()
        for name in _root_links():
            if name.startswith(self.prefix):
                _ip("link", "del", name, check=False)

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)


def _run(args: list[str], stdin: Optional[str] = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:6])}: {result.stderr.strip()}")
    return result.stdout


# --- checks --------------------------------------------------------------------------------------------------


def can_connect(namespace: str, host: str, port: int, timeout: float = 1.5) -> bool:
    """Whether a TCP connection from `namespace` to host:port is accepted."""

    def dial() -> bool:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False

    return in_namespace(namespace, dial)


def listen(namespace: str, port: int, stop: threading.Event) -> threading.Event:
    """Accept TCP connections on 0.0.0.0:`port` inside `namespace` until `stop`; returns an event set once bound."""
    bound = threading.Event()

    def serve() -> None:
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("0.0.0.0", port))
            server.listen(8)
            server.settimeout(0.2)
            bound.set()
            while not stop.is_set():
                try:
                    server.accept()[0].close()
                except OSError:
                    pass

    threading.Thread(target=lambda: in_namespace(namespace, serve), daemon=True).start()
    return bound


def reachability_matrix(lab: RouterLab, port: int = 40123) -> dict[str, bool]:
    """Who can open a TCP connection to whom: 'home0->public0' etc. Home hosts are dialed at their router's WAN
    address (what the internet sees of them) and at their own (which nothing routes)."""
    stop = threading.Event()
    hosts = {f"public{i}": lab.public_namespace(i) for i in range(lab.public)}
    hosts.update({f"home{i}": lab.home_namespace(i) for i in range(lab.homes)})
    try:
        for namespace in hosts.values():
            if not listen(namespace, port, stop).wait(5):
                raise RuntimeError(f"could not listen in {namespace}")
        targets = {f"public{i}": lab.public_address(i) for i in range(lab.public)}
        targets.update({f"home{i}": lab.router_address(i) for i in range(lab.homes)})
        targets.update({f"home{i}@lan": lab.home_address(i) for i in range(lab.homes)})
        return {f"{source}->{target}": can_connect(namespace, address, port)
                for source, namespace in hosts.items() for target, address in targets.items()
                if target.split("@")[0] != source}
    finally:
        stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--public", type=int, default=1)
    parser.add_argument("--homes", type=int, default=2)
    parser.add_argument("--carrier", action="store_true", help="the home routers behind a second, carrier NAT")
    parser.add_argument("--forward-port", type=int, default=None, help="each home router forwards this TCP port")
    args = parser.parse_args()
    missing = missing_tools()
    if missing:
        sys.exit(f"routerlab needs {', '.join(missing)} (apt-get install iproute2 nftables; run as root)")
    with RouterLab(args.public, args.homes, carrier=args.carrier, forward_port=args.forward_port) as lab:
        for pair, ok in reachability_matrix(lab).items():
            print(f"{pair:24} {'connects' if ok else 'blocked'}")
        print("dropped by the routers:", [lab.dropped(i) for i in range(lab.homes)],
              *(["by the carrier's:", lab.dropped(None)] if lab.carrier else []))


if __name__ == "__main__":
    main()
