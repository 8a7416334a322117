"""The optimizer statistics a state download brought, checked against this peer's own first gradient.

Under local updates and DiLoCo every peer steps its own optimizer, and nobody averages Adam's moments: a joiner's
come from its donor alone (the split download compares donors' parameters, but honest peers' statistics differ, so
there is no majority to compare them with). A donor can send second moments 1e12 times an honest peer's (written
so, or from gradients x 1e6 where its optimizer does not clip them: `optim.max_grad_norm: null`): the joiner's
steps would then stay a millionth of their size for the ~27,000 steps beta2 = 0.999 takes to forget them (a peer
that trains nothing, yet counts in every state round). First moments 1e6 times too large (with second moments
at honest scale) would make its steps a million times too long.

The joiner's own gradient at the downloaded parameters, on its own data, says how large the statistics should be:
the bias-corrected moments' norms (the first's, the square root of the second's sum) over the gradient's norm were
0.6-7.7 in honest runs of the faulty task (AdamW, batches of 16-256, every 5th of 3,000 steps, unclipped; 1.0-3.1
clipped at norm 1) and 4e5-8e6 where an unclipped donor's gradients were x 1e6 or x -1e6. Above
STATISTICS_SCALE_LIMIT the statistics are restarted (zeroed, their step counts too: Adam's bias correction then
treats them as new), and the peer keeps the parameters.

Not judged: statistics at honest scale. Where the donor's optimizer clips its gradients (swarmd's default,
max_grad_norm 1.0; timm's LAMB), a donor whose gradients were x -1e6 sends the same statistics as one whose
gradients were sign-flipped: first moments reversed, which the joiner forgets within ~20 steps (beta1 = 0.9).
Their direction cannot be told from an honest donor's against one gradient: an honest donor's first moments
were at cosine -0.33..+0.40 with the joiner's gradient and a sign-flipping donor's at -0.73..+0.19 in the same runs.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import torch

__all__ = ["STATISTICS_SCALE_LIMIT", "restart_implausible_statistics", "restart_statistics", "statistics_scale"]

logger = logging.getLogger(__name__)

STATISTICS_SCALE_LIMIT = 100.0

# Adam-family moments: AdamW's and timm's LAMB's (max_exp_avg_sq: AMSGrad)
_FIRST_MOMENTS = ("exp_avg",)
_SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")
# restarted with them, not judged: SGD's momentum (a first moment with no step count to correct it by)
_MOMENTUM = ("momentum_buffer",)


def restart_implausible_statistics(
    optimizer: torch.optim.Optimizer, gradients: Sequence[Optional[torch.Tensor]]
) -> Optional[float]:
    """Restart the statistics where they are more than STATISTICS_SCALE_LIMIT times the gradient; the scale, or None
    where there was nothing to compare. Call it under the optimizer's lock, before the step."""
    scale = statistics_scale(optimizer, gradients)
    if scale is not None and scale > STATISTICS_SCALE_LIMIT:
        logger.warning(
            "The optimizer statistics that came with the downloaded state are %.3g times this peer's own gradient "
            "(more than %g: a donor whose gradients were scaled, or broken): starting them afresh, keeping the "
            "parameters", scale, STATISTICS_SCALE_LIMIT,
        )
        restart_statistics(optimizer)
    return scale


def statistics_scale(optimizer: torch.optim.Optimizer, gradients: Sequence[Optional[torch.Tensor]]) -> Optional[float]:
    """How many times the gradient's norm the optimizer's moments are (the larger of the first and the square
    root of the second), bias-corrected; `gradients` in the order of the optimizer's parameters. None where
    there is nothing to compare: no moments (SGD, or statistics that never stepped), or no gradient."""
    first = squared_gradient = 0.0
    second = dict.fromkeys(_SECOND_MOMENTS, 0.0)
    compared = False
    parameters = [(group, param) for group in optimizer.param_groups for param in group["params"]]
    for (group, param), gradient in zip(parameters, gradients):
        state = optimizer.state.get(param, {})
        step = _step_count(state, group)
        if gradient is None or step <= 0 or "betas" not in group:
            continue
        beta1, beta2 = group["betas"]
        for key in _FIRST_MOMENTS:
            if key in state:
                first += _squared_norm(state[key]) / (1.0 - beta1**step) ** 2
                compared = True
        for key in _SECOND_MOMENTS:
            if key in state:
                second[key] += _sum(state[key]) / (1.0 - beta2**step)
                compared = True
        squared_gradient += _squared_norm(gradient)
    if not compared or squared_gradient == 0.0:
        return None
    scale = math.sqrt(max(first, *second.values()) / squared_gradient)
    return scale if math.isfinite(scale) else math.inf


def restart_statistics(optimizer: torch.optim.Optimizer) -> None:
    """Zero every moment in place (the state averager holds these very tensors), SGD's momentum too, and the step
    counts with them."""
    for group in optimizer.param_groups:
        if "step" in group:  # timm's LAMB counts steps per group
            group["step"] = 0
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if key in _FIRST_MOMENTS + _SECOND_MOMENTS + _MOMENTUM and isinstance(value, torch.Tensor):
                    value.zero_()
                elif key == "step":
                    state[key] = value.zero_() if isinstance(value, torch.Tensor) else 0


def _step_count(state: dict, group: dict) -> int:
    step = state.get("step", group.get("step", 0))
    return int(step.item()) if isinstance(step, torch.Tensor) else int(step)


def _squared_norm(tensor: torch.Tensor) -> float:
    return float(tensor.detach().double().pow(2).sum())


def _sum(tensor: torch.Tensor) -> float:
    return float(tensor.detach().double().sum())
