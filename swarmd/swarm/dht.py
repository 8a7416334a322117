"""Start and stop a hivemind DHT: a peer's (persistent identity, listen/announce addresses, bounded bootstrap) and
an observer's (`swarmd status --initial-peers`: a light client).

Every way the start can fail that an operator can fix becomes a StartupError with advice (exit code 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from swarmd.errors import ConfigError, StartupError

__all__ = ["IDENTITY_FILE", "start_dht", "start_observer_dht", "stop_dht", "join_addresses", "join_command"]

logger = logging.getLogger(__name__)

IDENTITY_FILE = "identity.key"
_DHT_READY_TIMEOUT = 60.0  # p2pd start (15 s fixed in hivemind) + identity check + bootstrap


async def start_dht(network, state_dir: Path, *, record_validators=(), forking=None):
    """A peer's DHT process (forked from the calling, main, thread), awaited without blocking the loop.

    Retries the bootstrap `network.bootstrap_attempts` times when the initial peers do not answer. `forking`: an
    async context manager factory entered around each fork of the DHT process (the daemon's: nothing else may run
    on another thread at a fork, daemon/lifecycle.py).
    """
    for field, addresses in (
        ("network.initial_peers", network.initial_peers),
        ("network.host_maddrs", network.host_maddrs),
        ("network.announce_maddrs", network.announce_maddrs),
    ):
        _check_multiaddrs(field, addresses)
    _check_ports_free(network.host_maddrs)
    client_mode = await _joins_as_client(network)
    delay = network.bootstrap_retry_delay
    for attempt in range(1, network.bootstrap_attempts + 1):
        async with (forking or contextlib.nullcontext)():
            dht = _launch(
                initial_peers=list(network.initial_peers),
                host_maddrs=list(network.host_maddrs),
                announce_maddrs=list(network.announce_maddrs) or None,
                identity_path=str(state_dir / IDENTITY_FILE),
                client_mode=client_mode,
                use_relay=network.use_relay,
                use_auto_relay=network.use_auto_relay,
                record_validators=list(record_validators),
            )
        try:
            await asyncio.to_thread(_wait_until_ready, dht, network.initial_peers, network.host_maddrs)
            return dht
        except asyncio.CancelledError:
            stop_dht(dht, timeout=5)
            raise
        except _NotReady as e:
            if not (e.unreachable and attempt < network.bootstrap_attempts):
                raise e.error from None
            logger.warning("%s (attempt %d/%d); retrying in %.0f s", e.error, attempt, network.bootstrap_attempts, delay)
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


async def _joins_as_client(network) -> bool:
    """Client mode as configured; a peer not told how it is reached (neither --client-mode nor --announce-maddrs)
    that its initial peers cannot dial back joins as a client, which trains normally behind NAT, where a peer that
    offers to reduce parts fails every round with another NAT'd peer (swarm/reachability.py, docs/NAT.md)."""
    if network.client_mode or network.announce_maddrs or not network.initial_peers:
        return network.client_mode
    from swarmd.swarm.reachability import client_line, probe_before_joining

    state, addresses = await probe_before_joining(list(network.initial_peers), list(network.host_maddrs))
    if state == "no":
        logger.info(client_line(addresses))
    return state == "no"


def start_observer_dht(initial_peers: list[str], *, record_validators=()):
    """A light client for reading a run: client mode (accepts no connections, stores nothing for others), on
    loopback; blocks until ready or raises StartupError."""
    _check_multiaddrs("--initial-peers", initial_peers)
    dht = _launch(
        initial_peers=list(initial_peers),
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        client_mode=True,
        record_validators=list(record_validators),
    )
    try:
        _wait_until_ready(dht, initial_peers, [])
    except _NotReady as e:
        raise e.error from None
    return dht


def stop_dht(dht, timeout: float = 10.0) -> None:
    """Stop a DHT process (and its p2pd); quiet, for use on the way out."""
    try:
        if dht.is_alive():
            dht.shutdown()
        dht.join(timeout=timeout)
    except Exception:  # noqa: BLE001 - best effort on a process that may have failed to start
        pass


def _launch(**kwargs):
    from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers

    identity = kwargs.get("identity_path")
    if identity is not None and _created_here(identity):
        # as hivemind does for an identity it generates itself: nobody else can be using it, skip the slow check
        kwargs["check_if_identity_free"] = False
    return ToleratesExitedCallers(start=True, await_ready=False, **kwargs)


