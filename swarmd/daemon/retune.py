"""Run-wide settings a running peer changes without a restart (swarm/manifest_update.py LIVE_KEYS, the swarm
part): the optimizer reads them at each use, and the worker's watchdog budgets derived from them are recomputed."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["LIVE_SWARM_KEYS", "retune"]

LIVE_SWARM_KEYS = ("averaging_timeout", "load_state_timeout")  # attributes of hivemind.Optimizer, read at each use


def retune(runtime, config, changes: dict[str, Any]):
    """Apply `changes` (swarm key -> value) to the running optimizer and worker; the config with them (the daemon
    keeps it, so a later change builds on this one). ValueError for a key that cannot change live."""
    unknown = sorted(set(changes) - set(LIVE_SWARM_KEYS))
    if unknown:
        raise ValueError(f"swarm.{unknown[0]} cannot change while training")
    swarm = config.swarm.model_copy(update=changes)
    updated = config.model_copy(update={"swarm": swarm})
    if runtime is None:
        return updated
    for key, value in changes.items():
        setattr(runtime.optimizer, key, value)
    worker = runtime.worker
    if worker is not None:
        from swarmd.worker.trainer import WorkerSettings

        budgets = WorkerSettings.from_config(updated)
        worker.settings = dataclasses.replace(worker.settings, download_budget=budgets.download_budget,
                                              step_budget=budgets.step_budget)
    return updated
