"""The state stream's wire (swarm/upstream/state_stream.py), server and downloader joined by an in-memory pipe: what each
request carries, in which form, and how a broken or refusing peer ends a download."""

import asyncio
import types

import pytest
import torch
from hivemind.compression import CompressionInfo, Float16Compression, NoCompression, TensorRole
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.utils import ControlFailure
from hivemind.proto import runtime_pb2
from hivemind.utils import MSGPackSerializer

from fake_streams import RecordingWriter
from swarmd.swarm.upstream.state_stream import (
    LENGTH_BYTES, DownloadsState, ProtocolUnsupported, Waits, parse_part, shared_copy, stream_handler_name,
)
from swarmd.swarm.state_parts import Part

PEER = PeerID.from_base58("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")


def state():
    """Parameters of several dtypes and shapes (a scalar, an empty one), then two optimizer statistics."""
    tensors = [torch.randn(5, 3, requires_grad=True), torch.tensor(2.5), torch.zeros(0, 4),
               torch.arange(6, dtype=torch.int64), torch.randn(7).to(torch.bfloat16),
               torch.rand(5, 3), torch.rand(5, 3)]
    roles = [TensorRole.PARAMETER] * 5 + [TensorRole.OPTIMIZER] * 2
    infos = [CompressionInfo.from_tensor(t, key=i, role=role) for i, (t, role) in enumerate(zip(tensors, roles))]
    return tensors, infos


def server(tensors, infos, compression=NoCompression()):
    async def current_state():
        return MSGPackSerializer.dumps({"epoch": 7}), tensors, infos

    async def part_from_host(kind, part, positions):
        """As DownloadsState._part_from_host_process: the request, then the host's served_state (in this process)."""
        averager._part_requests.put((kind, part.first, part.stop, positions))
        metadata, served, served_infos = DownloadsState.served_state(averager, {"epoch": 7}, tensors, infos)
        return MSGPackSerializer.dumps(metadata), served, served_infos

    averager = types.SimpleNamespace(
        request_timeout=5.0, next_chunk_timeout=None, allow_state_sharing=True, _allow_list=None,
        state_compression=compression, _get_current_state_from_host_process=current_state,
        _part_from_host_process=part_from_host, _part_requests=Requests(),
    )
    averager._shares_state = lambda: averager.allow_state_sharing  # DownloadsState's own
    return averager


class Requests(list):
    """The host's queue of part requests, in one process."""

    put = list.append

    def empty(self):
        return not self

    def get(self):
        return self.pop(0)


async def served_bytes(averager, request: bytes) -> bytes:
    reader, writer = asyncio.StreamReader(), RecordingWriter()
    reader.feed_data(request)
    await DownloadsState._serve_state_stream(averager, types.SimpleNamespace(peer_id=PEER), reader, writer)
    assert writer.closed
    return bytes(writer.data)


def downloader(answer: bytes):
    """An averager whose p2p 'opens a stream' that answers with `answer`; records what it was asked."""
    asked = RecordingWriter()

    async def open_stream(peer, name):
        reader = asyncio.StreamReader()
        reader.feed_data(answer)
        reader.feed_eof()
        downloader.opened = name
        return None, reader, asked

    averager = types.SimpleNamespace(prefix="run_state_averager", serializer=MSGPackSerializer,
                                     _p2p=types.SimpleNamespace(call_binary_stream_handler=open_stream))
    return averager, asked


def download(kind: str, answer: bytes):
    averager, asked = downloader(answer)
    loaded = asyncio.run(DownloadsState._download_stream(averager, PEER, kind, Waits(first=5.0, chunk=5.0)))
    assert bytes(asked.data) == kind.encode() + b"\n" and asked.closed
    assert downloader.opened == stream_handler_name("run_state_averager")
    return loaded


def round_trip(kind: str, tensors, infos, compression=NoCompression()):
    return download(kind, asyncio.run(served_bytes(server(tensors, infos, compression), kind.encode() + b"\n")))


def test_the_state_arrives_exact_in_shared_memory_with_its_metadata():
    tensors, infos = state()
    metadata, received = round_trip("state", tensors, infos)
    assert metadata == {"epoch": 7}
    assert [(t.dtype, t.shape, t.requires_grad) for t in received] == [
        (t.dtype, t.shape, t.requires_grad) for t in tensors]
    assert all(torch.equal(got, sent.detach()) for got, sent in zip(received, tensors))
    # the host process takes shared tensors through the pipe without copying them into shared memory again
    assert all(t.is_shared() for t in received)