def _created_here(identity: str) -> bool:
    from swarmd.swarm.upstream.identity import created_here

    return created_here(Path(identity))


def _check_multiaddrs(field: str, addresses) -> None:
    from hivemind.utils.multiaddr import Multiaddr

    for address in addresses:
        try:
            Multiaddr(address)
        except Exception as e:  # hivemind's parser is stricter than our syntax check
            raise ConfigError(f"{field}: {address!r} is not a valid multiaddr: {e}") from None


def _check_ports_free(host_maddrs) -> None:
    """Before p2pd starts: it listens with SO_REUSEPORT, so on a port another peer holds it would bind too and both
    peers would run on one address (swarm/ports.py)."""
    from swarmd.swarm.ports import port_taken_by

    for maddr in host_maddrs:
        parts = maddr.split("/")  # /ip4/ADDRESS/tcp/PORT[/...]
        if len(parts) < 5 or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
            continue
        port = int(parts[4])
        holder = port_taken_by(parts[2], port)
        if holder is not None:
            raise StartupError(
                f"cannot listen on {maddr}: TCP port {port} is already in use ({holder} listens on it: another swarmd? "
                f"`ss -ltnp 'sport = :{port}'` names the program); pick another with --host-maddrs "
                "/ip4/0.0.0.0/tcp/PORT, or tcp/0 for any free port"
            )


class _NotReady(Exception):
    def __init__(self, error: StartupError, unreachable: bool):
        super().__init__(str(error))
        self.error, self.unreachable = error, unreachable


def _wait_until_ready(dht, initial_peers, host_maddrs) -> None:
    """Wait for the DHT; on failure stop it and raise _NotReady with the explained error."""
    started = time.monotonic()
    try:
        dht.wait_until_ready(_DHT_READY_TIMEOUT)
    except BaseException as e:
        stop_dht(dht, timeout=5)
        if not isinstance(e, Exception):
            raise
        raise _NotReady(_explain(e, initial_peers, host_maddrs), _is_unreachable(e)) from None
    logger.info("DHT is up in %.1f s (peer id %s)", time.monotonic() - started, dht.peer_id)


def _is_unreachable(error: BaseException) -> bool:
    text = str(error)
    return "failed to connect to bootstrap peers" in text or "bootstrap failed" in text.lower()


def _explain(error: BaseException, initial_peers, host_maddrs) -> StartupError:
    text = str(error)
    if _is_unreachable(error):
        return StartupError(
            f"none of the initial peers answered ({', '.join(initial_peers)}): check that the address is the one the "
            "peer printed (its `To join:` line) and is reachable from here (a public or LAN address, not 127.0.0.1 "
            "of another machine), that its port is open in the firewall, and that it is still running; behind NAT "
            "add --client-mode"
        )
    if "address already in use" in text:
        return StartupError(
            f"cannot listen on {', '.join(host_maddrs)}: the port is already in use (another swarmd?); "
            "pick another with --host-maddrs /ip4/0.0.0.0/tcp/PORT, or tcp/0 for any free port"
        )
    if "already taken by another peer" in text:
        return StartupError(
            "this peer's identity is in use by a running peer (the same state dir started twice, or a copy of it); "
            "give each peer its own --state-dir, or wait a minute if it was just stopped"
        )
    if "failed to start in" in text:
        return StartupError(f"p2pd did not start in time ({text}); the machine may be overloaded, try again")
    if isinstance(error, TimeoutError) or type(error).__name__ == "TimeoutError":
        return StartupError(f"the DHT did not become ready in {_DHT_READY_TIMEOUT:.0f} s; check the network and try again")
    return StartupError(f"the DHT failed to start: {text.splitlines()[0] if text else type(error).__name__}")


def join_addresses(maddrs, client_mode: bool, initial_peers) -> list[str]:
    """What a newcomer should dial to join: this peer's addresses but loopback; a client's initial peers instead,
    as nobody can dial a client (it may be behind NAT, with only a home network's address to show)."""
    if client_mode and initial_peers:
        return list(initial_peers)
    return [addr for addr in maddrs if "/ip4/127." not in addr and "/ip6/::1/" not in addr]


def join_command(maddrs: list[str], run_id: str, config_path: str | None) -> str:
    """The line another peer pastes to join this one."""
    peers = " ".join(f"--initial-peers {addr}" for addr in maddrs)
    config = f" --config {config_path}" if config_path else ""
    return f"swarmd join{config} --run-id {run_id} {peers}"
