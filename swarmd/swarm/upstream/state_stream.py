"""State downloads as raw tensor bytes on one libp2p stream, instead of hivemind's protobuf parts (issue 15).

Why: hivemind sends a state as 64 kB protobuf messages. Each part is copied out of its tensor, wrapped, parsed and
joined again, and the result is copied once more into shared memory for the host process: a 241 MB state (20M
parameters with Adam's statistics) took 1.8 s on loopback where the same bytes on the same kind of p2pd stream took
0.6 s (benchmarks/state_transfer.py, docs/PERFORMANCE.md section 5). Here the serving averager writes each tensor's
memory as it is, and the downloader reads it into shared memory that the host process then takes as it is.

The protocol, `<averager prefix>::swarmd.StateStream/1`, is a binary stream handler of the averager's process:
- the downloader writes one line: `state` (the whole state, as hivemind's `rpc_download_state`) or `parameters`
  (without the optimizer's statistics, as `rpc_download_parameters` of swarm/upstream/parameter_refresh.py);
- the server answers with frames (an 8-byte big-endian length, then that many bytes): first the msgpack of
  {"metadata": <the averager's serialized metadata>, "tensors": N}, then for each tensor hivemind's
  `runtime_pb2.Tensor` without its buffer, then the buffer: the tensor's bytes as they are in memory when the state
  compression is none, the compressed buffer otherwise;
- a refusal (an outsider of a private swarm, state sharing off, a request it does not know) closes the stream with
  no frame, as hivemind answers a download it will not serve with no data: the downloader asks the next peer.
A peer that does not serve the protocol (plain hivemind, an older swarmd) is asked through hivemind's RPC instead,
so the download works in a mixed swarm; the stream has the same libp2p authentication and encryption as the RPC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import multiprocessing as mp
import random
import time
from typing import Awaitable, Callable, Optional

import torch
from hivemind.compression import (
    CompressionInfo, NoCompression, TensorRole, deserialize_tensor_stream, deserialize_torch_tensor,
)
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils import MPFuture
from hivemind.utils.asyncio import aiter_with_timeout
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import ValueWithExpiration

from swarmd.swarm.state_layout import StateLayout, layout_mismatch
from swarmd.swarm.state_parts import Part, positions_problem, sample_values, samples_bytes
from swarmd.swarm.upstream.averager_gate import admits_peer, not_excluded

__all__ = ["DownloadsState", "Route", "Waits", "chunk_timeout", "donor_order", "parse_part", "read_state", "stream_handler_name", "shared_copy", "served_tensors", "state_offers", "unusable_state", "KINDS"]

logger = logging.getLogger(__name__)

KINDS = ("state", "parameters")
WRITE_BYTES = 1 << 20  # one write to p2pd (64 kB and 1 MB writes measured alike, PERFORMANCE.md section 5)
LENGTH_BYTES = 8
# room for the donors of a download (a base58 peer id is ~46-52 characters): a split's donors are a few
STATE_DONORS_BYTES = 1024
MAX_FRAME_HEADER = 1 << 20  # a tensor's description or the metadata: small; a longer one is a broken peer


def stream_handler_name(prefix: str) -> str:
    return f"{prefix}::swarmd.StateStream/1"


def shared_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of `tensor` in shared memory, for the state a peer serves: the pipe to the averager's process
    passes it by handle, where a private copy would be copied once more into shared memory on the way."""
    copy = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
    with torch.no_grad():
        copy.copy_(tensor)
    return copy


def chunk_timeout(averager) -> float:
    """The longest wait for the next chunk of a download, either side of it: the averager's next_chunk_timeout
    (unset: its request_timeout, as upstream's own downloads)."""
    return averager.next_chunk_timeout if averager.next_chunk_timeout is not None else averager.request_timeout


