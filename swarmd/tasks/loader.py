"""An endless, seeded DataLoader that can start mid-stream: the shape every task's `train_batches` returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

__all__ = ["endless_batches", "SeededBatchOrder"]


class SeededBatchOrder:
    """The batches' sample indices: pass after pass, each a fresh permutation drawn from one seeded generator.

    Starting at batch `skip` replays only the permutations of the passes before it (a randperm each, no data
    read), so a resumed peer continues its shard where it stopped in milliseconds, even deep into a large dataset.
    """

    def __init__(self, size: int, batch_size: int, seed: int, skip: int = 0):
        self.size, self.batch_size, self.seed, self.skip = size, batch_size, seed, skip
        self.per_pass = size // batch_size  # whole batches only (drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        passes, first = divmod(self.skip, self.per_pass)
        for _ in range(passes):
            torch.randperm(self.size, generator=generator)
        while True:
            order = torch.randperm(self.size, generator=generator).tolist()
            for index in range(first, self.per_pass):
                yield order[index * self.batch_size : (index + 1) * self.batch_size]
            first = 0


def endless_batches(
    dataset,
    *,
    batch_size: int,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    collate_fn: Optional[Callable[[list], Any]] = None,
    skip: int = 0,
) -> Iterator[Any]:
    """Shuffle with this peer's seed, reshuffle every pass, from batch `skip` of that stream on.

    Exact on resume for the samples; random draws inside DataLoader workers (augmentations with num_workers > 0)
    or a collator's own generator start afresh rather than where the stopped run left them."""
    import torch
    from torch.utils.data import DataLoader

    if len(dataset) < batch_size:
        raise ValueError(f"the dataset has {len(dataset)} samples, fewer than one batch of {batch_size}")
    loader = DataLoader(
        dataset,
        batch_sampler=SeededBatchOrder(len(dataset), batch_size, seed, skip),
        num_workers=num_workers,
        pin_memory=pin_memory,
        collate_fn=collate_fn,
        # the workers' base seed comes from here, not from torch's global generator, which the training draws from
        generator=torch.Generator().manual_seed(seed),
    )
    yield from loader  # one endless pass of the DataLoader: its workers live as long as the stream