def test_parameters_leave_the_optimizer_statistics_out():
    tensors, infos = state()
    _, received = round_trip("parameters", tensors, infos)
    assert len(received) == 5
    assert all(torch.equal(got, sent.detach()) for got, sent in zip(received, tensors[:5]))


def test_a_compressed_state_goes_compressed_and_arrives_decoded():
    tensors = [torch.randn(1000), torch.randn(10, 10)]
    infos = [CompressionInfo.from_tensor(t, key=i) for i, t in enumerate(tensors)]
    wire = asyncio.run(served_bytes(server(tensors, infos, Float16Compression()), b"state\n"))
    assert len(wire) < 1100 * 4 * 0.6  # half the bytes of fp32, and a little for the frames
    _, received = download("state", wire)
    assert [t.dtype for t in received] == [torch.float32, torch.float32]
    assert all(torch.allclose(got, sent, atol=1e-2, rtol=1e-3) for got, sent in zip(received, tensors))


def test_a_refusal_or_an_unknown_request_sends_nothing_and_the_downloader_reads_it_as_refused():
    tensors, infos = state()
    averager = server(tensors, infos)
    assert asyncio.run(served_bytes(averager, b"optimizer\n")) == b""
    averager.allow_state_sharing = False
    assert asyncio.run(served_bytes(averager, b"state\n")) == b""
    assert download("state", b"") is None


def frame(payload: bytes, length=None) -> bytes:
    return (len(payload) if length is None else length).to_bytes(LENGTH_BYTES, "big") + payload


def test_a_broken_peer_fails_the_download_instead_of_passing_for_a_refusal():
    tensors, infos = state()
    wire = asyncio.run(served_bytes(server(tensors, infos), b"state\n"))
    with pytest.raises(asyncio.IncompleteReadError):  # the stream ends inside a tensor
        download("state", wire[:-3])
    with pytest.raises(ValueError, match="frame"):  # a description that would take a gigabyte
        download("state", frame(MSGPackSerializer.dumps({"metadata": b"", "tensors": 1})) + frame(b"", 1 << 30))
    description = runtime_pb2.Tensor(compression=runtime_pb2.CompressionType.NONE, size=[4], dtype="float16")
    head = frame(MSGPackSerializer.dumps({"metadata": MSGPackSerializer.dumps({}), "tensors": 1}))
    with pytest.raises(ValueError, match="bytes for a torch.float16 tensor"):  # 4 values of fp16 are 8 bytes
        download("state", head + frame(description.SerializeToString()) + frame(b"\0" * 16))
    description.dtype = "DataFrame"
    with pytest.raises(ValueError, match="unknown dtype"):
        download("state", head + frame(description.SerializeToString()) + frame(b"\0" * 8))


def part_request(kind: str, part: Part, positions) -> bytes:
    return f"{kind} part {part.words()}\n".encode() + frame(MSGPackSerializer.dumps(positions))


def test_a_part_comes_with_the_values_at_the_positions_asked_for_of_the_rest():
    tensors, infos = state()
    positions = [[0, [0, 14]], [4, [6]], [5, [1, 2]]]  # tensors outside the part asked for: 0, 4 and a statistic
    wire = asyncio.run(served_bytes(server(tensors, infos), part_request("state", Part(1, 4), positions)))
    averager, asked = downloader(wire)
    metadata, received, samples = asyncio.run(DownloadsState.download_part(
        averager, PEER, "state", Part(1, 4), positions, Waits(first=5.0, chunk=5.0)))
    assert bytes(asked.data) == part_request("state", Part(1, 4), positions)
    assert metadata == {"epoch": 7}
    assert len(received) == 3 and all(torch.equal(a, b) for a, b in zip(received, tensors[1:4]))
    expected = [tensors[0].reshape(-1)[0], tensors[0].reshape(-1)[14], tensors[4][6], tensors[5].reshape(-1)[1],
                tensors[5].reshape(-1)[2]]
    assert torch.frombuffer(bytearray(samples), dtype=torch.float64).tolist() == [float(v.detach()) for v in expected]
    end = asyncio.run(served_bytes(server(tensors, infos), part_request("parameters", Part(3, None), [])))
    _, received, samples = asyncio.run(DownloadsState.download_part(
        downloader(end)[0], PEER, "parameters", Part(3, None), [], Waits(first=5.0, chunk=5.0)))
    assert samples == b"" and len(received) == 2  # tensors 3 and 4: the parameters end there


