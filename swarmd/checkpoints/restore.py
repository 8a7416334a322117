"""Moving state between the live model/optimizer and checkpoints."""

from __future__ import annotations

import logging

import torch

from swarmd.checkpoints.store import storage_key
from swarmd.errors import ConfigError

__all__ = ["capture_state", "load_model_state", "load_optimizer_state", "reload_parameters", "tied_names"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def capture_state(model: torch.nn.Module, optimizer) -> tuple[dict, dict, int]:
    """A consistent copy of model, optimizer and epoch; call between steps (or after the worker stopped)."""
    averager = optimizer.state_averager
    # Apply an optimizer step still running in the background (delay_optimizer_step), so that the model and
    # the optimizer statistics we save belong to the same step.
    averager.step(wait_for_delayed_updates=True)
    with averager.lock_optimizer:
        model_state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()}
        optimizer_state = _clone(optimizer.state_dict())
    return model_state, optimizer_state, optimizer.local_epoch


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone(item) for item in value]
    return value


def load_model_state(model: torch.nn.Module, checkpoint) -> None:
    """Load weights; names dropped at save time because they alias another tensor (tied weights) are restored."""
    state = dict(checkpoint.model_state)
    for kept, aliases in tied_names(model).items():
        for alias in aliases:
            if alias not in state and kept in state:
                state[alias] = state[kept]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(
            f"checkpoint {checkpoint.path} was written for a different model (missing {len(missing)} keys, e.g. "
            f"{missing[:3]}; unexpected {len(unexpected)}, e.g. {unexpected[:3]}); start with the config it was "
            f"trained with, or move {checkpoint.path.parent} away"
        )


def tied_names(model: torch.nn.Module) -> dict[str, list[str]]:
    """First name of each shared storage -> the other names of it (the same rule the checkpoint writer uses)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in model.state_dict().items():
        if tensor.numel():
            key = storage_key(tensor)
            by_storage.setdefault(key, []).append(name)
    return {names[0]: names[1:] for names in by_storage.values() if len(names) > 1}


def load_optimizer_state(optimizer, checkpoint) -> None:
    """Inner optimizer statistics and local_epoch; then the LR schedule is brought to that epoch."""
    try:
        optimizer.load_state_dict(checkpoint.optimizer_state)
    except (ValueError, KeyError, RuntimeError) as e:
        logger.warning(
            "The optimizer state in %s does not fit this optimizer (%s): keeping fresh statistics",
            checkpoint.path.name,
            e,
        )
        optimizer.state_averager.local_epoch = checkpoint.epoch
    # hivemind would only bring the schedule to local_epoch at its next global step
    optimizer.state_averager._update_scheduler()
    optimizer.tracker.report_local_progress(optimizer.local_epoch, samples_accumulated=0)
    # hivemind offers a peer's state at its epoch only from its next global step: offer the resumed epoch now, so
    # a fresh peer starting next to this one takes this state rather than the other way round (initial_state.py)
    if not optimizer.client_mode and not optimizer.auxiliary:
        optimizer.state_averager.state_sharing_priority = optimizer.local_epoch


@torch.no_grad()
def reload_parameters(model: torch.nn.Module, optimizer, checkpoint) -> None:
    """Put the checkpoint's parameters back after hivemind built its optimizer around them.

    hivemind initialises an optimizer's statistics with one step on zero gradients (state_averager.py
    `initialize_optimizer_state_`), and that step moves the parameters whenever the optimizer decays weights
    (AdamW, LAMB): every restart would otherwise shrink the resumed weights by lr x weight_decay once more. With
    offload_optimizer the step moved hivemind's copies, which the next step writes into the model: reset those too.
    """
    load_model_state(model, checkpoint)
    averager = optimizer.state_averager
    if averager.offload_optimizer:
        with averager.lock_optimizer:
            copies = [param for group in averager.optimizer.param_groups for param in group["params"]]
            for main, copy in zip(averager.main_parameters, copies):
                copy.copy_(main)