def served_tensors(kind: str, tensors, infos) -> list[tuple[torch.Tensor, CompressionInfo]]:
    """(tensor, info) pairs of a served state that a `kind` request gets: all of them for `state`, all but the
    optimizer's statistics for `parameters`. `infos` None: upstream's default infos."""
    if infos is None:
        infos = [CompressionInfo.from_tensor(tensor, key=i) for i, tensor in enumerate(tensors)]
    return [(t, i) for t, i in zip(tensors, infos) if kind == "state" or i.role != TensorRole.OPTIMIZER]


class ProtocolUnsupported(Exception):
    """The peer does not serve the stream: ask it through hivemind's RPC."""


class DownloadsState:
    """For a hivemind averager (DecentralizedAverager and its subclasses): serves its state on the stream and
    downloads states through it, falling back to hivemind's RPC per peer. Sits before the averager in the MRO.
    `download_by_stream=False` (`swarm.state_stream`) downloads by hivemind's RPC only."""

    _allow_list = None  # an open swarm; swarmd's averagers take the installed list (swarm/upstream/averager_gate.py)
    _exclusions = None  # none excluded; swarmd's averagers take the installed exclusions (swarm/exclusion.py)

    def __init__(self, *args, download_by_stream: bool = True, **kwargs):
        self.download_by_stream = download_by_stream  # before upstream's __init__, which may start the process
        # peers that refused to send their state, counted in the averager's process, read by the host: a download
        # that every peer refused is told apart from one that found nobody (a private swarm's outsider is refused)
        self.download_refusals = mp.Value("q", 0)
        # the donors of the last state (or parameters) this averager's process downloaded, their ids separated by
        # spaces: the host takes the state again once it has evidence against one of them (optimizer.py)
        self.state_donors = mp.Array("c", STATE_DONORS_BYTES)
        # a part's request, from the averager's process to the host's (served_state): put just before the host is
        # asked for the state, under a lock that keeps every other ask of this averager's process out in between
        self._part_requests = mp.SimpleQueue()
        super().__init__(*args, **kwargs)

    # --- serving (the averager's process) --------------------------------------------------------------------

    async def add_p2p_handlers(self, p2p, wrapper=None, *, namespace=None, balanced=False) -> None:
        await super().add_p2p_handlers(p2p, wrapper, namespace=namespace, balanced=balanced)
        if wrapper is None:  # this averager's own handlers (not a wrapper's), which a client-mode averager never adds
            await p2p.add_binary_stream_handler(stream_handler_name(namespace), self._serve_state_stream)

    async def remove_p2p_handlers(self, p2p, *, namespace=None) -> None:
        # at the averager's shutdown, as upstream removes its RPC handlers: p2pd keeps a handler until told, and
        # refuses to set one twice (a later averager of the same prefix on this DHT would fail to start)
        await super().remove_p2p_handlers(p2p, namespace=namespace)
        await p2p.remove_binary_stream_handler(stream_handler_name(namespace))

    async def _serve_state_stream(self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            words = (await asyncio.wait_for(reader.readline(), self.request_timeout)).decode("ascii", "replace").split()
            kind, part = (words[0], parse_part(words[1:])) if words else ("", None)
            if kind not in KINDS or part is False or not self._shares_state():
                return
            if not admits_peer(self._allow_list, stream_info.peer_id, "download_state"):
                return
            positions = await _read_positions(reader, self.request_timeout) if part else None
            began = time.perf_counter()
            if part is None:
                metadata, tensors, infos = await self._get_current_state_from_host_process()  # metadata: serialized
                chosen = served_tensors(kind, tensors, infos)
                head = {"metadata": metadata, "tensors": len(chosen)}
            else:
                metadata, tensors, infos = await self._part_from_host_process(kind, part, positions)
                if not tensors:  # the request does not fit this state (the host said why in its log)
                    return
                chosen = list(zip(tensors[:-1], infos[:-1]))
                head = {"metadata": metadata, "tensors": len(chosen), "samples": samples_bytes(tensors[-1])}
            prepared = time.perf_counter() - began
            # a downloader that takes nothing for a chunk's time is let go (with the copies of the state it pins)
            patience = chunk_timeout(self)
            await _write_frame(writer, MSGPackSerializer.dumps(head), patience)
            for tensor, info in chosen:
                description, payload = _encode(tensor, info, self.state_compression)
                await _write_frame(writer, description.SerializeToString(), patience)
                await _write_frame(writer, payload, patience)
            logger.info("Sent the %s%s to %s: %d tensors in %.2f s (the host's copy of it took %.2f s)",
                        kind, f" (tensors {part.words()})" if part else "", stream_info.peer_id, len(chosen),
                        time.perf_counter() - began, prepared)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            logger.debug("A state stream to %s ended early: %r", stream_info.peer_id, e)
        except Exception as e:  # noqa: BLE001 - one failed download must not take the averager's process with it
            logger.warning("Could not serve the state to %s: %r", stream_info.peer_id, e)
        finally:
            writer.close()

    def _shares_state(self) -> bool:
        return self.allow_state_sharing

    async def _get_current_state_from_host_process(self):
        async with self._host_state_lock():
            return await super()._get_current_state_from_host_process()

    async def _part_from_host_process(self, kind: str, part: Part, positions):
        """(metadata, the part's tensors then the values at `positions`, their infos) from the host, which copies
        only the part (a whole state's copy on a busy host took seconds, and each donor of a split made one);
        (metadata, [], None) when the request does not fit the state."""
        async with self._host_state_lock():
            self._part_requests.put((kind, part.first, part.stop, positions))
            return await super()._get_current_state_from_host_process()

    def _host_state_lock(self) -> asyncio.Lock:
        """One ask of the host at a time (the averager's process): the host's thread answers them in order, and a
        part's request must meet its own ask."""
        if getattr(self, "_host_lock", None) is None:
            self._host_lock = asyncio.Lock()
        return self._host_lock

    # --- the host process: the state it hands over ---------------------------------------------------------

    def get_current_state(self):
        """Upstream's state as it is (its live tensors), or the part a request asked for (served_state)."""
        return self.served_state(*self.live_state(), copy=lambda tensor: tensor)

    def live_state(self):
        """(host) The state to serve, its tensors the live ones (not copies): upstream's here."""
        return super().get_current_state()

    def served_state(self, metadata, tensors, infos, copy=None):
        """(host) What the averager's process is handed: every tensor as `copy` makes it (default: shared_copy), or,
        where the averager's process asked for a part, only that part's, then its values at the positions asked
        for (a float64 tensor), or no tensors when the request does not fit."""
        copy = copy or shared_copy
        request = None if self._part_requests.empty() else self._part_requests.get()
        if request is None:
            return metadata, [copy(tensor) for tensor in tensors], infos
        kind, first, stop, positions = request
        chosen = served_tensors(kind, tensors, infos)
        live = [tensor for tensor, _ in chosen]
        problem = positions_problem(positions, live)
        if problem or first >= len(live) or (stop is not None and stop > len(live)):
            logger.debug("Refused a request for tensors %s %s: %s", first, stop, problem or "not in this state")
            return metadata, [], None
        samples = sample_values(positions, live)
        part = chosen[first:stop]
        return (metadata, [copy(tensor) for tensor, _ in part] + [samples],
                [info for _, info in part] + [CompressionInfo.from_tensor(samples)])

    # --- downloading (the averager's process) ----------------------------------------------------------------

    async def _load_state_from_peers(self, future: MPFuture, timeout: Optional[float] = None) -> None:
        """Upstream's download of the whole state (the host's `load_state_from_peers` sends here), by stream."""
        await self._download_from_peers("state", future, timeout)

    async def _download_from_peers(self, kind: str, future: MPFuture, timeout: Optional[float] = None) -> None:
        """The peers that share their state, by upstream's order (the highest epoch first), then the clients that
        offer theirs through forwarders (state_forward.py), until one sends: sets `future` to (metadata, tensors), or
        to None when none did. `timeout`: the download's (the host waits as long), which bounds the wait for a
        peer's first bytes."""
        chunk = chunk_timeout(self)
        waits = functools.partial(Waits, first=max(chunk, timeout or 0.0), chunk=chunk)
        try:
            offers = await self._state_offers()
            loaded = await self._download_in_parts(kind, offers, waits)
            if loaded is not None:
                future.set_result(loaded)
                return
            direct = functools.partial(self._direct_routes, offers)
            for routes in (direct, self._routes_through_forwarders):
                for route in await routes(kind):
                    loaded = await self._try_route(route, kind, waits())
                    if loaded is not None:
                        self.note_donors([route.donor])
                        future.set_result(loaded)
                        return
        except Exception as e:  # noqa: BLE001 - reported to the caller as "nothing came"
            logger.warning("Could not download the swarm's %s: %r", kind, e)
        finally:
            if not future.done():
                future.set_result(None)

    async def _download_in_parts(self, kind: str, offers: dict[PeerID, float], waits) -> Optional[tuple]:
        """The state in parts from several donors (split_download.py, which notes them), or None: ask one donor at a
        time."""
        return None

    def note_donors(self, donors) -> None:
        """Remember who the state just downloaded came from (`state_donors`), as many as fit."""
        kept = b""
        for donor in donors:
            joined = (kept + b" " + str(donor).encode()).strip()
            if len(joined) >= STATE_DONORS_BYTES:
                break
            kept = joined
        self.state_donors.value = kept

    def donors_of_the_state(self) -> list[str]:
        """The peers the last download came from (none before one): read by the host."""
        return self.state_donors.value.decode(errors="replace").split()

    async def _direct_routes(self, offers: dict[PeerID, float], kind: str) -> list[Route]:
        return [Route(peer, str(peer), functools.partial(self._download_from, peer, kind))
                for peer in donor_order(offers, self._exclusions)]

    async def _routes_through_forwarders(self, kind: str) -> list[Route]:
        """Clients' states through the peers that forward them (state_forward.py); none here."""
        return []

    async def _try_route(self, route: Route, kind: str, waits: Waits) -> Optional[tuple]:
        """What `route` sent, if it can be used; None (and why, in the log) otherwise."""
        try:
            loaded, way = await route.fetch(waits)
        except Exception as e:  # noqa: BLE001 - a peer that fails (or leaves) costs a try: ask the next
            logger.info("Peer %s did not send its %s: %r", route.label, kind, e)
            return None
        if loaded is None:
            logger.debug("Peer %s did not send its %s (refused)", route.label, kind)
            if route.counts_refusals:  # a forwarder's "no" may be the donor's absence: not a refusal of this peer
                with self.download_refusals.get_lock():
                    self.download_refusals.value += 1
            return None
        unusable = unusable_state(loaded) or self._misfit(kind, loaded)
        if unusable:  # a lying or broken donor: its state would poison this peer's, ask the next
            logger.warning("Peer %s sent a %s that cannot be used (%s): asking the next", route.label, kind, unusable)
            return None
        megabytes = sum(t.numel() * t.element_size() for t in loaded[1]) / 1e6
        seconds = time.perf_counter() - waits.began
        logger.info(
            "Downloaded the %s of %s by %s: %.1f MB in %.2f s (%.0f MB/s; its first bytes after %.2f s)",
            kind, route.label, way, megabytes, seconds, megabytes / max(seconds, 1e-9), waits.first_bytes,
        )
        return loaded

    async def _download_from(self, peer: PeerID, kind: str, waits: Waits) -> tuple[Optional[tuple], str]:
        """(what `peer` sent or None, the way it came): by the stream, or hivemind's RPC where the peer does not
        serve the stream or `swarm.state_stream` is off."""
        if self.download_by_stream:
            try:
                return await self._download_stream(peer, kind, waits), "stream"
            except ProtocolUnsupported:
                pass
        return await self._download_rpc(peer, kind, waits), "hivemind RPC"

    def state_layout(self, kind: str) -> Optional[StateLayout]:
        """The layout that a download of `kind` must have to be taken (swarm/state_layout.py); None: unchecked."""
        return None

    def _misfit(self, kind: str, loaded) -> str:
        layout = self.state_layout(kind)
        return layout_mismatch(layout, *loaded) if layout is not None else ""

    async def _state_offers(self) -> dict[PeerID, float]:
        """The peers that offer their state (`<prefix>.all_averagers`) and their priorities (epochs)."""
        key = f"{self._matchmaking.group_key_manager.prefix}.all_averagers"
        found = await self.dht.get(key, latest=True, return_future=True)
        return state_offers(found, self.peer_id, self._allow_list, self._exclusions)

    async def _download_stream(self, peer: PeerID, kind: str, waits: Waits):
        """(metadata, tensors) from `peer` by the stream, None when it refused; ProtocolUnsupported when it does not
        serve the stream."""
        reader, writer = await _open_stream(self._p2p, peer, self.prefix, waits)
        try:
            writer.write(kind.encode() + b"\n")
            await writer.drain()
            return await read_state(reader, waits, self.serializer)
        finally:
            writer.close()

    async def download_part(self, peer: PeerID, kind: str, part: Part, positions: list, waits: Waits):
        """(metadata, the part's tensors, the values `peer` reports at `positions`) by the stream, None when it
        refused (an older swarmd refuses a part); ProtocolUnsupported when it does not serve the stream."""
        reader, writer = await _open_stream(self._p2p, peer, self.prefix, waits)
        try:
            writer.write(f"{kind} part {part.words()}\n".encode())
            await _write_frame(writer, MSGPackSerializer.dumps(positions), waits.chunk)
            frames = await _read_frames(reader, waits)
            if frames is None:
                return None
            head, tensors = frames
            return self.serializer.loads(head["metadata"]), tensors, bytes(head.get("samples", b""))
        finally:
            writer.close()

    async def _download_rpc(self, peer: PeerID, kind: str, waits: Waits):
        """(metadata, tensors) from `peer` through hivemind's RPC (its protobuf parts), None when it sent none."""
        stub = self.get_stub(self._p2p, peer, namespace=self.prefix)
        rpc = stub.rpc_download_state if kind == "state" else stub.rpc_download_parameters
        stream = (await rpc(averaging_pb2.DownloadRequest())).__aiter__()
        try:
            first = await asyncio.wait_for(stream.__anext__(), waits.first)
        except StopAsyncIteration:
            return None  # no data: refused
        waits.arrived()
        metadata = None

        async def parts():  # hivemind's own reassembly takes the parts; the metadata rides on the first message
            nonlocal metadata
            async for message in _prepend(first, aiter_with_timeout(stream, timeout=waits.chunk)):
                if message.metadata:
                    metadata = self.serializer.loads(message.metadata)
                yield [message.tensor_part]

        tensors = await deserialize_tensor_stream(parts())
        return (metadata, tensors) if metadata else None


async def _open_stream(p2p, peer: PeerID, prefix: str, waits: Waits):
    try:
        _, reader, writer = await asyncio.wait_for(
            p2p.call_binary_stream_handler(peer, stream_handler_name(prefix)), waits.chunk)
    except ControlFailure as e:
        if "protocol" in str(e).lower():  # p2pd's words when the peer does not serve the handler
            raise ProtocolUnsupported(str(e)) from e
        raise
    return reader, writer


async def read_state(reader: asyncio.StreamReader, waits: Waits, serializer):
    """(metadata, tensors) as a state stream sends them, None when it closed without a frame (refused)."""
    frames = await _read_frames(reader, waits)
    return None if frames is None else (serializer.loads(frames[0]["metadata"]), frames[1])


async def _read_frames(reader: asyncio.StreamReader, waits: Waits) -> Optional[tuple[dict, list]]:
    """(the head, the tensors) of a state stream, None when it closed without a frame (refused)."""
    try:
        head = MSGPackSerializer.loads(await _read_frame(reader, waits.first, MAX_FRAME_HEADER))
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    if not isinstance(head, dict) or not isinstance(head.get("tensors"), int):
        raise ValueError("a state stream's head that is not {metadata, tensors}")
    waits.arrived()
    tensors = []
    for _ in range(head["tensors"]):
        description = runtime_pb2.Tensor.FromString(await _read_frame(reader, waits.chunk, MAX_FRAME_HEADER))
        tensors.append(await _read_tensor(reader, description, waits.chunk))
    return head, tensors


def parse_part(words: list[str]):
    """The part a request asks for, after its kind: none (the whole state), `part <first> <stop or end>` (a Part),
    or False: a request this version does not know (refused)."""
    if not words:
        return None
    if len(words) != 3 or words[0] != "part" or not words[1].isdigit() or not (words[2].isdigit() or words[2] == "end"):
        return False
    first, stop = int(words[1]), None if words[2] == "end" else int(words[2])
    return Part(first, stop) if stop is None or stop > first else False


async def _read_positions(reader: asyncio.StreamReader, timeout: float):
    return MSGPackSerializer.loads(await _read_frame(reader, timeout, MAX_FRAME_HEADER))


def unusable_state(loaded) -> str:
    """Why a donor's (metadata, tensors) cannot be taken, or "": the shape hivemind expects, and every tensor finite
    (the parameters, the optimizer's statistics and DiLoCo's outer momentum alike: one NaN poisons the peer)."""
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], dict)):
        return "not (metadata, tensors)"
    for index, tensor in enumerate(loaded[1]):
        if not isinstance(tensor, torch.Tensor):
            return f"part {index} is not a tensor"
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"tensor {index} of {len(loaded[1])} is not finite"
    return ""