@pytest.mark.parametrize("request_bytes", [
    b"state part 2\n", b"state part 3 1\n", b"state piece 0 end\n", b"state part -1 end\n",
    part_request("state", Part(9, None), []),  # past the state's end
    part_request("state", Part(0, 2), [[0, [15]]]),  # position 15 of a 5x3 tensor
    part_request("state", Part(0, 2), [[7, [0]]]),  # no tensor 7
    part_request("state", Part(0, 2), {"0": 1}),
    part_request("state", Part(0, 2), [[0, list(range(15))]] * 5000),  # over MAX_POSITIONS
])
def test_a_part_request_that_does_not_fit_is_refused_with_nothing_sent(request_bytes):
    tensors, infos = state()
    assert asyncio.run(served_bytes(server(tensors, infos), request_bytes)) == b""


def test_part_words_read_back_as_the_part():
    assert parse_part([]) is None and parse_part(["part", "2", "end"]) == Part(2, None)
    assert parse_part(["part", "0", "5"]) == Part(0, 5) and parse_part(["part", "5", "5"]) is False


def test_a_peer_without_the_stream_is_told_apart_from_a_peer_that_cannot_be_reached():
    def failing(message):
        async def open_stream(peer, name):
            raise ControlFailure(f"Connect failed. msg={message}")

        return types.SimpleNamespace(prefix="p", serializer=MSGPackSerializer,
                                     _p2p=types.SimpleNamespace(call_binary_stream_handler=open_stream))

    def download_from(averager):
        return asyncio.run(DownloadsState._download_stream(averager, PEER, "state", Waits(5.0, 5.0)))

    with pytest.raises(ProtocolUnsupported):
        download_from(failing("protocols not supported"))
    with pytest.raises(ControlFailure):
        download_from(failing("failed to dial: no addresses"))


def test_a_served_state_is_a_shared_copy_that_training_cannot_change():
    live = torch.randn(4, 3, requires_grad=True)
    copy = shared_copy(live)
    assert copy.is_shared() and not live.is_shared() and torch.equal(copy, live.detach())
    with torch.no_grad():
        live.add_(1.0)  # the training's next step, while the averager's process still streams the copy
    assert not torch.equal(copy, live.detach())
    assert shared_copy(torch.arange(3).to(torch.bfloat16)).dtype == torch.bfloat16


def test_a_peer_may_take_its_time_before_the_first_bytes_but_not_between_chunks():
    """A serving peer copies its state before it sends a byte (seconds for a large model on a busy core): that wait
    is the download's own timeout; each later wait is next_chunk_timeout, as hivemind's."""
    tensors, infos = state()
    wire = asyncio.run(served_bytes(server(tensors, infos), b"state\n"))

    async def download_fed(waits: Waits, *pieces):
        """The answer arrives as (delay, bytes) pieces."""
        reader = asyncio.StreamReader()

        async def feed():
            for delay, data in pieces:
                await asyncio.sleep(delay)
                reader.feed_data(data)
            reader.feed_eof()

        async def open_stream(peer, name):
            return None, reader, RecordingWriter()

        averager = types.SimpleNamespace(prefix="p", serializer=MSGPackSerializer,
                                         _p2p=types.SimpleNamespace(call_binary_stream_handler=open_stream))
        feeding = asyncio.create_task(feed())
        try:
            return await DownloadsState._download_stream(averager, PEER, "state", waits)
        finally:
            feeding.cancel()

    waits = Waits(first=1.0, chunk=0.2)
    _, received = asyncio.run(download_fed(waits, (0.5, wire)))  # the first bytes after 0.5 s: within `first`
    assert len(received) == len(tensors) and waits.first_bytes >= 0.5
    with pytest.raises(TimeoutError):  # then 0.5 s without a byte in the middle: more than `chunk`
        asyncio.run(download_fed(Waits(first=1.0, chunk=0.2), (0.0, wire[:100]), (0.5, wire[100:])))


