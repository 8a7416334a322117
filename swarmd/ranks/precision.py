"""Mixed precision for every rank: autocast, and fp16 loss scaling that fits hivemind.Optimizer.

Rank 0 (the worker) uses all of it; a compute rank (compute_rank.py) only the autocast, with
`reuse_grad_buffers=False` (the loss scale comes from rank 0), so hivemind stays out of its process.

- fp32: nothing.
- bf16: autocast only; bf16 has fp32's exponent range, so no loss scaling.
- fp16: autocast plus loss scaling, done the way hivemind's gradient accumulation needs it:
  - `reuse_grad_buffers: true`: the gradients of all local steps of an epoch accumulate in `.grad` at ONE loss
    scale. hivemind.GradScaler leaves them scaled between global steps (its unscale_/update are no-ops there)
    and unscales them once, inside the global step. `update()` is called after every `step()`, as hivemind
    expects; it only changes the scale after a global step or an overflow.
  - `reuse_grad_buffers: false`: hivemind copies `.grad` into its own accumulators at every `step()`, but the
    unscale at the global step only touches `.grad`, so the averaged gradients would stay multiplied by the loss
    scale (measured with hivemind 1.1.12: the applied update was 32768x too large). So every local step is
    unscaled before `step()` with torch's own GradScaler, as hivemind.GradScaler's docstring advises for this
    mode ("train normally ... using standard PyTorch AMP").
Both scalers get `device=`: hivemind's defaults to CUDA and crashes at the first unscale on a CPU-only host.
Whatever a peer picks here, it sends fp32 gradients and parameters, so peers of one swarm may differ.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["Precision", "make_precision"]


class Precision:
    """fp32: the interface every precision mode implements."""

    loss_scaling = False  # True: a False from step() means an fp16 overflow the scaler already handled

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device

    def autocast(self):
        return contextlib.nullcontext()

    def loss_scale(self):
        """The fp16 loss scale (None without loss scaling)."""
        return None

    def state_dict(self):
        """The loss scaler's state for a checkpoint (None without loss scaling)."""
        return None

    def load_state_dict(self, state) -> None:
        """Put back what state_dict() gave (a resumed run keeps its calibrated scale)."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer, batch_size: int) -> bool:
        """Hand this step's gradients to hivemind.Optimizer; False if they were not finite (nothing was handed)."""
        if not grads_finite(self.model):
            return False
        optimizer.step(batch_size=batch_size)
        return True


class _Bf16(Precision):
    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


class _Fp16PerStep(Precision):
    """reuse_grad_buffers: false. Each local step is unscaled (and checked) before hivemind accumulates it."""

    loss_scaling = True

    def __init__(self, model, device):
        super().__init__(model, device)
        self.scaler = torch.amp.GradScaler(device.type)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.float16)

    def loss_scale(self):
        return self.scaler.get_scale()

    def state_dict(self):
        return self.scaler.state_dict()  # plain numbers: scale, growth tracker, factors, interval

    def load_state_dict(self, state) -> None:
        if state:
            self.scaler.load_state_dict(state)

    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def step(self, optimizer, batch_size):
        self.scaler.unscale_(optimizer)  # hivemind.Optimizer.param_groups hold the model's own parameters
        finite = grads_finite(self.model)
        if finite:
            optimizer.step(batch_size=batch_size)
        self.scaler.update()  # an overflow lowers the scale; the caller drops this step's .grad
        return finite


class _Fp16Accumulating(_Fp16PerStep):
    """reuse_grad_buffers: true. hivemind.GradScaler unscales the accumulated .grad once, at the global step."""

    def __init__(self, model, device):
        Precision.__init__(self, model, device)
        import hivemind

        self.scaler = hivemind.GradScaler(device=device.type)

    def step(self, optimizer, batch_size):
        scale = self.scaler.get_scale()
        # On overflow hivemind resets the epoch's accumulated gradients and samples itself.
        optimizer.step(batch_size=batch_size, grad_scaler=self.scaler)
        self.scaler.update()
        return self.scaler.get_scale() >= scale


def make_precision(name: str, *, model: torch.nn.Module, device: torch.device, reuse_grad_buffers: bool) -> Precision:
    if name == "fp32":
        return Precision(model, device)
    if name == "bf16":
        return _Bf16(model, device)
    if name == "fp16":
        return (_Fp16Accumulating if reuse_grad_buffers else _Fp16PerStep)(model, device)
    raise ValueError(f"unknown precision {name!r}")


def grads_finite(model: torch.nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())
