"""A state download through a forwarder (swarm/upstream/state_forward.py), between real averagers on real p2pd
daemons: a client (it only dials out, as a peer behind NAT) offers its state; another client, which cannot ask it
directly (it does not offer in `all_averagers`), takes its exact tensors through the reachable peer both are connected
to, which counts the bytes it forwarded. Behind real NAT: tests/swarm/test_router_lab.py."""

import time

import pytest
import torch
from hivemind.averaging import DecentralizedAverager

from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
from swarmd.swarm.upstream.state_forward import ForwardsState

pytestmark = pytest.mark.timeout(180)


class ForwardingAverager(UpstreamRpcNames, ForwardsState, DecentralizedAverager):
    _upstream = DecentralizedAverager
    _rpc_handlers = None

    def get_current_state(self):
        metadata, tensors, infos = super().get_current_state()
        return dict(metadata, served_by=str(self.peer_id)), tensors, infos


def donor_state():
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(200_000, generator=generator), torch.randn(3, 5, generator=generator),
            torch.arange(9, dtype=torch.int64)]


@pytest.fixture
def contact_and_two_clients():
    contact = ToleratesExitedCallers(start=True)
    clients = [ToleratesExitedCallers(initial_peers=contact.get_visible_maddrs(), client_mode=True, start=True)
               for _ in range(2)]
    yield contact, *clients
    for dht in (*clients, contact):
        dht.shutdown()


def test_a_client_takes_another_clients_state_through_the_peer_both_are_connected_to(contact_and_two_clients):
    contact_dht, donor_dht, joiner_dht = contact_and_two_clients
    state = donor_state()
    prefix = "forward-test"
    # the contact holds no state it serves (as an --auxiliary peer): only the forward can bring the donor's
    contact = ForwardingAverager([torch.zeros(1)], contact_dht, prefix=prefix, target_group_size=2,
                                 allow_state_sharing=False, start=True)
    donor = ForwardingAverager(state, donor_dht, prefix=prefix, target_group_size=2, start=True)
    joiner = ForwardingAverager([torch.zeros_like(t) for t in state], joiner_dht, prefix=prefix, target_group_size=2,
                                start=True, serves_as_client=False)
    try:
        assert donor.client_mode and joiner.client_mode and not contact.client_mode
        assert joiner.load_state_from_peers(timeout=10) is None  # nobody offers yet: the donor offers at its step
        donor.offer_state_as_client(5)
        deadline, loaded = time.monotonic() + 60, None
        while loaded is None:
            assert time.monotonic() < deadline, "no state came through the contact in 60 s"
            time.sleep(0.5)
            loaded = joiner.load_state_from_peers(timeout=30)
        metadata, tensors = loaded
        assert metadata["served_by"] == str(donor.peer_id)
        assert [t.dtype for t in tensors] == [t.dtype for t in state]
        assert all(torch.equal(got, sent) for got, sent in zip(tensors, state))
        payload = sum(t.numel() * t.element_size() for t in state)
        assert payload <= contact.forwarded_bytes.value < payload + 64 * 1024  # the tensors and their frames
        assert joiner.download_refusals.value == 0  # a forwarder's "no" is not the donor's refusal

        donor.offer_state_as_client(None)  # withdrawn (catching up): not asked any more
        deadline = time.monotonic() + 30
        while joiner.load_state_from_peers(timeout=10) is not None:
            assert time.monotonic() < deadline, "the withdrawn offer was still taken after 30 s"
            time.sleep(0.5)
    finally:
        for averager in (joiner, donor, contact):
            averager.shutdown()
