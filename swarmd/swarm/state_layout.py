"""What a donor's state must look like before this peer takes it: its own layout, tensor for tensor.

hivemind's loader (TrainingStateAverager.load_state_from_peers) trusts the donor's layout. It copies each received
parameter with `copy_`, which broadcasts: a donor that sends one number per parameter sets every weight to it,
silently. It packs the donor's flattened optimizer state into the receiver's structure and torch loads it without
comparing shapes: a statistic of the wrong shape fails the next optimizer step, and every step after it, until the
worker gives up (one lying donor stops a joiner for good). And the param groups' parameter indices come from the
donor: other ones put the statistics on other parameters.

So the download (swarm/upstream/state_stream.py) compares what came with the receiver's own state, before anything
is applied, and asks the next donor when they differ: the same number of parameters and extras, each of the same
shape; for a whole state, the optimizer's metadata of the same length with a tensor, of the same shape, where the
receiver has one, the same parameter indices in the param groups, and plain values elsewhere (the hyperparameters
among them are the receiver's own anyway: swarm/upstream/state_averager.py). DiLoCo appends its inner optimizer's
state after these (checked on its own: swarm/optimizer_state_wire.py), so a layout may allow more tensors at the end.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from hivemind.utils.nested import nested_flatten

__all__ = ["StateLayout", "layout_mismatch", "optimizer_layout"]


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """The receiver's own: `shapes` of the tensors a download must begin with (parameters and extras, then the
    optimizer's statistics for a whole state); `optimizer_metadata`: hivemind's flat metadata of its optimizer state
    (None for a download of parameters only), as `optimizer_layout` gives it;
    `more_allowed`: whether tensors after `shapes` are taken (DiLoCo's inner state)."""

    shapes: tuple[tuple[int, ...], ...]
    optimizer_metadata: Optional[tuple] = None
    more_allowed: bool = False


class _ParameterIndex(int):
    """A param group's parameter index, told apart from the other plain values while flattening."""


def optimizer_layout(optimizer: torch.optim.Optimizer) -> tuple[tuple, tuple[tuple[int, ...], ...]]:
    """(metadata, shapes of the statistics) of `optimizer`'s state as hivemind's dump_optimizer_state flattens it
    (the same walk, nested_flatten over the state_dict): {"type": "tensor", "index": i}, {"type": "value",
    "parameter": i} for a param group's parameter index, {"type": "value"} for any other value."""
    state_dict = optimizer.state_dict()
    marked = dict(state_dict, param_groups=[
        dict(group, params=[_ParameterIndex(index) for index in group["params"]])
        for group in state_dict["param_groups"]])
    metadata, shapes = [], []
    for element in nested_flatten(marked):
        if isinstance(element, torch.Tensor):
            metadata.append({"type": "tensor", "index": len(shapes)})
            shapes.append(tuple(element.shape))
        elif isinstance(element, _ParameterIndex):
            metadata.append({"type": "value", "parameter": int(element)})
        else:
            metadata.append({"type": "value"})
    return tuple(metadata), tuple(shapes)


def layout_mismatch(layout: StateLayout, metadata: dict, tensors: Sequence) -> str:
    """Why a donor's (metadata, tensors) does not fit `layout`, or "" when it does."""
    expected = len(layout.shapes)
    if len(tensors) < expected or (len(tensors) > expected and not layout.more_allowed):
        return f"{len(tensors)} tensors where this peer has {expected}"
    for index, (tensor, shape) in enumerate(zip(tensors, layout.shapes)):
        if tuple(tensor.shape) != shape:
            return f"tensor {index} has shape {list(tensor.shape)}, this peer's {list(shape)}"
    if layout.optimizer_metadata is None:
        return ""
    return _optimizer_metadata_mismatch(layout.optimizer_metadata, metadata.get("optimizer_metadata"))


def _optimizer_metadata_mismatch(own: tuple, theirs) -> str:
    if not isinstance(theirs, (list, tuple)) or len(theirs) != len(own):
        length = len(theirs) if isinstance(theirs, (list, tuple)) else "no"
        return f"optimizer metadata of {length} entries where this peer's has {len(own)}"
    for position, (mine, entry) in enumerate(zip(own, theirs)):
        if not isinstance(entry, dict):
            return f"optimizer metadata entry {position} is not a dict"
        if mine.get("type") == "tensor":
            if entry.get("type") != "tensor" or entry.get("index") != mine.get("index"):
                return f"optimizer metadata entry {position} is not this peer's tensor {mine.get('index')}"
        elif entry.get("type") != "value" or "value" not in entry:
            return f"optimizer metadata entry {position} is not a value"
        elif "parameter" in mine:
            if entry["value"] != mine["parameter"] or isinstance(entry["value"], bool):
                return f"optimizer metadata entry {position} names parameter {entry['value']!r}, " \
                       f"this peer's {mine['parameter']}"
        elif not isinstance(entry["value"], (int, float, bool, str, type(None))):
            return f"optimizer metadata entry {position} is not a plain value"
    return ""
