"""What the worker reads once per epoch for the status, the metrics and the tracking: the learning rate of each
param group, the fp16 loss scale, and the CUDA memory of its device.

Once per epoch (not per step) because `GradScaler.get_scale()` copies the scale from the GPU, a device sync.
Called on the worker's thread, between steps, where reading the optimizer's param groups is safe.
"""

from __future__ import annotations

import torch

from swarmd.worker.stats import CudaMemory, WorkerReadings

__all__ = ["epoch_readings", "cuda_memory"]


def epoch_readings(optimizer, precision, device: torch.device) -> WorkerReadings:
    """The learning rate of each param group, the loss scale (None but for fp16), the CUDA memory and the last
    global step's gradient norm, at the optimizer's local epoch (`epoch`).

    `optimizer`: hivemind.Optimizer (its param_groups are the inner optimizer's, which the LR schedule steps once
    per global epoch); `precision`: the worker's swarmd.ranks.precision mode, None on an auxiliary peer.
    """
    scale = precision.loss_scale() if precision is not None else None
    return WorkerReadings(
        epoch=getattr(optimizer, "local_epoch", None),
        learning_rates=tuple(float(group["lr"]) for group in optimizer.param_groups),
        loss_scale=float(scale) if scale is not None else None,
        # swarm/upstream/optimizer.py: the norm of the gradient the last global step used (None before it, or without one)
        grad_norm=getattr(optimizer, "last_grad_norm", None),
        cuda_memory=cuda_memory([device]),
    )


def cuda_memory(devices: list[torch.device]) -> tuple[CudaMemory, ...]:
    """The memory of the CUDA devices among `devices` (others: skipped), from the allocator's counters (no device
    sync)."""
    readings = []
    for device in devices:
        if device.type != "cuda":
            continue
        index = device.index if device.index is not None else torch.cuda.current_device()
        readings.append(
            CudaMemory(
                device=f"cuda:{index}",
                allocated_bytes=int(torch.cuda.memory_allocated(index)),
                reserved_bytes=int(torch.cuda.memory_reserved(index)),
            )
        )
    return tuple(readings)
