"""The seeds of a run: every peer initialises the SAME model, and each peer reads the data in its OWN order.

- `init_seed`: `training.seed`, or, when unset, a stable hash of the run id. Peers of one run that start together
  then build identical parameters without agreeing on anything but the run id (hivemind's ALBERT example sets one
  seed on every peer for the same reason); a run id is already what makes them one swarm.
- `peer_data_seed`: derived from the peer's persistent id, so peers do not train on the same samples, and
  reproducible across restarts of the same peer given `training.seed`.
- `seed_own_generators`: once the model is built, each peer (and each rank of a peer) reseeds the global generators
  from its own data seed, so its drop-path masks, dropout, augmentations and mixup draws are its own: with the init
  seed left in them, N peers drew the same masks and the swarm saw no more variety than one peer.
"""

from __future__ import annotations

import hashlib
from typing import Optional

__all__ = ["init_seed", "peer_data_seed", "seed_everything", "seed_own_generators"]


def _hash_to_seed(text: str) -> int:
    # 32 bits: what numpy's legacy seeding accepts, and plenty to tell runs apart
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def init_seed(seed: Optional[int], run_id: str) -> int:
    """The model's initialisation seed: the configured one, else one every peer of `run_id` derives alike."""
    return seed if seed is not None else _hash_to_seed(f"swarmd-init:{run_id}")


def peer_data_seed(seed: Optional[int], peer_id: str) -> int:
    """Each peer shuffles its data its own way (derived from its persistent peer id), reproducibly given `seed`."""
    return _hash_to_seed(f"{seed}:{peer_id}")


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's (CPU and CUDA) global generators, so a task that draws from any of them while
    building its model builds the same one on every peer."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def seed_own_generators(data_seed: int) -> None:
    """After the model is built: the global generators of this peer or rank, from its data seed (`peer_data_seed`,
    or `rank_data_seed` for a rank). Hashed again so the global stream is not the data order's stream itself (the
    loader seeds its own generator with `data_seed`)."""
    seed_everything(_hash_to_seed(f"swarmd-generators:{data_seed}"))