def test_hivemind_rpc_parts_make_the_same_state_and_wait_as_long_for_the_first():
    from hivemind.compression import serialize_torch_tensor
    from hivemind.proto import averaging_pb2
    from hivemind.utils.streaming import split_for_streaming

    tensors = [torch.randn(40_000), torch.arange(5, dtype=torch.int64)]
    messages = [averaging_pb2.DownloadData(tensor_part=part)
                for tensor in tensors for part in split_for_streaming(serialize_torch_tensor(tensor))]
    messages[0].metadata = MSGPackSerializer.dumps({"epoch": 3})
    assert len(messages) > 3  # several parts for the first tensor

    async def answer(first_delay: float):
        await asyncio.sleep(first_delay)
        for message in messages:
            yield message

    def averager(first_delay: float):
        async def rpc_download_state(request):
            return answer(first_delay)

        stub = types.SimpleNamespace(rpc_download_state=rpc_download_state)
        return types.SimpleNamespace(prefix="p", serializer=MSGPackSerializer, _p2p=None,
                                     get_stub=lambda p2p, peer, namespace: stub)

    waits = Waits(first=1.0, chunk=0.2)
    metadata, received = asyncio.run(DownloadsState._download_rpc(averager(0.5), PEER, "state", waits))
    assert metadata == {"epoch": 3} and waits.first_bytes >= 0.5
    assert all(torch.equal(got, sent) for got, sent in zip(received, tensors)) and len(received) == 2
    with pytest.raises(TimeoutError):
        asyncio.run(DownloadsState._download_rpc(averager(0.5), PEER, "state", Waits(first=0.2, chunk=0.2)))


def test_a_downloader_that_stops_reading_is_let_go():
    """The server holds a copy of its state while it sends: a downloader that takes nothing for next_chunk_timeout
    does not pin it for ever."""
    tensors, infos = state()
    averager = server(tensors, infos)
    averager.next_chunk_timeout = 0.2

    class StuckWriter(RecordingWriter):
        async def drain(self):
            if len(self.data) > 64:  # took the first frame, then reads no more
                await asyncio.Event().wait()

    async def serve():
        reader, writer = asyncio.StreamReader(), StuckWriter()
        reader.feed_data(b"state\n")
        began = asyncio.get_running_loop().time()
        await asyncio.wait_for(DownloadsState._serve_state_stream(
            averager, types.SimpleNamespace(peer_id=PEER), reader, writer), 5.0)
        return writer, asyncio.get_running_loop().time() - began

    writer, seconds = asyncio.run(serve())
    assert writer.closed and 0.2 <= seconds < 2.0


def test_the_host_copies_only_the_part_asked_for_and_reports_the_positions_from_the_rest():
    tensors, infos = state()
    host = types.SimpleNamespace(_part_requests=Requests())
    copied = []

    def copy(tensor):
        copied.append(tensor)
        return tensor.clone()

    _, whole, _ = DownloadsState.served_state(host, {}, tensors, infos, copy=copy)
    assert len(whole) == len(copied) == len(tensors)  # no request: every tensor
    copied.clear()
    host._part_requests.put(("state", 1, 3, [[0, [2]], [5, [0, 1]]]))
    _, part, part_infos = DownloadsState.served_state(host, {}, tensors, infos, copy=copy)
    assert [t is s for t, s in zip(copied, tensors[1:3])] == [True, True] and len(copied) == 2  # the part alone
    assert len(part) == 3 and len(part_infos) == 3 and torch.equal(part[0], tensors[1])
    assert part[-1].tolist() == [float(tensors[0].reshape(-1)[2].detach()), float(tensors[5].reshape(-1)[0]),
                                 float(tensors[5].reshape(-1)[1])]
    host._part_requests.put(("parameters", 4, None, []))  # tensor 4 is the last parameter
    _, last, _ = DownloadsState.served_state(host, {}, tensors, infos, copy=copy)
    assert len(last) == 2 and torch.equal(last[0].to(torch.float32), tensors[4].to(torch.float32))
    for request in (("parameters", 5, None, []), ("state", 0, 2, [[0, [99]]])):  # past the end; out of range
        host._part_requests.put(request)
        assert DownloadsState.served_state(host, {}, tensors, infos, copy=copy)[1] == []
    assert host._part_requests.empty()  # every request met its own ask
