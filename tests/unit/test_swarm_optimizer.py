"""SwarmOptimizer's averagers must speak hivemind's protocol: same RPC names as the upstream classes."""

import pytest

from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager

from swarmd.swarm.upstream.gradient_averager import GradientAveragerKeepingOwn
from swarmd.swarm.upstream.state_averager import ObservedStateAverager


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
