"""What a started daemon trains with, and how its training stops: the worker, the other ranks, the last save."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from swarmd.daemon.guarded import bounded
from swarmd.ranks.local import OneRank

__all__ = ["Runtime"]

logger = logging.getLogger("swarmd.daemon")


@dataclass
class Runtime:
    """Built by the daemon's start-up phases (daemon/lifecycle.py), stopped by its shutdown."""

    task: Any
    model: Any
    optimizer: Any  # a built strategy (swarm/strategies/ SwarmStrategy)
    stats: Any  # worker/stats.py WorkerStats
    averaging_log: Any  # swarm/averaging_log.py AveragingLog
    ranks: Any = dataclasses.field(default_factory=OneRank)  # ranks/local.py LocalRanks (training.devices)
    worker: Any = None  # worker/trainer.py TrainingWorker, once started

    async def stop_training(self, remaining: Callable[[], float], *, final_save_needed: Callable[[], bool]) -> None:
        """Stop the worker and the other ranks, then save: the live state after a clean stop (when
        `final_save_needed()`), the worker's last good state (its in-memory backup) when a rank died mid-step.
        `remaining()`: the seconds left of the stop's budget."""
        stopped_cleanly = await self._stop_worker(remaining)
        rank_died = self.ranks.dead_rank() is not None
        await bounded("stopping the other ranks", lambda: self.ranks.close(min(remaining(), 10.0)), remaining)
        worker = self.worker
        if rank_died and worker is not None and not worker.alive and worker.save_checkpoint is not None:
            worker.restore_last_good_state()
            await bounded("saving the last good state", worker.save_checkpoint, remaining)
        elif stopped_cleanly and final_save_needed():
            await bounded("saving the final checkpoint", worker.save_checkpoint, remaining)

    async def _stop_worker(self, remaining: Callable[[], float]) -> bool:
        """True when the worker stopped cleanly in time (so its state can be saved)."""
        worker = self.worker
        if worker is None:
            return False
        worker.request_stop()
        bound = remaining() * 0.6
        if worker.alive:  # say what the stop waits for: a step inside a failing averaging round can take all of it
            activity, since, budget = self.stats.activity()
            waits = f"; it may wait on the swarm (averaging, a download) up to {budget:.0f} s" if budget else ""
            logger.info(
                "Stopping: waiting up to %.0f s for the training worker's %s (under way for %.0f s%s); a second signal "
                "forces the exit", bound, activity, since, waits,
            )
        if not await asyncio.to_thread(worker.join, bound):
            logger.warning("The training step in progress did not finish in time: abandoning it")
            return False
        return worker.failure is None
