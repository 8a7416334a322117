"""Moving a batch to the training device. torch only: every rank uses it, the worker (rank 0) and the compute
ranks (compute_rank.py), which must not import hivemind."""

from __future__ import annotations

from typing import Any

__all__ = ["move_to_device"]


def move_to_device(batch: Any, device) -> Any:
    """Tensors in a (nested) batch to `device`; anything else as it is."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device) for value in batch)
    return batch
