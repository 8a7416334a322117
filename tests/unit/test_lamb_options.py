"""LAMB options that reproduce hivemind's ALBERT example (torch_optimizer's LAMB) with timm's LAMB."""

import pytest
import torch

from swarmd.tasks.optim import OptimConfig, build_optimizer

LR = 0.01


def _first_update(always_adapt: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One LAMB step on a bias-like parameter in a no-decay group; returns (parameter before, update)."""
    torch.manual_seed(0)
    bias = torch.nn.Parameter(torch.randn(64) * 0.1)
    before = bias.detach().clone()
    optimizer = build_optimizer(
        OptimConfig(name="lamb", lr=LR, max_grad_norm=None, always_adapt=always_adapt),
        [{"params": [bias], "weight_decay": 0.0}],
    )
    bias.grad = torch.randn(64) * 5.0
    optimizer.step()
    return before, bias.detach() - before


def test_always_adapt_scales_no_decay_parameters_by_the_trust_ratio():
    # trust ratio |w| / |adam update|: the step moves the parameter by lr x |w|, whatever the gradient's size
    before, update = _first_update(always_adapt=True)
    assert float(update.norm()) == pytest.approx(LR * float(before.norm()), rel=1e-4)


def test_by_default_no_decay_parameters_take_plain_adam_steps():
    # timm skips the trust ratio where weight_decay is 0: Adam's first step is lr x sign(grad) per element
    before, update = _first_update(always_adapt=False)
    assert float(update.norm()) == pytest.approx(LR * 64**0.5, rel=1e-3)
    assert float(update.norm()) > 5 * LR * float(before.norm())
