"""An optimizer's state as one peer sends it to another (DiLoCo's inner optimizer, with the outer state): described
by name, and checked on arrival.

Why not hivemind's dump_optimizer_state/load_optimizer_state: they flatten the state_dict with its keys sorted and
pack the received values back into the RECEIVER's state_dict. Where the two differ in shape (a joiner whose LAMB has
not stepped yet has no 'step' in its param groups, the donor's has), every value after the gap lands on the wrong
key: a joiner's LAMB got trust_clip = 188 (the donor's step count) and weight_decay = False, its next inner step made
every parameter NaN (tests/swarm/test_run_manifest.py's DiLoCo test, 3 runs in 4). And the donor's param groups
came whole, so a lying donor chose the joiner's learning rate.

Here each tensor travels with (parameter index, key), the receiver checks every entry against its own parameters
(index in range, shape of the parameter or one number, finite), and takes from the param groups only their step
counter (timm's LAMB keeps it there): the hyperparameters and the schedule stay the receiver's own.
"""

from __future__ import annotations

import math

import torch

__all__ = ["COUNTER_KEYS", "describe_optimizer_state", "load_described_state", "WIRE_VERSION"]

WIRE_VERSION = 1
COUNTER_KEYS = ("step",)  # what a param group may take from a sender: a counter, never a hyperparameter
_MAX_KEY_LENGTH = 64
_MAX_ENTRIES_PER_PARAMETER = 16
_MAX_STEP = 1e12


def describe_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict, list[torch.Tensor]]:
    """(description, tensors): msgpack-able names for the tensors, which go on the wire in this order."""
    state_dict = optimizer.state_dict()
    tensors: list[torch.Tensor] = []
    entries, group_entries = [], []
    for index, values in sorted(state_dict["state"].items()):
        for key, value in sorted(values.items()):
            if torch.is_tensor(value):
                entries.append([int(index), str(key), len(tensors)])
                tensors.append(value.detach().cpu())
    for group_index, group in enumerate(state_dict["param_groups"]):
        for key in COUNTER_KEYS:
            value = group.get(key)
            if isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool):
                group_entries.append([group_index, key, len(tensors), torch.is_tensor(value)])
                tensors.append(torch.as_tensor(value, dtype=torch.float64).detach().cpu().reshape(()))
    return {"version": WIRE_VERSION, "state": entries, "groups": group_entries}, tensors


def load_described_state(optimizer: torch.optim.Optimizer, description, tensors) -> None:
    """Replace the optimizer's state with a sender's; raises ValueError naming the first entry that does not fit
    this optimizer (and then changes nothing)."""
    if not isinstance(description, dict) or description.get("version") != WIRE_VERSION:
        raise ValueError(f"not an optimizer state of wire version {WIRE_VERSION}")
    local = optimizer.state_dict()
    shapes = [param.shape for group in optimizer.param_groups for param in group["params"]]
    state = _checked_state(description.get("state"), tensors, shapes)
    groups = [dict(group) for group in local["param_groups"]]
    for group_index, key, value in _checked_group_entries(description.get("groups"), tensors, len(groups)):
        groups[group_index][key] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _checked_state(entries, tensors, shapes) -> dict:
    if not isinstance(entries, list) or len(entries) > _MAX_ENTRIES_PER_PARAMETER * max(len(shapes), 1):
        raise ValueError("the state entries are not a list of a plausible length")
    state: dict[int, dict] = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise ValueError(f"a state entry is not [parameter, key, tensor]: {entry!r:.80}")
        index, key, tensor_index = entry
        _check_index(index, len(shapes), "parameter")
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LENGTH:
            raise ValueError(f"state key {key!r:.80} of parameter {index} is not a short name")
        tensor = _tensor_at(tensors, tensor_index)
        if tuple(tensor.shape) != tuple(shapes[index]) and tensor.numel() != 1:
            raise ValueError(f"state {key!r} of parameter {index} has shape {tuple(tensor.shape)}, "
                             f"the parameter {tuple(shapes[index])}")
        state.setdefault(index, {})[key] = tensor.clone()
    return state


def _checked_group_entries(entries, tensors, num_groups):
    if not isinstance(entries, list) or len(entries) > len(COUNTER_KEYS) * num_groups:
        raise ValueError("the param group entries are not a list of a plausible length")
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ValueError(f"a param group entry is not [group, key, tensor, is_tensor]: {entry!r:.80}")
        group_index, key, tensor_index, is_tensor = entry
        _check_index(group_index, num_groups, "param group")
        if key not in COUNTER_KEYS:
            raise ValueError(f"param group key {key!r:.80} is not one a sender may set")
        tensor = _tensor_at(tensors, tensor_index)
        value = float(tensor.reshape(-1)[0]) if tensor.numel() == 1 else math.nan
        if not 0 <= value <= _MAX_STEP:
            raise ValueError(f"param group {group_index}'s {key} is {value!r}, not a count of steps")
        yield group_index, key, (torch.tensor(value, dtype=torch.float32) if is_tensor is True else value)


def _check_index(index, size: int, what: str) -> None:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < size:
        raise ValueError(f"{what} index {index!r:.40} is not one of this optimizer's {size}")


def _tensor_at(tensors, tensor_index) -> torch.Tensor:
    _check_index(tensor_index, len(tensors), "tensor")
    tensor = tensors[tensor_index]
    if not torch.is_tensor(tensor) or not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"tensor {tensor_index} is not a number tensor")
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"tensor {tensor_index} is not finite")
    return tensor
