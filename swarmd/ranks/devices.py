"""Which devices a peer's ranks run on: `training.devices` and `training.device`, checked twice.

In the schema (no torch): every entry is `cpu` or `cuda:N`, no GPU twice, CPU and CUDA not mixed, and
`training.device` agrees with the list. At start-up (torch, the real machine): `auto` becomes every visible GPU
(or one CPU rank) and a GPU that is not there is a ConfigError naming training.devices (exit 2).

The schema's half lives in swarmd/config/devices.py (re-exported here), so the schema imports nothing
above swarmd.config.

How the two keys relate: `training.devices` unset means one rank on `training.device` (exactly what a peer did
before ranks existed). Once `training.devices` is set it decides; `training.device` may then stay `auto` or name
the first entry (rank 0's device, the one hivemind's optimizer state lives next to), anything else is an error.
`cpu` may repeat: several CPU ranks over gloo are how tests and benchmarks exercise ranks without GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from swarmd.config.devices import DEVICES_KEY as _KEY
from swarmd.config.devices import check_device_list, conflict_between
from swarmd.config.devices import normalise_device as _normalise
from swarmd.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["check_device_list", "conflict_between", "resolve_devices", "backend_for"]


def resolve_devices(training, *, cuda_count: Optional[int] = None) -> list["torch.device"]:
    """One torch.device per rank on this machine; ConfigError (exit 2) for a GPU that is not there.

    `cuda_count` overrides what torch reports (tests of machines this one is not)."""
    import torch

    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    requested = training.devices
    if requested is None:
        if training.device == "auto":
            return [torch.device("cuda:0" if cuda_count else "cpu")]
        key, names = "training.device", [_normalise(training.device)]
    elif requested == "auto":
        return [torch.device(f"cuda:{index}") for index in range(cuda_count)] or [torch.device("cpu")]
    else:
        key, names = _KEY, list(requested)
    for name in names:
        if name == "cpu":
            continue
        index = int(name.split(":", 1)[1])
        if cuda_count == 0:
            raise ConfigError(f"{key}: {name} was asked for but CUDA is not available here; use cpu or auto")
        if index >= cuda_count:
            raise ConfigError(
                f"{key}: {name} does not exist; this machine has {cuda_count} CUDA GPU(s): "
                + ", ".join(f"cuda:{i}" for i in range(cuda_count))
            )
    return [torch.device(name) for name in names]


def backend_for(devices: Sequence["torch.device"]) -> str:
    """NCCL between GPUs, gloo between CPU ranks."""
    return "nccl" if devices[0].type == "cuda" else "gloo"