def state_offers(found, own_peer_id: PeerID, allow_list, exclusions=None) -> dict[PeerID, float]:
    """Who offers its state in a `<prefix>.all_averagers` record that the DHT returned: peer -> priority (its
    epoch), without this peer, malformed entries and peers that stopped sharing (None). In a private swarm, insiders
    only: the DHT's record gate already drops outsiders' offers, and this holds where a record came another way (a
    node that stored it before the list changed), so a joiner never takes an outsider's state (issue 30). Never a
    peer this one excluded on evidence (`exclusions`, swarm/exclusion.py; issue 34)."""
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return {}
    offers = {}
    for subkey, entry in found.value.items():
        priority = entry.value if isinstance(entry, ValueWithExpiration) else None
        if not isinstance(priority, (int, float)) or isinstance(priority, bool):
            continue
        try:
            peer = PeerID(subkey)
        except Exception:  # noqa: BLE001 - a subkey that is no peer id: nobody to ask
            continue
        if peer != own_peer_id and admits_peer(allow_list, peer, "state_source") \
                and not_excluded(exclusions, peer, "state_source"):
            offers[peer] = float(priority)
    return offers


def donor_order(offers: dict[PeerID, float], exclusions=None) -> list[PeerID]:
    """Whom to ask for the state, in turn: upstream's order (the highest priority, i.e. the newest epoch, first; ties
    at random), except that suspects (evidence against them, not yet enough to exclude them: swarm/exclusion.py) come
    after everyone else: a liar not excluded yet offers the newest state as readily as anyone."""
    ties = {peer: random.random() for peer in offers}
    trusted = {peer: exclusions is None or not exclusions.suspected(peer.to_base58()) for peer in offers}
    return sorted(offers, key=lambda peer: (trusted[peer], offers[peer], ties[peer]), reverse=True)


