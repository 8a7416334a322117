"""The schema's half of `training.devices` / `training.device`: device names checked without torch.

Every entry is `cpu` or `cuda:N`, no GPU twice, CPU and CUDA not mixed, and `training.device` agrees with the
list. The other half, against the real machine at start-up, is swarmd/ranks/devices.py (`resolve_devices`),
which imports these; they live here so that the config schema imports nothing above swarmd.config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

__all__ = ["DEVICES_KEY", "check_device_list", "conflict_between", "normalise_device"]

DEVICES_KEY = "training.devices"


def check_device_list(entries: Sequence[str]) -> list[str]:
    """The schema's check of an explicit list: normalised names (`cuda` -> `cuda:0`); ValueError on a mistake."""
    if not entries:
        raise ValueError("needs at least one device, e.g. [cuda:0, cuda:1], or auto")
    names = [normalise_device(entry) for entry in entries]
    seen: set[str] = set()
    for name in names:
        if name != "cpu" and name in seen:
            raise ValueError(f"{name} is listed twice; a GPU hosts one rank (only cpu may repeat)")
        seen.add(name)
    if "cpu" in seen and len(seen) > 1:
        raise ValueError(
            f"{names} mixes cpu and cuda ranks; one process group runs one backend (gloo for cpu, nccl for cuda)"
        )
    return names


def conflict_between(device: str, devices: Optional[str | list[str]]) -> str:
    """Why `training.device` and `training.devices` disagree, or "" when they do not."""
    if devices is None or device == "auto":
        return ""
    single = normalise_device(device)
    if devices == "auto":
        return f"{DEVICES_KEY}: auto conflicts with training.device={device}; set only one of them"
    if single != devices[0]:
        return (
            f"{DEVICES_KEY}: training.device={device} is not the first entry of {devices} (rank 0's device); "
            "set only training.devices"
        )
    return ""


def normalise_device(name: str) -> str:
    """`cpu` or `cuda:N` (`cuda` -> `cuda:0`); ValueError for anything else."""
    name = name.strip()
    if name == "cpu":
        return name
    if name == "cuda":
        return "cuda:0"
    if name.startswith("cuda:") and name[5:].isdigit():
        return f"cuda:{int(name[5:])}"
    raise ValueError(f"{name!r} is not a rank's device: use cpu or cuda:N (or devices: auto)")
