"""SwarmOptimizer's averagers must speak hivemind's protocol: same RPC names as the upstream classes."""

import pytest

from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager

from swarmd.swarm.upstream.gradient_averager import GradientAveragerKeepingOwn
from swarmd.swarm.upstream.state_averager import ObservedStateAverager, bounded_search


@pytest.mark.parametrize(
    "ours, upstream",
    [(ObservedStateAverager, TrainingStateAverager), (GradientAveragerKeepingOwn, GradientAverager)],
)
def test_rpc_handler_names_are_upstreams(ours, upstream):
    for method in ("rpc_join_group", "rpc_aggregate_part", "rpc_download_state"):
        assert ours._get_handle_name("run_grad_averager", method) == upstream._get_handle_name("run_grad_averager", method)
    ours._collect_rpc_handlers()
    upstream._collect_rpc_handlers()
    # plus, on the state averager, the parameters alone (swarm/upstream/parameter_refresh.py), which upstream lacks
    extra = {"rpc_download_parameters"} if ours is ObservedStateAverager else set()
    assert {h.method_name for h in ours._rpc_handlers} == {h.method_name for h in upstream._rpc_handlers} | extra


def test_the_round_recording_hook_sits_between_the_state_averager_and_hivemind():
    mro = ObservedStateAverager.__mro__
    names = [cls.__name__ for cls in mro]
    assert names.index("TrainingStateAverager") < names.index("RecordsRounds") < names.index("DecentralizedAverager")


def test_a_live_load_state_timeout_reaches_the_downloads_of_either_strategy():
    """`swarm run update` sets swarm.load_state_timeout on the running optimizer (daemon/retune.py): the bound each
    download then takes is StateDownloads', not a copy made at start."""
    from swarmd.swarm.strategies.diloco_optimizer import DiLoCoOptimizer
    from swarmd.swarm.upstream.optimizer import SwarmOptimizer
    from swarmd.swarm.upstream.peer_parts import StateDownloads

    for strategy_type in (SwarmOptimizer, DiLoCoOptimizer):
        optimizer = object.__new__(strategy_type)
        optimizer.downloads = StateDownloads(attempts=1, timeout=600.0, dht=None)
        optimizer.load_state_timeout = 42.0
        assert optimizer.downloads.timeout == 42.0 and optimizer.load_state_timeout == 42.0


@pytest.mark.parametrize("auxiliary", [False, True], ids=["trainer", "auxiliary"])
def test_an_auxiliary_peer_never_offers_its_state_which_it_never_steps(auxiliary):
    """After a download (or a catch-up ending) a trainer serves its state again; an auxiliary peer never does: its
    parameters stay those it downloaded while its epoch moves on with the swarm's (before: it served them, labelled
    with the swarm's epoch, to the next joiner)."""
    from types import SimpleNamespace

    from swarmd.swarm.upstream.optimizer import SwarmOptimizer

    optimizer = object.__new__(SwarmOptimizer)
    optimizer.state_averager = SimpleNamespace(allow_state_sharing=False, round_weight=None)
    optimizer.grad_averager = None
    optimizer.client_mode, optimizer.auxiliary, optimizer.inexact_state = False, auxiliary, False
    optimizer._set_catching_up(False)
    assert optimizer.state_averager.allow_state_sharing is (not auxiliary)


def test_a_state_rounds_search_is_cut_to_the_limit_past_its_scheduled_start():
    assert bounded_search(30.0, None, 2.0, now=100.0) == 2.0  # begins now
    assert bounded_search(30.0, 103.0, 2.0, now=100.0) == 5.0  # pre-scheduled 3 s ahead: 2 s past that
    assert bounded_search(30.0, 99.0, 2.0, now=100.0) == 2.0  # its start has passed
    assert bounded_search(1.5, 103.0, 2.0, now=100.0) == 1.5  # a shorter timeout stays
