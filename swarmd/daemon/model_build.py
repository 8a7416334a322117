"""The start-up's model phase: the task, its model on the device, the checkpoint it resumed from, and what the peer
tells the swarm about them (its compatibility, its start values). Pool threads do the work, so the loop stays free
for the DHT's start meanwhile (daemon/parallel_start.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["BuiltModel", "build_model"]

logger = logging.getLogger("swarmd.daemon")


@dataclass
class BuiltModel:
    task: Any
    model: Any
    device: Any  # where rank 0 (this process) trains
    devices: list  # one per rank
    checkpointer: Optional[Any]  # daemon/checkpointer.py Checkpointer, when checkpoints are on
    checkpoint: Optional[Any]  # the checkpoint the model resumed from, or None
    compatibility: dict  # swarm/compatibility.py compatibility_of
    start_values: str  # swarm/initial_state.py start_values


async def build_model(config, *, check_stop: Callable[[], None]) -> BuiltModel:
    from swarmd.ranks.devices import resolve_devices
    from swarmd.seeds import init_seed, seed_everything
    from swarmd.swarm.compatibility import compatibility_of
    from swarmd.swarm.initial_state import start_values
    from swarmd.tasks.registry import build_task

    devices = resolve_devices(config.training)  # one per rank; rank 0 (this process) trains on the first
    device = devices[0]
    seed = init_seed(config.training.seed, config.run_id)
    task = build_task(config, device=device, seed=seed, ranks=len(devices))
    if config.swarm.auxiliary:  # it averages, never reads data: it must start without the dataset
        logger.info("Preparing task %s for an auxiliary peer (no data)", config.task.name)
        await asyncio.to_thread(task.prepare_auxiliary)
    else:
        logger.info("Preparing task %s (%s)", config.task.name, type(task).description)
        await asyncio.to_thread(task.prepare)
    check_stop()
    seed_everything(seed)  # the same on every peer of the run (swarmd/seeds.py): one model per swarm
    model = await asyncio.to_thread(task.build_model)
    n_params = sum(p.numel() for p in model.parameters())
    compatibility = compatibility_of(config, model)
    logger.info("Model: %.2fM parameters, device %s, precision %s", n_params / 1e6, device, task.context.precision)
    checkpointer = checkpoint = None
    if config.checkpoint.enabled:
        from swarmd.daemon.checkpointer import Checkpointer

        checkpointer = Checkpointer.from_config(config)  # checkpoint.dir; records the run's config
        checkpoint = await asyncio.to_thread(checkpointer.load_into_model, model)
    values = await asyncio.to_thread(start_values, model, checkpoint.epoch if checkpoint is not None else 0)
    model.to(device)
    check_stop()
    return BuiltModel(task, model, device, devices, checkpointer, checkpoint, compatibility, values)
