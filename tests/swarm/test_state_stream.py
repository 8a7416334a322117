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
