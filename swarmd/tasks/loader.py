"""An endless, seeded DataLoader: the shape every task's `train_batches` returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

__all__ = ["endless_batches"]


def endless_batches(
    dataset,
    *,
    batch_size: int,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    collate_fn: Optional[Callable[[list], Any]] = None,
) -> Iterator[Any]:
    """Shuffle with this peer's seed, reshuffle every pass, keep workers alive between passes."""
    import torch
    from torch.utils.data import DataLoader

    if len(dataset) < batch_size:
        raise ValueError(f"the dataset has {len(dataset)} samples, fewer than one batch of {batch_size}")
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=True,
        persistent_workers=num_workers > 0,
        collate_fn=collate_fn,
    )
    while True:
        yield from loader
