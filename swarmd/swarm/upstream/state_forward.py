"""State downloads between peers that cannot dial each other: a client serves its state over the connections it
opened, and a reachable peer it is connected to forwards a download to it (issue 33).

Why: a peer behind NAT joins as a client (swarm/reachability.py). Clients never served their state, as nobody but
the peers their connections go to can reach them; a home peer joining a swarm whose only reachable peer does not
train (`--auxiliary`, which holds no state) had nobody to download from. p2pd's own relays (circuit relay v2) take
three minutes to give a home peer a reservation and none as swarmd starts p2pd (docs/NAT.md), so the forward is
done here, on the stream swarmd already has (state_stream.py):

- a client's state averager serves the state stream like any peer's (over the connections it opened) and offers
  its state under `{prefix}.client_donors` (subkey: its peer id, value: its epoch, as `{prefix}.all_averagers`);
- a reachable averager serves `{prefix}::swarmd.StateForward/1`: the downloader writes one line, `<kind> <donor's
  peer id>`; the forwarder asks the donor's state stream for `<kind>` (over the connection the donor keeps to it)
  and copies the donor's bytes back unchanged, at most MAX_FORWARDED_BYTES, at most MAX_FORWARDS at once; it closes
  with no frame when it will not (the caller or the donor outside a private swarm's list or excluded, every slot
  taken, the donor not reachable from it), and the downloader asks the next;
- a downloader that got nothing from the peers of `all_averagers` asks the clients' offers, the highest epoch
  first, each through the peers it is connected to. It checks what comes as any download (state_stream.py
  `unusable_state` and the layout): a forwarder cannot make a state pass that the donor could not.
The bytes a peer forwarded for others are counted (`forwarded_bytes`): what it pays for the clients' joins.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing as mp
import time
from typing import Optional

from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.utils import get_dht_time

from swarmd.swarm.averager_keys import CLIENT_DONORS
from swarmd.swarm.upstream.averager_gate import admits_peer, not_excluded
from swarmd.swarm.upstream.split_download import SplitsDownloads
from swarmd.swarm.upstream.state_stream import (
    KINDS, WRITE_BYTES, Route, Waits, chunk_timeout, donor_order, read_state, state_offers,
    stream_handler_name,
)

__all__ = ["ForwardsState", "forward_handler_name", "parse_forward_request", "MAX_FORWARDS", "MAX_FORWARDED_BYTES"]

logger = logging.getLogger(__name__)

MAX_FORWARDS = 2  # downloads one peer forwards at once: each holds two streams and the forwarder's uplink
MAX_FORWARDED_BYTES = 4 << 30  # per forward, as p2pd's relay limits a relayed connection (4 GiB)
FORWARD_FIRST_BYTES = 60.0  # seconds the forwarder waits for the donor's first bytes (it copies its state first)
MAX_CLIENT_DONORS = 3  # clients' offers a download asks, the newest first
MAX_FORWARDERS = 3  # peers asked to forward from one client
OFFER_POLL = 1.0  # seconds between a client's looks at its offer (the host writes it at each step)
UNOFFERED = -1.0


def forward_handler_name(prefix: str) -> str:
    return f"{prefix}::swarmd.StateForward/1"


def parse_forward_request(line: bytes) -> Optional[tuple[str, PeerID]]:
    """(kind, donor) of a forward request line, None when it is not one."""
    words = line.decode("ascii", "replace").split()
    if len(words) != 2 or words[0] not in KINDS or len(words[1]) > 128:
        return None
    try:
        return words[0], PeerID.from_base58(words[1])
    except Exception:  # noqa: BLE001 - not a peer id: nobody to forward to
        return None


class ForwardsState(SplitsDownloads):
    """SplitsDownloads with the forward: a reachable averager forwards downloads to clients, a client's averager
    (`serves_as_client`) serves and offers its state, and every averager downloads through forwarders when no
    reachable peer sent its state. Sits before SplitsDownloads in the MRO."""

    def __init__(self, *args, serves_as_client: bool = True, **kwargs):
        self.serves_as_client = serves_as_client  # a client that holds a state of its own (not the monitor's keeper)
        self._client_offer = mp.Value("d", UNOFFERED)  # the epoch a client offers (the host writes it), or UNOFFERED
        self.forwarded_bytes = mp.Value("q", 0)  # bytes this peer forwarded for others (its process counts)
        super().__init__(*args, **kwargs)

    def offer_state_as_client(self, epoch: Optional[int]) -> None:
        """(the host) A client offers its state at `epoch` through forwarders; None: not (catching up)."""
        self._client_offer.value = UNOFFERED if epoch is None else float(epoch)

    def _shares_state(self) -> bool:
        return super()._shares_state() or (self.client_mode and self._client_offer.value != UNOFFERED)

    # --- a client's state (its process) ------------------------------------------------------------------------

    def run_in_background(self, await_ready: bool = True, timeout: Optional[float] = None) -> None:
        super().run_in_background(await_ready, timeout)
        if self.client_mode and self.serves_as_client:  # upstream adds no handler for a client: this one is ours
            self._outer_pipe.send(("_serve_as_client", [], {}))

    async def _serve_as_client(self) -> None:
        await self._p2p.add_binary_stream_handler(stream_handler_name(self.prefix), self._serve_state_stream)
        self._serving_as_client = True
        key = f"{self._matchmaking.group_key_manager.prefix}.{CLIENT_DONORS}"
        declared, expires = None, 0.0
        while True:  # as upstream's _declare_for_download_periodically, reading the offer the host writes
            offer = self._client_offer.value
            value = None if offer == UNOFFERED else offer
            if value != declared or get_dht_time() > expires - self.declare_state_period / 2:
                if value is not None or declared is not None:  # None once: the offer is withdrawn
                    expires = get_dht_time() + self.declare_state_period
                    try:
                        await asyncio.wait_for(self.dht.store(
                            key, subkey=self.peer_id.to_bytes(), value=value, expiration_time=expires,
                            return_future=True), self.declare_state_period)
                    except Exception as e:  # noqa: BLE001 - tried again at the next change or half period
                        logger.debug("Could not offer this client's state: %r", e)
                declared = value
            await asyncio.sleep(OFFER_POLL)

    async def _shutdown(self, timeout: Optional[float]) -> None:
        if getattr(self, "_serving_as_client", False):
            await self._p2p.remove_binary_stream_handler(stream_handler_name(self.prefix))
        await super()._shutdown(timeout)

    # --- forwarding (a reachable peer's process) ---------------------------------------------------------------

    async def add_p2p_handlers(self, p2p, wrapper=None, *, namespace=None, balanced=False) -> None:
        await super().add_p2p_handlers(p2p, wrapper, namespace=namespace, balanced=balanced)
        if wrapper is None:
            self._forward_slots = asyncio.Semaphore(MAX_FORWARDS)
            await p2p.add_binary_stream_handler(forward_handler_name(namespace), self._serve_forward)

    async def remove_p2p_handlers(self, p2p, *, namespace=None) -> None:
        await super().remove_p2p_handlers(p2p, namespace=namespace)
        await p2p.remove_binary_stream_handler(forward_handler_name(namespace))

    def _forwards(self, caller: PeerID, donor: PeerID) -> bool:
        """Whether this peer forwards `donor`'s state to `caller`: both on its list and neither excluded."""
        return (
            admits_peer(self._allow_list, caller, "download_state") and admits_peer(self._allow_list, donor, "state_source")
            and not_excluded(self._exclusions, caller, "download_state")
            and not_excluded(self._exclusions, donor, "state_source")
        )

    async def _serve_forward(self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        caller = stream_info.peer_id
        try:
            request = parse_forward_request(await asyncio.wait_for(reader.readline(), self.request_timeout))
            if request is None or not self._forwards(caller, request[1]) or self._forward_slots.locked():
                return
            kind, donor = request
            began = time.perf_counter()
            async with self._forward_slots:
                sent = await self._forward(donor, kind, writer)
            logger.info("Forwarded the %s of %s to %s: %.1f MB in %.2f s", kind, donor, caller, sent / 1e6,
                        time.perf_counter() - began)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ControlFailure) as e:
            logger.debug("A forward to %s ended early: %r", caller, e)
        except Exception as e:  # noqa: BLE001 - one failed forward must not take the averager's process with it
            logger.warning("Could not forward a state to %s: %r", caller, e)
        finally:
            writer.close()

    async def _forward(self, donor: PeerID, kind: str, writer: asyncio.StreamWriter) -> int:
        """Copy `donor`'s `kind` stream to `writer` as it comes; the bytes copied."""
        chunk = chunk_timeout(self)
        _, donor_reader, donor_writer = await asyncio.wait_for(
            self._p2p.call_binary_stream_handler(donor, stream_handler_name(self.prefix)), chunk)
        sent, wait = 0, max(chunk, FORWARD_FIRST_BYTES)
        try:
            donor_writer.write(kind.encode() + b"\n")
            await asyncio.wait_for(donor_writer.drain(), chunk)
            while data := await asyncio.wait_for(donor_reader.read(WRITE_BYTES), wait):
                if sent + len(data) > MAX_FORWARDED_BYTES:
                    raise ValueError(f"{donor} sent over {MAX_FORWARDED_BYTES} bytes")
                writer.write(data)
                await asyncio.wait_for(writer.drain(), chunk)
                sent, wait = sent + len(data), chunk
                with self.forwarded_bytes.get_lock():
                    self.forwarded_bytes.value += len(data)
            return sent
        finally:
            donor_writer.close()

    # --- downloading through a forwarder (the averager's process) ----------------------------------------------

    async def _routes_through_forwarders(self, kind: str) -> list[Route]:
        """The clients that offer their state, the newest first, each through the peers this one is connected to."""
        key = f"{self._matchmaking.group_key_manager.prefix}.{CLIENT_DONORS}"
        found = await self.dht.get(key, latest=True, return_future=True)
        offers = state_offers(found, self.peer_id, self._allow_list, self._exclusions)
        donors = donor_order(offers, self._exclusions)[:MAX_CLIENT_DONORS]
        if not donors:
            return []
        connected = [info.peer_id for info in await self._p2p.list_peers()]
        forwarders = [peer for peer in dict.fromkeys(connected) if peer != self.peer_id
                      and admits_peer(self._allow_list, peer, "state_source")
                      and not_excluded(self._exclusions, peer, "state_source")]
        return [
            Route(donor, f"{donor} through {forwarder}",
                  functools.partial(self._download_forwarded, forwarder, donor, kind), counts_refusals=False)
            for donor in donors for forwarder in [peer for peer in forwarders if peer != donor][:MAX_FORWARDERS]
        ]

    async def _download_forwarded(self, forwarder: PeerID, donor: PeerID, kind: str, waits: Waits):
        """((metadata, tensors) of `donor` through `forwarder`, or None: it would not), the way it came (the route's
        label names the forwarder)."""
        try:
            _, reader, writer = await asyncio.wait_for(
                self._p2p.call_binary_stream_handler(forwarder, forward_handler_name(self.prefix)), waits.chunk)
        except ControlFailure as e:
            if "protocol" in str(e).lower():  # a peer that does not forward (plain hivemind, older swarmd)
                return None, "forward"
            raise
        try:
            writer.write(f"{kind} {donor.to_base58()}\n".encode())
            await writer.drain()
            return await read_state(reader, waits, self.serializer), "stream"
        finally:
            writer.close()
