"""Where a peer's training stands besides its weights and optimizer: what a resumed run needs to continue exactly.

- the global random generators (Python's, NumPy's, torch's CPU and CUDA ones): dropout, augmentations, masking;
- the fp16 loss scaler's state (scale and growth tracker), so a resumed peer neither re-calibrates nor overflows;
- the data position: which seeded stream the worker reads (`seed`) and how many batches of it it consumed, so a
  resumed peer continues its shard where it stopped instead of reading its first batches again.

The worker captures a `ResumePoint` between steps (with the model and optimizer, so all belong to one moment);
checkpoint.py stores it as tensors plus JSON inside the same atomic checkpoint; the worker applies it before its
first batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ResumePoint", "DataPosition", "capture_rng_states", "restore_rng_states"]

_PREFIX = "rng/"


@dataclass(frozen=True)
class DataPosition:
    peer_seed: int  # the peer's data seed (peer_data_seed): the position means nothing to another peer
    seed: int  # the stream the worker reads: the peer's seed, or another after a failed step restarted it
    batches: int  # batches of that stream consumed


@dataclass
class ResumePoint:
    rng: dict[str, Any] = field(default_factory=dict)  # capture_rng_states()
    loss_scaler: Optional[dict[str, Any]] = None  # torch GradScaler.state_dict() (fp16 only)
    data: Optional[DataPosition] = None

    def to_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, JSON-able meta) for checkpoint.py."""
        tensors = {f"{_PREFIX}{name}": value for name, value in self.rng.items() if _is_tensor(value)}
        meta = {
            "rng": {name: value for name, value in self.rng.items() if not _is_tensor(value)},
            "loss_scaler": self.loss_scaler,
            "data": None if self.data is None else vars(self.data),
        }
        return tensors, meta

    @classmethod
    def from_checkpoint(cls, tensors: dict[str, Any], meta: dict[str, Any]) -> Optional["ResumePoint"]:
        """None for a checkpoint written before checkpoints held this."""
        if not meta:
            return None
        rng = dict(meta.get("rng") or {})
        rng.update({name[len(_PREFIX):]: value for name, value in tensors.items() if name.startswith(_PREFIX)})
        data = meta.get("data")
        return cls(rng=rng, loss_scaler=meta.get("loss_scaler"), data=DataPosition(**data) if data else None)


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def capture_rng_states() -> dict[str, Any]:
    """Every global generator's state: tensors for the large parts, plain values for the rest."""
    import random

    import numpy as np
    import torch

    version, python_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states: dict[str, Any] = {
        "python": torch.tensor(python_state, dtype=torch.int64),
        "python_version": version,
        "python_gauss": gauss,
        "numpy": torch.from_numpy(keys.astype(np.int64)),
        "numpy_kind": kind,
        "numpy_position": int(position),
        "numpy_has_gauss": int(has_gauss),
        "numpy_cached_gaussian": float(cached_gaussian),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda/{index}"] = state
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back what capture_rng_states took; parts a checkpoint lacks (e.g. CUDA on a CPU host) are left alone."""
    import random

    import numpy as np
    import torch

    if "python" in states:
        random.setstate((states["python_version"], tuple(int(x) for x in states["python"].tolist()), states["python_gauss"]))
    if "numpy" in states:
        np.random.set_state((
            states["numpy_kind"], states["numpy"].numpy().astype(np.uint32), states["numpy_position"],
            states["numpy_has_gauss"], states["numpy_cached_gaussian"],
        ))
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    cuda = sorted((int(name.split("/")[1]), value) for name, value in states.items() if name.startswith("cuda/"))
    if cuda and torch.cuda.is_available():
        for index, state in cuda[: torch.cuda.device_count()]:
            torch.cuda.set_rng_state(state, index)
