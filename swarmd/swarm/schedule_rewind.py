"""A learning rate schedule set back to an earlier epoch (a refused download's epoch undone, DiLoCo's inner steps
after a download or a restore): torch's schedules and hivemind's TrainingStateAverager only step a schedule
forward, and a chainable schedule (StepLR, ExponentialLR, ...) computes each rate from the last one, so going back
means building the schedule again from its factory, from each group's initial rate, and stepping it forward."""

from __future__ import annotations

import logging
from typing import Callable, Optional

__all__ = ["schedule_at", "schedule_built_again", "scheduler_set_back"]

logger = logging.getLogger(__name__)


def schedule_built_again(factory: Callable, optimizer):
    """A new schedule from `factory` at its epoch 0. A torch schedule built anew takes each group's initial_lr as its
    base but starts a chainable form from the group's current rate: that is put back to the initial one first."""
    for group in optimizer.param_groups:
        if "initial_lr" in group:
            group["lr"] = group["initial_lr"]
    return factory(optimizer)


def schedule_at(scheduler, factory: Callable, optimizer, epoch: int):
    """`factory`'s schedule at `epoch`: `scheduler` stepped forward to it, or built again where there is none yet or
    it is past `epoch` (a schedule only steps forward). None where the factory builds none."""
    if scheduler is None or scheduler.last_epoch > epoch:
        scheduler = schedule_built_again(factory, optimizer)
    while scheduler is not None and scheduler.last_epoch < epoch:
        scheduler.step()
    return scheduler


def scheduler_set_back(scheduler, factory: Optional[Callable], epoch: int):
    """The schedule at `epoch` where `scheduler` is past it, whatever its kind; `scheduler` itself where it is not.
    Without a factory (the averager was handed a built schedule) it stays where it is, said in the log."""
    if scheduler is None or scheduler.last_epoch <= epoch:
        return scheduler
    if factory is None:
        logger.warning("The learning rate schedule (%s) cannot be set back to epoch %d: it stays at epoch %d's",
                       type(scheduler).__name__, epoch, scheduler.last_epoch)
        return scheduler
    return schedule_at(scheduler, factory, scheduler.optimizer, epoch)