@dataclasses.dataclass(frozen=True)
class Route:
    """One way to a donor's state: `fetch(waits)` gives (what came or None when refused, the way it came)."""

    donor: PeerID
    label: str  # for the log: the donor, and the forwarder where there is one
    fetch: Callable[[Waits], Awaitable[tuple[Optional[tuple], str]]]
    counts_refusals: bool = True  # a refusal counts as the donor's refusal of this peer (StateRefused)


@dataclasses.dataclass
class Waits:
    """How long a download waits for a peer: for its first bytes (it copies its state first, on cores that its
    training keeps busy: over 3 s for 241 MB in the join benchmark, where hivemind's next_chunk_timeout gave up on
    every peer in turn), and for each later chunk (next_chunk_timeout, as hivemind)."""

    first: float
    chunk: float
    began: float = dataclasses.field(default_factory=time.perf_counter)
    first_bytes: float = float("nan")  # seconds from `began`

    def arrived(self) -> None:
        self.first_bytes = time.perf_counter() - self.began


async def _prepend(first, rest):
    yield first
    async for item in rest:
        yield item


# --- the wire -------------------------------------------------------------------------------------------------


def _encode(tensor: torch.Tensor, info: CompressionInfo, compression) -> tuple[runtime_pb2.Tensor, memoryview]:
    """A tensor's description (hivemind's Tensor message without the buffer) and its bytes."""
    if isinstance(compression, NoCompression):  # the memory as it is, not a copy of it (upstream's tobytes)
        description = runtime_pb2.Tensor(
            compression=runtime_pb2.CompressionType.NONE, size=tensor.shape,
            dtype=str(tensor.dtype).replace("torch.", ""), requires_grad=tensor.requires_grad,
        )
        return description, _bytes_of(tensor.detach().contiguous())
    description = compression.compress(tensor, info, allow_inplace=False)
    payload = memoryview(description.buffer)
    description.ClearField("buffer")
    return description, payload


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


