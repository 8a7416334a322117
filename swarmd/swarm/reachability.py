"""Can other peers dial this one? Ask a peer already in the swarm to dial it back.

Why: a peer behind NAT or a closed firewall port still joins (it dials out) and trains, but nobody can dial it:
it cannot serve its state to a newcomer, and a group that needs to reach it fails its round. Nothing in the log
says so. Petals asks other servers the same question at start (petals/server/reachability.py) and prints numbered
fix-it steps; so does swarmd.

How: every swarmd peer serves `swarmd.reachability`. Given a few multiaddrs, it opens a NEW TCP connection to each
(the libp2p connection the request came over proves nothing) and checks that a libp2p endpoint answers
multistream-select's greeting. The asking peer sends the addresses it announces (its public ones, if it has any)
to up to `ASKED_PEERS` peers it is connected to: any "yes" makes it reachable, only "no"s unreachable, and no
answer at all (alone in the swarm, or only plain hivemind peers around) leaves it "unknown" and it asks again.

The check dials what the caller names, so it is bounded: a few addresses per request, one request per caller at a
time, a short timeout, and nothing read beyond the greeting.

Behind a home router (docs/NAT.md): nobody can dial the peer, but the connection it opens to a public peer carries
requests both ways, so it trains with reachable peers; with another peer behind NAT it has no path at all (p2pd
answers "routing: not found"), and a group holding both fails its round. A client-mode peer needs no path to
them: it reduces no part and sends its gradients to the reachable peers, which reduce for it. So before joining,
a peer that was not told how it is reached (no --client-mode, no --announce-maddrs) asks its initial peers to dial
it back from a throw-away p2pd (`probe_before_joining`), and joins as a client when they all fail.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension

__all__ = [
    "ReachabilityCheck", "addresses_to_check", "ask_peer", "dial_libp2p", "probe_before_joining", "reachability_mode",
    "tcp_endpoint", "unreachable_advice", "unreachable_line", "client_line",
]

logger = logging.getLogger("swarmd.reachability")

HANDLER = "swarmd.reachability"
ASKED_PEERS = 3
MAX_ADDRESSES = 4
DIAL_TIMEOUT = 3.0
PROBE_TIMEOUT = 20.0  # the throw-away p2pd's start, its connection to an initial peer and their dial-back
PROBE_CONNECT_WAIT = 5.0  # for p2pd's bootstrap connection to an initial peer, once it has started
MULTISTREAM = b"/multistream/1.0.0\n"
_LOCAL_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"))


class _JsonMessage:
    """hivemind's unary handlers need only FromString and SerializeToString: JSON spares us a compiled .proto."""

    def __init__(self, **fields: Any):
        self.fields = fields

    @classmethod
    def FromString(cls, data: bytes) -> "_JsonMessage":  # noqa: N802 - protobuf's name
        fields = json.loads(data.decode())
        if not isinstance(fields, dict):
            raise ValueError("a reachability message is a JSON object")
        return cls(**fields)

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name
        return json.dumps(self.fields).encode()


def tcp_endpoint(maddr: str) -> Optional[tuple[str, int]]:
    """/ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT[/...] -> (HOST, PORT); None for what TCP cannot dial (relays, QUIC)."""
    parts = maddr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[2] != "tcp":
        return None
    if "p2p-circuit" in parts or not parts[3].isdigit():
        return None
    return parts[1], int(parts[3])


def addresses_to_check(visible_maddrs) -> list[str]:
    """The announced addresses other peers would dial: the public ones if there are any, else all (a LAN or
    loopback swarm), at most MAX_ADDRESSES, without their /p2p/ suffix."""
    dialable = [str(m).split("/p2p/")[0] for m in visible_maddrs if tcp_endpoint(str(m)) is not None]
    public = [m for m in dialable if not _is_local(m)]
    return list(dict.fromkeys(public or dialable))[:MAX_ADDRESSES]


def _host(maddr: str) -> str:
    """The address or name of a multiaddr (/ip4/<host>/tcp/...)."""
    return maddr.strip("/").split("/")[1]


def _is_local(maddr: str) -> bool:
    """An address only its own network can dial: loopback, RFC 1918, carrier-grade NAT (100.64/10), link-local,
    IPv6 unique-local. Not 198.18/15 (the benchmarks' lab uses it as its internet)."""
    host = _host(maddr)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"  # a DNS name: another network's to resolve
    return ip.is_loopback or ip.is_link_local or any(ip in network for network in _LOCAL_NETWORKS)


def only_local(addresses: list[str]) -> bool:
    """Every address checked is one only its own network can dial (addresses_to_check found no other)."""
    return bool(addresses) and all(_is_local(address) for address in addresses)


