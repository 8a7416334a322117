"""A state download by swarmd's state stream (swarm/upstream/state_stream.py), between real averagers on real p2pd daemons:
the joiner takes the donor's exact tensors and metadata by the stream alone, and from a peer without the stream (plain
hivemind) by hivemind's RPC; a donor whose state does not fit the joiner's layout is passed over for the next."""

import time
from typing import AsyncIterator

import pytest
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2

from swarmd.swarm.state_layout import StateLayout
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
from swarmd.swarm.upstream.state_stream import DownloadsState, state_offers

pytestmark = pytest.mark.timeout(180)


class StreamingAverager(UpstreamRpcNames, DownloadsState, DecentralizedAverager):
    _upstream = DecentralizedAverager  # hivemind's RPC names, which a plain peer serves
    _rpc_handlers = None


class StreamOnlyDonor(StreamingAverager):
    """Serves its state by the stream only: its hivemind RPC answers with no data, as a refusing peer does."""

    async def rpc_download_state(
        self, request: averaging_pb2.DownloadRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.DownloadData]:
        return
        yield

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        return dict(metadata, served_by="donor"), tensors, infos


def donor_state():
    generator = torch.Generator().manual_seed(5)
    return [torch.randn(300_000, generator=generator), torch.randn(3, 5, generator=generator),
            torch.arange(7, dtype=torch.int64), torch.randn(4, generator=generator).to(torch.bfloat16)]


@pytest.fixture
def two_dhts():
    first = ToleratesExitedCallers(start=True)
    second = ToleratesExitedCallers(initial_peers=first.get_visible_maddrs(), start=True)
    yield first, second
    second.shutdown()
    first.shutdown()


def download_within(joiner, seconds: float):
    """The joiner's download, asked again until the donor's offer is visible in the DHT (every few seconds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loaded = joiner.load_state_from_peers(timeout=30)
        if loaded is not None:
            return loaded
        time.sleep(0.5)
    raise AssertionError(f"no state downloaded within {seconds} s")


@pytest.mark.parametrize("donor_class", [StreamOnlyDonor, DecentralizedAverager], ids=["stream", "plain-hivemind"])
def test_a_joiner_downloads_the_exact_state_by_stream_or_from_a_plain_peer_by_rpc(two_dhts, donor_class):
    first, second = two_dhts
    state = donor_state()
    donor = donor_class(state, first, prefix="stream-test", target_group_size=2, start=True)
    joiner = StreamingAverager([torch.zeros_like(t) for t in state], second, prefix="stream-test",
                               target_group_size=2, start=True)
    try:
        metadata, tensors = download_within(joiner, 60)
        assert [t.dtype for t in tensors] == [t.dtype for t in state]
        assert all(torch.equal(got, sent) for got, sent in zip(tensors, state))
        assert "group_key" in metadata  # the donor's own metadata
        if donor_class is StreamOnlyDonor:  # nothing came by hivemind's RPC: the stream carried it
            assert metadata["served_by"] == "donor"
    finally:
        joiner.shutdown()
        donor.shutdown()


def test_an_averager_shut_down_leaves_the_stream_free_for_the_next_of_its_prefix(two_dhts):
    """p2pd refuses a second handler of one name: a peer that rebuilds its optimizer on the same DHT (a test, a
    restarted worker) would fail to start its state averager, had the first not removed its handler."""
    first, second = two_dhts
    state = donor_state()
    StreamOnlyDonor(state, first, prefix="stream-again", target_group_size=2, start=True).shutdown()
    donor = StreamOnlyDonor(state, first, prefix="stream-again", target_group_size=2, start=True)
    joiner = StreamingAverager([torch.zeros_like(t) for t in state], second, prefix="stream-again",
                               target_group_size=2, start=True)
    try:
        metadata, tensors = download_within(joiner, 60)
        assert metadata["served_by"] == "donor" and all(torch.equal(a, b) for a, b in zip(tensors, state))
    finally:
        joiner.shutdown()
        donor.shutdown()


class CheckingJoiner(StreamingAverager):
    """Takes only a state of its own tensors' shapes (as ObservedStateAverager.state_layout, without an optimizer)."""

    def state_layout(self, kind):
        with self.get_tensors() as tensors:
            shapes = tuple(tuple(t.shape) for t in tensors)
        return StateLayout(shapes)


class MisfitDonor(StreamOnlyDonor):
    """Sends one number per tensor, which hivemind's loader would broadcast into every weight."""

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        return dict(metadata, served_by="misfit"), [t.reshape(-1)[:1].clone() for t in tensors], None


