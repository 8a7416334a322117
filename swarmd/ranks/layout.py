"""Who is which rank: a peer whose daemon spawns its ranks, or one torchrun started, and each rank's data seed.

Two ways a peer gets several ranks, with the same roles (global rank 0 hosts hivemind, the others compute):
- `swarmd join` with training.devices: the daemon is rank 0 and spawns ranks 1..N-1 itself (swarmd.ranks.group);
- `torchrun ... -m swarmd join`: torchrun starts every rank and sets RANK, WORLD_SIZE, LOCAL_RANK (and
  MASTER_ADDR/MASTER_PORT for its rendezvous), which is how a peer spans several nodes of a cluster. Each process
  then trains on one device: its LOCAL_RANK's entry of training.devices, or its LOCAL_RANK's GPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from swarmd.errors import ConfigError

__all__ = ["TorchrunRank", "torchrun_rank", "torchrun_init_method", "rank_data_seed", "torchrun_device"]

_TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class TorchrunRank:
    """This process's place in a group torchrun started (read from its environment)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def hosts_hivemind(self) -> bool:
        return self.rank == 0


def torchrun_rank(environ: Mapping[str, str]) -> Optional[TorchrunRank]:
    """The torchrun rank this process is, or None when torchrun did not start it (the usual `swarmd join`)."""
    present = [key for key in _TORCHRUN_KEYS if key in environ]
    if not present:
        return None
    missing = [key for key in _TORCHRUN_KEYS if key not in environ]
    if missing:
        raise ConfigError(
            f"torchrun environment incomplete: {', '.join(present)} set but not {', '.join(missing)}; "
            "start swarmd under torchrun, or unset them"
        )
    try:
        rank, world_size, local_rank = (int(environ[key]) for key in _TORCHRUN_KEYS)
        local_world_size = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    except ValueError:
        shown = ", ".join(f"{key}={environ[key]!r}" for key in _TORCHRUN_KEYS)
        raise ConfigError(f"torchrun environment is not numeric ({shown})") from None
    if not (0 <= rank < world_size and 0 <= local_rank < local_world_size):
        raise ConfigError(f"torchrun environment is inconsistent: RANK={rank} WORLD_SIZE={world_size} LOCAL_RANK={local_rank}")
    return TorchrunRank(rank, world_size, local_rank, local_world_size)


def torchrun_init_method(environ: Mapping[str, str]) -> str:
    """torchrun's rendezvous address (MASTER_ADDR/MASTER_PORT) as an init_method: what env:// reads, but from the
    mapping given rather than os.environ."""
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(key)]
    if missing:
        raise ConfigError(f"torchrun environment incomplete: {' and '.join(missing)} not set; start swarmd under torchrun")
    return f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"


def torchrun_device(training, place: TorchrunRank, *, cuda_count: int) -> str:
    """The one device a torchrun-started process trains on (torchrun, not swarmd, decides how many ranks run)."""
    devices = training.devices
    if isinstance(devices, list):
        if place.local_rank >= len(devices):
            raise ConfigError(
                f"training.devices: {len(devices)} entries, but torchrun started local rank {place.local_rank}; "
                "list one device per process of --nproc_per_node"
            )
        return devices[place.local_rank]
    if devices is None and training.device != "auto":
        return training.device
    return f"cuda:{place.local_rank}" if cuda_count else "cpu"


def rank_data_seed(peer_data_seed: int, rank: int) -> int:
    """Rank 0 keeps the peer's own seed (a one-rank peer reads exactly what it read before ranks existed); every
    other rank gets an independent seed derived from it, so no two ranks read the same order."""
    if rank == 0:
        return peer_data_seed
    digest = hashlib.sha256(f"{peer_data_seed}:rank{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")