def reachable_line(addresses: list[str]) -> str:
    # loopback only: a swarm on one machine (a demo, the tests), where "reachable" means just that
    on_this_machine = all(_host(address) in ("127.0.0.1", "::1", "localhost") for address in addresses)
    if only_local(addresses) and not on_this_machine:
        # a peer on the same network dialed it: true there, and nowhere else
        return (f"Reachable on its own network only: a peer dialed this one back at {', '.join(addresses)}, "
                "private addresses that peers elsewhere cannot dial; to train with peers outside this network, "
                "forward a TCP port and add --announce-maddrs /ip4/PUBLIC_IP/tcp/PORT, or join with --client-mode")
    return f"Reachable: a peer in the swarm dialed this one back at {', '.join(addresses)}"


async def dial_libp2p(host: str, port: int, timeout: float = DIAL_TIMEOUT) -> bool:
    """A fresh TCP connection to host:port, answered by multistream-select's greeting (a libp2p endpoint)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(bytes([len(MULTISTREAM)]) + MULTISTREAM)  # a varint length prefix, then the protocol id
        await writer.drain()
        greeting = await asyncio.wait_for(reader.read(64), timeout)
        return MULTISTREAM in greeting
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


def unreachable_line(addresses: list[str]) -> str:
    """A NAT'd peer that is not a client (the probe before joining had no answer): true, and in one line."""
    port = next((str(tcp_endpoint(a)[1]) for a in addresses if tcp_endpoint(a)), "PORT")
    return (f"This peer is NOT reachable at {', '.join(addresses)}: it trains with reachable peers over the "
            "connections it opens, but rounds with peers that are not reachable either fail; restart it with "
            f"--client-mode, or forward TCP port {port} and add --announce-maddrs /ip4/PUBLIC_IP/tcp/{port}")


def client_line(addresses: list[str]) -> str:
    return (f"Peers could not dial this one back at {', '.join(addresses)} (behind NAT or a firewall): it joins as a "
            "client that only dials out and trains normally; the swarm's reachable peers average for it")


def reachability_mode(reachable: str, client_mode: bool, visible_maddrs) -> str:
    """How other peers reach this one: direct, client (over connections it opens), relay (a /p2p-circuit address
    it announces), unreachable (no path for peers behind NAT), unknown (not checked yet)."""
    if client_mode:
        return "client"
    if reachable == "yes":
        return "direct"
    if any("/p2p-circuit" in str(m) for m in visible_maddrs):
        return "relay"
    return "unreachable" if reachable == "no" else "unknown"


async def ask_peer(p2p, peer, addresses: list[str], timeout: float) -> Optional[bool]:
    """Ask `peer` to dial this one back at `addresses`: True/False, or None when it does not answer."""
    try:
        response = await asyncio.wait_for(
            p2p.call_protobuf_handler(peer, HANDLER, _JsonMessage(maddrs=addresses), _JsonMessage), timeout
        )
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a peer without the handler, gone, or slow: no answer
        logger.debug("%s did not check this peer's reachability: %r", peer, e)
        return None
    answers = response.fields.get("reachable")
    if not isinstance(answers, dict) or not answers:
        return None
    return any(value is True for value in answers.values())


async def ask_peers(p2p, addresses: list[str], timeout: float) -> str:
    """yes/no/unknown from up to ASKED_PEERS of the peers `p2p` is connected to, in turn, until one says yes."""
    answers = []
    for peer in [info.peer_id for info in await p2p.list_peers()][: ASKED_PEERS * 3]:
        answer = await ask_peer(p2p, peer, addresses, timeout)
        if answer is not None:
            answers.append(answer)
            if len(answers) >= ASKED_PEERS or answer:
                break
    return "yes" if any(answers) else "no" if answers else "unknown"


async def probe_before_joining(initial_peers: list[str], host_maddrs: list[str]) -> tuple[str, list[str]]:
    """(yes/no/unknown, the addresses checked): a throw-away p2pd listening where the peer will, with a random
    identity (the peer's own would look taken to hivemind's identity check right after), asks the initial peers to
    dial it back. Anything that goes wrong is "unknown": the peer then joins as configured."""
    from hivemind.p2p import P2P

    p2p = None
    try:
        p2p = await asyncio.wait_for(P2P.create(initial_peers=initial_peers, host_maddrs=host_maddrs), PROBE_TIMEOUT)
        addresses = addresses_to_check(await p2p.get_visible_maddrs())
        deadline = asyncio.get_running_loop().time() + PROBE_CONNECT_WAIT
        while not await p2p.list_peers() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        if not addresses:
            return "unknown", []
        return await asyncio.wait_for(ask_peers(p2p, addresses, DIAL_TIMEOUT * 2), PROBE_TIMEOUT), addresses
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a probe that fails must not stop the join
        logger.debug("The reachability probe before joining failed: %r", e)
        return "unknown", []
    finally:
        if p2p is not None:
            await p2p.shutdown()


