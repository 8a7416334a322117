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
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension

__all__ = [
    "ReachabilityCheck", "addresses_to_check", "dial_libp2p", "tcp_endpoint", "unreachable_advice",
]

logger = logging.getLogger("swarmd.reachability")

HANDLER = "swarmd.reachability"
ASKED_PEERS = 3
MAX_ADDRESSES = 4
DIAL_TIMEOUT = 3.0
MULTISTREAM = b"/multistream/1.0.0\n"


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


def _is_local(maddr: str) -> bool:
    host = maddr.strip("/").split("/")[1]
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith(("10.", "192.168.")) or (
        host.startswith("172.") and host.split(".")[1].isdigit() and 16 <= int(host.split(".")[1]) <= 31
    )


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
        self.checked_addresses: list[str] = []
        self._p2p = None
        self._task: Optional[asyncio.Task] = None
        self._busy_callers: set = set()

    def ready(self, view: DaemonView) -> None:
        if view.dht is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(view), name="reachability")

    def snapshot_fields(self) -> dict[str, Any]:
        return {"reachable": self.reachable}

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
        if view.config.network.client_mode:
            return  # accepts no connections by choice: nothing to check, still answers others
        while True:
            await self._check_once(view)
            await asyncio.sleep(self.recheck_unknown if self.reachable == "unknown" else self.recheck_known)

    async def _check_once(self, view: DaemonView) -> None:
        addresses = addresses_to_check(view.snapshot().visible_maddrs)
        if not addresses:
            return
        peers = [info.peer_id for info in await self._p2p.list_peers()][: ASKED_PEERS * 3]
        answers = []
        for peer in peers:  # in turn, until ASKED_PEERS answered: plain hivemind peers do not serve the check
            answer = await self._ask(peer, addresses)
            if answer is not None:
                answers.append(answer)
                if len(answers) >= ASKED_PEERS or answer:
                    break
        state = "yes" if any(answers) else "no" if answers else "unknown"
        self._report(state, addresses)

    async def _ask(self, peer, addresses: list[str]) -> Optional[bool]:
        try:
            response = await asyncio.wait_for(
                self._p2p.call_protobuf_handler(peer, HANDLER, _JsonMessage(maddrs=addresses), _JsonMessage),
                self.ask_timeout,
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

    def _report(self, state: str, addresses: list[str]) -> None:
        changed = state != self.reachable or addresses != self.checked_addresses
        self.reachable, self.checked_addresses = state, addresses
        if not changed:
            return
        if state == "yes":
            logger.info("Reachable: a peer in the swarm dialed this one back at %s", ", ".join(addresses))
        elif state == "no":
            logger.warning(unreachable_advice(addresses))