def test_a_donor_whose_state_does_not_fit_is_passed_over_for_the_next(two_dhts):
    first, second = two_dhts
    third = ToleratesExitedCallers(initial_peers=first.get_visible_maddrs(), start=True)
    state = donor_state()
    misfit = MisfitDonor(state, first, prefix="stream-misfit", target_group_size=2, start=True)
    misfit.state_sharing_priority = 10.0  # asked first: it claims the newest state
    honest = StreamOnlyDonor(state, third, prefix="stream-misfit", target_group_size=2, start=True)
    joiner = CheckingJoiner([torch.zeros_like(t) for t in state], second, prefix="stream-misfit",
                            target_group_size=2, start=True)
    try:
        deadline = time.monotonic() + 60
        while len(state_offers(second.get("stream-misfit.all_averagers", latest=True), second.peer_id, None)) < 2:
            assert time.monotonic() < deadline, "the two donors' offers did not reach the joiner's DHT in 60 s"
            time.sleep(0.5)
        metadata, tensors = joiner.load_state_from_peers(timeout=30)  # the misfit's (higher) offer is asked first
        assert metadata["served_by"] == "donor" and all(torch.equal(a, b) for a, b in zip(tensors, state))
    finally:
        for averager in (joiner, honest, misfit):
            averager.shutdown()
        third.shutdown()


# A donor in a process of its own, whose stream sends at about 20 MB/s (so that a download takes seconds), and which
# touches a file when it begins to send: killed then, it dies mid-download.
SLOW_DONOR = r"""
import asyncio, sys, time
import torch
from hivemind.averaging import DecentralizedAverager
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
from swarmd.swarm.upstream.state_stream import DownloadsState

initial_peers, prefix, began_file = sys.argv[1].split(","), sys.argv[2], sys.argv[3]

class SlowWriter:
    def __init__(self, writer):
        self.writer = writer
    def write(self, data):
        self.writer.write(data)
    async def drain(self):
        await asyncio.sleep(0.05)  # per 1 MB write
        await self.writer.drain()
    def close(self):
        self.writer.close()

class SlowDonor(UpstreamRpcNames, DownloadsState, DecentralizedAverager):
    _upstream = DecentralizedAverager
    _rpc_handlers = None
    async def _serve_state_stream(self, stream_info, reader, writer):
        open(began_file, "w").close()
        await super()._serve_state_stream(stream_info, reader, SlowWriter(writer))

dht = ToleratesExitedCallers(initial_peers=initial_peers, start=True)
donor = SlowDonor([torch.ones(12_500_000)], dht, prefix=prefix, target_group_size=2, start=True)
donor.state_sharing_priority = 10.0  # asked first: it offers the newest state
print("ready", flush=True)
time.sleep(600)
"""


def test_a_donor_killed_mid_download_costs_the_joiner_seconds_not_a_timeout(two_dhts, tmp_path):
    """The donor asked first dies while it sends (its processes killed, as a peer that crashes or is stopped): the
    joiner takes the next donor's state at once, not after the chunk timeout (30 s here) or a retry."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    first, second = two_dhts
    state = [torch.full((12_500_000,), 2.0)]  # 50 MB, as the slow donor's
    prefix, began_file = "stream-killed", tmp_path / "began"
    honest = StreamOnlyDonor(state, first, prefix=prefix, target_group_size=2, start=True)
    slow = subprocess.Popen(
        [sys.executable, "-c", SLOW_DONOR, ",".join(map(str, first.get_visible_maddrs())), prefix, str(began_file)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    joiner = StreamingAverager([torch.zeros_like(t) for t in state], second, prefix=prefix, target_group_size=2,
                               next_chunk_timeout=30.0, start=True)
    try:
        assert slow.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        # both offers, the slow donor's with its priority (declared again after it was set): it is asked first
        while not _offered(state_offers(second.get(f"{prefix}.all_averagers", latest=True), second.peer_id, None)):
            assert time.monotonic() < deadline, "the two donors' offers did not reach the joiner's DHT in 60 s"
            time.sleep(0.5)
        result = {}
        download = threading.Thread(target=lambda: result.update(loaded=joiner.load_state_from_peers(timeout=60)))
        began = time.monotonic()
        download.start()
        while not began_file.exists():
            assert time.monotonic() - began < 30, "the slow donor was never asked"
            time.sleep(0.05)
        time.sleep(1.0)  # a second into its 2.5 s of sending
        os.killpg(slow.pid, signal.SIGKILL)
        killed = time.monotonic()
        download.join(60)
        took = time.monotonic() - killed
        metadata, tensors = result["loaded"]
        assert metadata["served_by"] == "donor" and torch.equal(tensors[0], state[0])
        print(f"the joiner had the next donor's state {took:.2f} s after the first donor was killed")
        assert took < 10.0, f"{took:.1f} s: the joiner waited on the dead donor"
    finally:
        if slow.poll() is None:
            os.killpg(slow.pid, signal.SIGKILL)
        slow.wait(10)
        joiner.shutdown()
        honest.shutdown()


def _offered(offers: dict) -> bool:
    return len(offers) >= 2 and max(offers.values()) >= 10.0