def unreachable_advice(addresses: list[str]) -> str:
    port = next((str(tcp_endpoint(a)[1]) for a in addresses if tcp_endpoint(a)), "PORT")
    return "\n".join([
        f"This peer is NOT reachable at {', '.join(addresses)}: peers that dialed it back failed. It trains, but "
        "cannot serve its state to newcomers, and rounds that need to reach it fail. To fix:",
        f"  1. open TCP port {port} in this machine's firewall, and forward it on the router if there is one;",
        f"  2. behind NAT, announce the public address: --announce-maddrs /ip4/PUBLIC_IP/tcp/{port} "
        f"(with --host-maddrs /ip4/0.0.0.0/tcp/{port});",
        "  3. or join with --client-mode: the peer then only dials out (it still trains and averages);",
        "  4. or let others reach it through a relay: network.use_relay and network.use_auto_relay: true.",
    ])


class ReachabilityCheck(Extension):
    """Serves the dial-back check to other peers and asks them about this one; owns `reachable` in the snapshot."""

    def __init__(self, *, recheck_unknown: float = 10.0, recheck_known: float = 600.0, ask_timeout: float = 10.0):
        self.recheck_unknown = recheck_unknown
        self.recheck_known = recheck_known
        self.ask_timeout = ask_timeout
        self.reachable = "unknown"
        self.mode = "unknown"
        self.checked_addresses: list[str] = []
        self._p2p = None
        self._task: Optional[asyncio.Task] = None
        self._busy_callers: set = set()

    def ready(self, view: DaemonView) -> None:
        if view.dht is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(view), name="reachability")

    def snapshot_fields(self) -> dict[str, Any]:
        return {"reachable": self.reachable, "reachability": self.mode}

    def stopping(self, view: DaemonView) -> None:
        self._cancel()

    async def close(self) -> None:
        self._cancel()

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # --- serving others ------------------------------------------------------------------------------------

    async def rpc_check(self, request: _JsonMessage, context) -> _JsonMessage:
        from swarmd.swarm.allowlist import installed

        caller = context.remote_id
        maddrs = request.fields.get("maddrs")
        allow_list = installed()  # a private swarm dials nothing for an outsider
        if allow_list is not None and not allow_list.admit(caller.to_base58(), "reachability"):
            return _JsonMessage(reachable={})
        if not isinstance(maddrs, list) or caller in self._busy_callers:
            return _JsonMessage(reachable={})
        self._busy_callers.add(caller)
        try:
            endpoints = {m: tcp_endpoint(m) for m in maddrs[:MAX_ADDRESSES] if isinstance(m, str)}
            dialed = await asyncio.gather(*(dial_libp2p(*e) for e in endpoints.values() if e is not None))
            answers = dict(zip([m for m, e in endpoints.items() if e is not None], dialed))
            return _JsonMessage(reachable=answers)
        finally:
            self._busy_callers.discard(caller)

    # --- asking about this peer ----------------------------------------------------------------------------

    async def _run(self, view: DaemonView) -> None:
        try:
            self._p2p = await view.dht.replicate_p2p()
            await self._p2p.add_protobuf_handler(HANDLER, self.rpc_check, _JsonMessage)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - an observer must not stop training
            logger.warning("Reachability checks are off: %s", e)
            return
        if getattr(view.dht, "client_mode", view.config.network.client_mode):
            self.mode = "client"  # by choice or by the probe before joining (swarm/dht.py), which said so in the log
            return  # accepts no connections: nothing to check, still answers others
        while True:
            await self._check_once(view)
            await asyncio.sleep(self.recheck_unknown if self.reachable == "unknown" else self.recheck_known)

    async def _check_once(self, view: DaemonView) -> None:
        addresses = addresses_to_check(view.snapshot().visible_maddrs)
        if not addresses:
            return
        # plain hivemind peers do not serve the check: asked in turn, until ASKED_PEERS answered
        state = await ask_peers(self._p2p, addresses, self.ask_timeout)
        self._report(state, addresses, announced=bool(view.config.network.announce_maddrs),
                     visible_maddrs=view.snapshot().visible_maddrs)

    def _report(self, state: str, addresses: list[str], *, announced: bool = False, visible_maddrs=()) -> None:
        changed = state != self.reachable or addresses != self.checked_addresses
        self.reachable, self.checked_addresses = state, addresses
        self.mode = reachability_mode(state, False, visible_maddrs)
        if not changed:
            return
        if state == "yes":
            logger.info("%s", reachable_line(addresses))
        elif state == "no" and announced:  # the operator said where it is reached, and it is not: fix that
            logger.warning(unreachable_advice(addresses))
        elif state == "no":
            logger.warning(unreachable_line(addresses))