async def _write_frame(writer: asyncio.StreamWriter, payload, timeout: float) -> None:
    """The frame, waiting at most `timeout` for the reader to take each write."""
    payload = memoryview(payload).cast("B")
    writer.write(len(payload).to_bytes(LENGTH_BYTES, "big"))
    for start in range(0, len(payload), WRITE_BYTES):
        writer.write(payload[start:start + WRITE_BYTES])
        await asyncio.wait_for(writer.drain(), timeout)
    if not len(payload):
        await asyncio.wait_for(writer.drain(), timeout)


async def _read_length(reader: asyncio.StreamReader, timeout: float) -> int:
    return int.from_bytes(await asyncio.wait_for(reader.readexactly(LENGTH_BYTES), timeout), "big")


async def _read_frame(reader: asyncio.StreamReader, timeout: float, limit: int) -> bytes:
    length = await _read_length(reader, timeout)
    if length > limit:
        raise ValueError(f"a {length}-byte frame where at most {limit} bytes were expected")
    return await asyncio.wait_for(reader.readexactly(length), timeout)


async def _read_into(reader: asyncio.StreamReader, target: memoryview, timeout: float) -> None:
    """Fill `target` from the stream; at most `timeout` seconds without a byte."""
    filled, loop = 0, asyncio.get_running_loop()
    async with asyncio.timeout_at(loop.time() + timeout) as deadline:  # one timer, pushed on with every chunk
        while filled < len(target):
            chunk = await reader.read(len(target) - filled)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(target[:filled]), len(target))
            target[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
            deadline.reschedule(loop.time() + timeout)


async def _read_tensor(reader: asyncio.StreamReader, description: runtime_pb2.Tensor, timeout: float) -> torch.Tensor:
    length = await _read_length(reader, timeout)
    if description.compression == runtime_pb2.CompressionType.NONE:
        dtype = getattr(torch, description.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a tensor of unknown dtype {description.dtype!r}")
        shape = torch.Size(description.size)
        if length != shape.numel() * dtype.itemsize:
            raise ValueError(f"{length} bytes for a {dtype} tensor of shape {tuple(shape)}")
        # in shared memory from the start: the host process takes it through the pipe as it is, without the copy
        # into shared memory that pickling a private tensor would make
        tensor = torch.empty(shape, dtype=dtype).share_memory_()
        await _read_into(reader, _bytes_of(tensor), timeout)
        return tensor.requires_grad_(description.requires_grad)
    buffer = bytearray(length)
    await _read_into(reader, memoryview(buffer), timeout)
    description.buffer = bytes(buffer)
    return deserialize_torch_tensor(description)
