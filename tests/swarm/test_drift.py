"""The drift of this peer's parameters from the swarm's average, measured when a state averaging is applied.

One in-process state averager (not started: no round needs to run); the test puts a known "average" into the
averaged tensors, as a finished round would, and applies it.
"""

import pytest
import torch


def test_the_drift_is_the_distance_from_the_average_over_its_norm(dht):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.upstream.state_averager import ObservedStateAverager

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    averager = ObservedStateAverager(
        averaging_log=AveragingLog(), on_state_loaded=lambda: None, dht=dht, prefix="drift-test",
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1), params=model.parameters(), start=False,
    )
    assert averager.last_parameter_drift is None  # no averaging yet
    own = [p.detach().clone() for p in model.parameters()]
    average = [torch.randn_like(p) for p in own]
    with averager.get_tensors() as averaged:
        for tensor, value in zip(averaged, average):
            tensor.copy_(value)
    averager._apply_averaging_results_()

    distance = torch.cat([(o - a).flatten() for o, a in zip(own, average)]).norm()
    expected = float(distance / torch.cat([a.flatten() for a in average]).norm())
    assert averager.last_parameter_drift == pytest.approx(expected, rel=1e-5)
    assert all(torch.equal(p.detach(), a) for p, a in zip(model.parameters(), average))  # and it was applied
