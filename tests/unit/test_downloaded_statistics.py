"""The optimizer statistics a download brought, checked against the peer's own gradient (swarm/downloaded_statistics.py)."""

import math

import pytest
import torch

from swarmd.swarm.downloaded_statistics import (
    STATISTICS_SCALE_LIMIT,
    restart_implausible_statistics,
    restart_statistics,
    statistics_scale,
)


def _regression(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 1, generator=generator))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return model, x, y


def _backward(model, x, y, scale: float = 1.0, seed: int = 0) -> None:
    index = torch.randint(0, len(x), (32,), generator=torch.Generator().manual_seed(seed))
    model.zero_grad()
    (scale * ((model(x[index]) - y[index]) ** 2).mean()).backward()


def _trained(make_optimizer, gradient_scale: float, steps: int = 50):
    """A donor's model and optimizer after `steps` steps on gradients times `gradient_scale`, and then, as a joiner
    would have it, the honest gradient at the donor's parameters in .grad."""
    model, x, y = _regression()
    optimizer = make_optimizer(model.parameters())
    for step in range(steps):
        _backward(model, x, y, gradient_scale, seed=step)
        optimizer.step()
    _backward(model, x, y, seed=10**6)
    return model, optimizer


def _gradients(model):
    return [param.grad for param in model.parameters()]


def _adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)


@pytest.mark.parametrize("steps", [1, 10, 200])
def test_an_honest_donors_statistics_are_of_the_joiners_gradients_scale(steps):
    model, optimizer = _trained(_adamw, 1.0, steps)
    scale = statistics_scale(optimizer, _gradients(model))
    assert 0.1 < scale < 10, scale
    before = [value.clone() for state in optimizer.state.values() for value in state.values()]
    assert restart_implausible_statistics(optimizer, _gradients(model)) == scale
    after = [value for state in optimizer.state.values() for value in state.values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "an honest donor's statistics were touched"


@pytest.mark.parametrize("gradient_scale", [-1e6, 1e6, -1e3])
def test_a_scaled_donors_statistics_are_restarted_and_the_next_step_descends(gradient_scale):
    model, optimizer = _trained(_adamw, gradient_scale)
    parameters = [param.detach().clone() for param in model.parameters()]
    scale = restart_implausible_statistics(optimizer, _gradients(model))
    assert scale > STATISTICS_SCALE_LIMIT and abs(gradient_scale) / 10 < scale < abs(gradient_scale) * 10
    for state in optimizer.state.values():
        assert float(state["step"]) == 0
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    optimizer.step()  # a fresh Adam's first step: lr times the gradient's sign
    moved = [float((param.detach() - before).abs().max()) for param, before in zip(model.parameters(), parameters)]
    assert max(moved) == pytest.approx(3e-3, rel=1e-3)
    for param, before in zip(model.parameters(), parameters):  # against the joiner's own gradient, everywhere
        assert float(((param.detach() - before) * param.grad).sum()) < 0


def test_without_the_restart_the_joiner_would_follow_the_donor_uphill():
    """What the check prevents: the donor's first moments (x -1e6) set the direction of the joiner's next step."""
    model, optimizer = _trained(_adamw, -1e6)
    parameters = [param.detach().clone() for param in model.parameters()]
    optimizer.step()
    assert sum(float(((param.detach() - before) * param.grad).sum())
               for param, before in zip(model.parameters(), parameters)) > 0


def test_statistics_that_are_not_finite_are_restarted():
    model, optimizer = _trained(_adamw, 1.0)
    next(iter(optimizer.state.values()))["exp_avg_sq"][0] = math.inf
    assert restart_implausible_statistics(optimizer, _gradients(model)) == math.inf
    assert all(torch.isfinite(state["exp_avg_sq"]).all() for state in optimizer.state.values())


def test_statistics_written_large_are_restarted_under_lamb_which_clips_the_donors_gradients():
    """timm's LAMB clips the gradients it applies: a donor's x -1e6 gradients leave statistics at honest scale
    (not judged: reversed first moments, forgotten within ~20 steps), but statistics it writes itself are judged,
    and LAMB's step count, kept per group, restarts with them."""
    from timm.optim import Lamb

    model, optimizer = _trained(lambda params: Lamb(params, lr=3e-3), -1e6)
    assert optimizer.param_groups[0]["step"] == 50
    assert statistics_scale(optimizer, _gradients(model)) < STATISTICS_SCALE_LIMIT
    for state in optimizer.state.values():
        state["exp_avg_sq"].mul_(1e12)
    assert restart_implausible_statistics(optimizer, _gradients(model)) > STATISTICS_SCALE_LIMIT
    assert optimizer.param_groups[0]["step"] == 0
    assert all(not state["exp_avg_sq"].any() for state in optimizer.state.values())


def test_nothing_to_compare_without_moments_or_gradients():
    model, optimizer = _trained(lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9), 1.0)
    assert statistics_scale(optimizer, _gradients(model)) is None  # SGD's momentum: no Adam moments
    model, optimizer = _trained(_adamw, -1e6)
    assert statistics_scale(optimizer, [None] * len(_gradients(model))) is None
    fresh = _adamw(model.parameters())  # a peer's own statistics that never stepped
    assert statistics_scale(fresh, _gradients(model)) is None


def test_the_restart_zeroes_the_very_tensors_the_state_averager_holds():
    """The state averager shares the optimizer's tensors: a restart that replaced them would leave it serving the
    donor's statistics to the next joiner."""
    model, optimizer = _trained(_adamw, -1e6)
    held = {id(value): value for state in optimizer.state.values() for value in state.values()}
    restart_statistics(optimizer)
    for state in optimizer.state.values():
        for value in state.values():
            assert held[id(value)] is value and not value.any()


def test_the_restart_zeroes_sgds_momentum_too():
    """A refused state's SGD momentum (the sync toy tasks', DiLoCo's outer SGD) would carry the next steps the
    donor's way as Adam's first moment would."""
    model, optimizer = _trained(lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9), -1e6)
    buffers = [state["momentum_buffer"] for state in optimizer.state.values()]
    assert buffers and all(buffer.any() for buffer in buffers)
    restart_statistics(optimizer)
    assert all(state["momentum_buffer"] is buffer and not buffer.any()
               for state, buffer in zip(optimizer.state.values(), buffers))
