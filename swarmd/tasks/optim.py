"""Inner optimizers and LR schedules shared by the built-in tasks.

Schedules count GLOBAL epochs: hivemind.Optimizer steps the scheduler once per global step of the swarm, so a
peer that joins late gets the same learning rate as everyone else.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from swarmd.config.schema import StrictModel

__all__ = ["OptimConfig", "build_optimizer", "build_scheduler", "lr_multiplier"]


class OptimConfig(StrictModel):
    name: Literal["adamw", "lamb"] = Field("adamw", description="adamw, or lamb for large global batches.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate, for the swarm's target_batch_size.")
    weight_decay: float = Field(0.05, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.999), strict=False, description="Adam/LAMB betas, [b1, b2].")
    eps: float = Field(1e-8, gt=0)
    max_grad_norm: Optional[float] = Field(
        1.0, gt=0, description="Clip the AVERAGED gradient to this global norm inside the optimizer step; null: off."
    )
    trust_clip: bool = Field(False, description="LAMB: clip the trust ratio at 1 (LAMBC).")
    always_adapt: bool = Field(
        False,
        description="LAMB: apply the trust ratio to every parameter, also those without weight decay (biases, "
        "norms), as torch_optimizer's LAMB in hivemind's ALBERT example; timm's default skips them.",
    )
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warm-up.")
    warmup_epochs: int = Field(5, ge=0, description="Linear warm-up length in global epochs.")
    warmup_start_ratio: Optional[float] = Field(
        None,
        ge=0,
        lt=1,
        description="LR at global epoch 0 as a fraction of the peak, from which the warm-up rises linearly to the "
        "peak at warmup_epochs: timm's warmup_lr_init / lr (Swin's recipe: 5e-7 / 5e-4 = 0.001), 0 for "
        "transformers' linear warm-up (hivemind's ALBERT example). Null: 1 / (warmup_epochs + 1), so the first "
        "global epoch already trains.",
    )
    total_epochs: int = Field(1000, ge=1, description="Global epochs until the schedule reaches min_lr_ratio.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final LR as a fraction of the peak.")

    @model_validator(mode="after")
    def _check_warmup(self) -> "OptimConfig":
        if self.warmup_epochs >= self.total_epochs:
            raise ValueError("warmup_epochs must be smaller than total_epochs")
        return self


def lr_multiplier(config: OptimConfig, epoch: int) -> float:
    """LR as a fraction of the peak at a global epoch: linear warm-up, then the chosen decay."""
    if epoch < config.warmup_epochs:
        start = config.warmup_start_ratio
        if start is None:
            return (epoch + 1) / (config.warmup_epochs + 1)
        return start + (1.0 - start) * epoch / config.warmup_epochs
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (epoch - config.warmup_epochs) / max(1, config.total_epochs - config.warmup_epochs))
    floor = config.min_lr_ratio
    if config.schedule == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(config: OptimConfig, param_groups: list[dict[str, Any]]):
    import torch

    if config.name == "lamb":
        from timm.optim import Lamb

        # timm's LAMB clips the global norm of the gradients it applies (the averaged ones) itself.
        return Lamb(
            param_groups,
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
            trust_clip=config.trust_clip,
            always_adapt=config.always_adapt,
        )
    optimizer_cls = _with_grad_clipping(torch.optim.AdamW) if config.max_grad_norm else torch.optim.AdamW
    optimizer = optimizer_cls(
        param_groups, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
    )
    if config.max_grad_norm:
        optimizer.max_grad_norm = config.max_grad_norm
    return optimizer


def build_scheduler(config: OptimConfig, optimizer):
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda epoch: lr_multiplier(config, epoch))


def _with_grad_clipping(optimizer_cls):
    """A subclass of `optimizer_cls` that clips the gradients it is about to apply (the averaged ones)."""
    import torch

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if params:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        return optimizer_cls.step(self, closure)

    return type(f"Clipped{optimizer_cls.__name__}", (optimizer_cls,), {"step": step})

