"""What the worker reads once per epoch for the status, the metrics and the tracking: the learning rate of each
param group, the fp16 loss scale, and the CUDA memory of its device.

Once per epoch (not per step) because `GradScaler.get_scale()` copies the scale from the GPU, a device sync.
Called on the worker's thread, between steps, where reading the optimizer's param groups is safe.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["epoch_readings", "cuda_memory"]


def epoch_readings(optimizer, precision, device: torch.device) -> dict[str, Any]:
    """{epoch, learning_rates: [lr per param group], loss_scale: float or None (not fp16), cuda_memory: [...],
    grad_norm}; `epoch` is the optimizer's local epoch they were read at.

    `optimizer`: hivemind.Optimizer (its param_groups are the inner optimizer's, which the LR schedule steps once
    per global epoch); `precision`: the worker's swarmd.worker.precision mode, None on an auxiliary peer.
    """
    scale = precision.loss_scale() if precision is not None else None
    return {
        "epoch": getattr(optimizer, "local_epoch", None),
        "learning_rates": [float(group["lr"]) for group in optimizer.param_groups],
        "loss_scale": float(scale) if scale is not None else None,
        "cuda_memory": cuda_memory([device]),
        # swarm/optimizer.py: the norm of the gradient the last global step used (None before it, or without one)
        "grad_norm": getattr(optimizer, "last_grad_norm", None),
    }


def cuda_memory(devices: list[torch.device]) -> list[dict[str, Any]]:
    """[{device: "cuda:N", allocated_bytes, reserved_bytes}] for the CUDA devices among `devices` (others: skipped).

    allocated: held by tensors; reserved: held by PyTorch's caching allocator (what nvidia-smi shows, minus the
    CUDA context). Reads the allocator's counters: no device sync.
    """
    readings: list[dict[str, Optional[int]]] = []
    for device in devices:
        if device.type != "cuda":
            continue
        index = device.index if device.index is not None else torch.cuda.current_device()
        readings.append(
            {
                "device": f"cuda:{index}",
                "allocated_bytes": int(torch.cuda.memory_allocated(index)),
                "reserved_bytes": int(torch.cuda.memory_reserved(index)),
            }
        )
    return readings
