"""A state download split across three donors (swarm/upstream/split_download.py), between real averagers on real p2pd
daemons: each donor sends a part, one of them lies (its parameters sign-flipped, as an attacker that offers the
newest epoch), and the joiner takes the honest donors' exact state, the liar's part asked again of an honest one."""

import multiprocessing as mp
import time

import pytest
import torch
from hivemind.averaging import DecentralizedAverager

from swarmd.swarm.state_layout import StateLayout
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
from swarmd.swarm.upstream.split_download import SplitsDownloads
from swarmd.swarm.upstream.state_stream import state_offers

pytestmark = pytest.mark.timeout(180)
PREFIX = "split-test"


class SplittingAverager(UpstreamRpcNames, SplitsDownloads, DecentralizedAverager):
    """Takes only a state of its own tensors' shapes (as ObservedStateAverager.state_layout); counts the parts it
    served."""

    _upstream = DecentralizedAverager
    _rpc_handlers = None

    def __init__(self, *args, lie: bool = False, **kwargs):
        self.lie, self.parts_served = lie, mp.Value("i", 0)
        super().__init__(*args, **kwargs)

    def state_layout(self, kind):
        with self.get_tensors() as tensors:
            return StateLayout(tuple(tuple(t.shape) for t in tensors))

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        return metadata, [-t for t in tensors] if self.lie else tensors, infos

    async def _serve_state_stream(self, stream_info, reader, writer):
        await super()._serve_state_stream(stream_info, reader, writer)
        with self.parts_served.get_lock():
            self.parts_served.value += 1


def state():
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(400, 500, generator=generator), torch.randn(500, generator=generator),
            torch.randn(500, 300, generator=generator), torch.randn(300, generator=generator)]


@pytest.fixture
def four_dhts():
    first = ToleratesExitedCallers(start=True)
    others = [ToleratesExitedCallers(initial_peers=first.get_visible_maddrs(), start=True) for _ in range(3)]
    yield [first, *others]
    for node in [*others, first]:
        node.shutdown()


def test_three_donors_send_a_part_each_and_a_liar_among_them_is_outvoted(four_dhts):
    honest = state()
    donors = [SplittingAverager(honest if i != 1 else state(), dht, prefix=PREFIX, target_group_size=2, lie=i == 1,
                                start=True) for i, dht in enumerate(four_dhts[:3])]
    joiner = SplittingAverager([torch.zeros_like(t) for t in honest], four_dhts[3], prefix=PREFIX,
                               target_group_size=2, start=True)
    try:
        deadline = time.monotonic() + 60
        while len(state_offers(four_dhts[3].get(f"{PREFIX}.all_averagers", latest=True), joiner.peer_id, None)) < 3:
            assert time.monotonic() < deadline, "the three donors' offers did not reach the joiner's DHT in 60 s"
            time.sleep(0.5)
        began = time.monotonic()
        loaded = joiner.load_state_from_peers(timeout=60)
        took = time.monotonic() - began
        assert loaded is not None, "no state came"
        assert all(torch.equal(got, sent) for got, sent in zip(loaded[1], honest)), "the liar's part was taken"
        served = [donor.parts_served.value for donor in donors]
        print(f"parts served by honest, liar, honest: {served}; the download took {took:.2f} s")
        # a part each, the liar's asked again of an honest donor (and, on a loaded machine, a straggler's too)
        assert served[1] == 1 and sum(served) >= 4
    finally:
        joiner.shutdown()
        for donor in donors:
            donor.shutdown()
