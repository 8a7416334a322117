"""The forwarder of swarm/upstream/state_forward.py on fake streams: it copies the donor's bytes unchanged and counts
them, and forwards nothing for a malformed request, a caller or donor it refuses, or with every slot taken."""

import asyncio
import multiprocessing as mp
import types

import pytest
from hivemind.p2p import PeerID

from fake_streams import RecordingWriter
from swarmd.swarm.upstream.state_forward import ForwardsState, forward_handler_name, parse_forward_request

CALLER = PeerID.from_base58("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")
DONOR = PeerID.from_base58("QmW2XHoXMrKJ6AypvMUrkjk3kzcfNqmnAVkuzNYdMgDwsv")
DONOR_BYTES = bytes(range(256)) * 9000  # 2.3 MB: more than one read of the donor's stream


class Refusing:
    """An allow list or exclusion list that refuses `refused` (base58 ids)."""

    def __init__(self, *refused):
        self.refused = set(refused)

    def admit(self, peer_id: str, where: str) -> bool:
        return peer_id not in self.refused


def forwarder(donor_bytes=DONOR_BYTES, allow_list=None, exclusions=None):
    asked = []

    async def call_binary_stream_handler(peer, handler):
        asked.append((peer, handler))
        reader = asyncio.StreamReader()
        reader.feed_data(donor_bytes)
        reader.feed_eof()
        averager.donor_writer = RecordingWriter()
        return None, reader, averager.donor_writer

    averager = types.SimpleNamespace(
        prefix="run_state_averager", request_timeout=5.0, next_chunk_timeout=None, _allow_list=allow_list,
        _exclusions=exclusions, forwarded_bytes=mp.Value("q", 0), asked=asked,
        _p2p=types.SimpleNamespace(call_binary_stream_handler=call_binary_stream_handler),
    )
    averager._forwards = lambda caller, donor: ForwardsState._forwards(averager, caller, donor)
    averager._forward = lambda donor, kind, writer: ForwardsState._forward(averager, donor, kind, writer)
    return averager


def forwarded(averager, request: bytes) -> bytes:
    async def serve():
        averager._forward_slots = asyncio.Semaphore(averager.__dict__.pop("slots", 2))
        if averager.__dict__.pop("busy", False):
            await averager._forward_slots.acquire()
            await averager._forward_slots.acquire()
        reader, writer = asyncio.StreamReader(), RecordingWriter()
        reader.feed_data(request)
        await ForwardsState._serve_forward(averager, types.SimpleNamespace(peer_id=CALLER), reader, writer)
        assert writer.closed
        return bytes(writer.data)

    return asyncio.run(serve())


def test_the_donors_bytes_go_to_the_caller_unchanged_and_are_counted():
    averager = forwarder()
    assert forwarded(averager, f"state {DONOR.to_base58()}\n".encode()) == DONOR_BYTES
    assert averager.asked == [(DONOR, "run_state_averager::swarmd.StateStream/1")]
    assert bytes(averager.donor_writer.data) == b"state\n" and averager.donor_writer.closed
    assert averager.forwarded_bytes.value == len(DONOR_BYTES)


@pytest.mark.parametrize("request_line", [
    b"optimizer QmW2XHoXMrKJ6AypvMUrkjk3kzcfNqmnAVkuzNYdMgDwsv\n",  # a kind it does not know
    b"state\n", b"state not-a-peer-id\n", b"state QmW2 QmW2\n", b"\xff\xfe\n",
    b"state " + b"Q" * 200 + b"\n",
])
def test_a_malformed_request_is_forwarded_nowhere(request_line):
    averager = forwarder()
    assert forwarded(averager, request_line) == b"" and averager.asked == []
    assert parse_forward_request(request_line) is None


@pytest.mark.parametrize("who", ["caller-not-listed", "donor-not-listed", "caller-excluded", "donor-excluded", "busy"])
def test_nothing_is_forwarded_for_a_refused_caller_or_donor_or_with_every_slot_taken(who):
    refused = {"caller": CALLER.to_base58(), "donor": DONOR.to_base58()}.get(who.split("-")[0])
    averager = forwarder(allow_list=Refusing(refused) if who.endswith("listed") else None,
                         exclusions=Refusing(refused) if who.endswith("excluded") else None)
    averager.busy = who == "busy"
    assert forwarded(averager, f"parameters {DONOR.to_base58()}\n".encode()) == b""
    assert averager.asked == [] and averager.forwarded_bytes.value == 0


def test_the_forward_handler_is_named_after_the_averager():
    assert forward_handler_name("run_state_averager") == "run_state_averager::swarmd.StateForward/1"
    assert parse_forward_request(f"parameters {DONOR.to_base58()}\n".encode()) == ("parameters", DONOR)
