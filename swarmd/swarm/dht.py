"""Start the hivemind DHT for a peer: persistent identity, listen/announce addresses, bounded bootstrap.

Every way the start can fail that an operator can fix becomes a StartupError with advice (exit code 3).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from swarmd.errors import ConfigError, StartupError

__all__ = ["IDENTITY_FILE", "start_dht", "join_command"]

logger = logging.getLogger(__name__)

IDENTITY_FILE = "identity.key"
_DHT_READY_TIMEOUT = 60.0  # p2pd start (15 s fixed in hivemind) + identity check + bootstrap


async def start_dht(network, state_dir: Path, *, record_validators=()):
    """Start the DHT process (forked from the calling, main, thread) and wait for it without blocking the loop.

    Retries the bootstrap `network.bootstrap_attempts` times when the initial peers do not answer.
    """
    import hivemind
    from hivemind.utils.multiaddr import Multiaddr

    for field, addresses in (
        ("network.initial_peers", network.initial_peers),
        ("network.host_maddrs", network.host_maddrs),
        ("network.announce_maddrs", network.announce_maddrs),
    ):
        for address in addresses:
            try:
                Multiaddr(address)
            except Exception as e:  # hivemind's parser is stricter than our syntax check
                raise ConfigError(f"{field}: {address!r} is not a valid multiaddr: {e}") from None

    delay = network.bootstrap_retry_delay
    for attempt in range(1, network.bootstrap_attempts + 1):
        dht = hivemind.DHT(
            initial_peers=list(network.initial_peers),
            host_maddrs=list(network.host_maddrs),
            announce_maddrs=list(network.announce_maddrs) or None,
            identity_path=str(state_dir / IDENTITY_FILE),
            client_mode=network.client_mode,
            use_relay=network.use_relay,
            use_auto_relay=network.use_auto_relay,
            record_validators=list(record_validators),
            start=True,
            await_ready=False,
        )
        started = time.monotonic()
        try:
            await asyncio.to_thread(dht.wait_until_ready, _DHT_READY_TIMEOUT)
            logger.info("DHT is up in %.1f s (peer id %s)", time.monotonic() - started, dht.peer_id)
            return dht
        except BaseException as e:
            _stop_quietly(dht)
            if isinstance(e, asyncio.CancelledError):
                raise
            error = _explain(e, network)
            retry = _is_unreachable(e) and attempt < network.bootstrap_attempts
            if not retry:
                raise error from None
            logger.warning("%s (attempt %d/%d); retrying in %.0f s", error, attempt, network.bootstrap_attempts, delay)
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def _stop_quietly(dht) -> None:
    try:
        if dht.is_alive():
            dht.shutdown()
        dht.join(timeout=5)
    except Exception:  # noqa: BLE001 - best effort on a process that failed to start
        pass


def _is_unreachable(error: BaseException) -> bool:
    text = str(error)
    return "failed to connect to bootstrap peers" in text or "bootstrap failed" in text.lower()


def _explain(error: BaseException, network) -> StartupError:
    text = str(error)
    if _is_unreachable(error):
        peers = ", ".join(network.initial_peers)
        return StartupError(
            f"none of the initial peers answered ({peers}): check that the address is the one the peer printed "
            "and is reachable from here (a public or LAN address, not 127.0.0.1 of another machine), that its port "
            "is open in the firewall, and that it is still running; behind NAT add --client-mode"
        )
    if "address already in use" in text:
        return StartupError(
            f"cannot listen on {', '.join(network.host_maddrs)}: the port is already in use (another swarmd?); "
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


def join_command(maddrs: list[str], run_id: str, config_path: str | None) -> str:
    """The line another peer pastes to join this one."""
    peers = " ".join(f"--initial-peers {addr}" for addr in maddrs)
    config = f" --config {config_path}" if config_path else ""
    return f"swarmd join{config} --run-id {run_id} {peers}"
