"""`swarm.strategy: diloco`: H inner steps of the task's optimizer on each peer, then an outer Nesterov step on the
peers' averaged pseudo-gradients (diloco_optimizer.py; docs/DILOCO.md). Its peers must agree on H."""

from __future__ import annotations

from swarmd.swarm import averager_keys
from swarmd.swarm.averaging_log import AveragingLog
from swarmd.swarm.strategies.protocol import Strategy

__all__ = ["STRATEGY", "build_diloco_optimizer"]


def build_diloco_optimizer(*, dht, config, model, task, averaging_log: AveragingLog):
    """DiLoCoOptimizer from the config and task. Must run on the main thread (averagers call signal.signal)."""
    from swarmd.swarm.strategies.diloco_optimizer import DiLoCoOptimizer
    from swarmd.swarm.strategies.shared import shared_optimizer_options

    swarm, diloco = config.swarm, config.swarm.diloco
    return DiLoCoOptimizer(
        **shared_optimizer_options(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log),
        inner_optimizer=task.build_optimizer,
        inner_scheduler=task.build_scheduler,
        batch_size=config.training.batch_size,
        inner_steps=diloco.inner_steps,
        outer_lr=diloco.outer_lr,
        outer_momentum=diloco.outer_momentum,
        nesterov=diloco.nesterov,
        max_straggler_wait=diloco.max_straggler_wait,
        overlap_steps=diloco.overlap_steps,
        overlap_mixing=diloco.overlap_mixing,
        prescheduled_outer_rounds=swarm.prescheduled_averaging,
        average_state_every=diloco.average_state_every,
        state_check_tolerance=diloco.state_check_tolerance,
        catch_up_by_averaging=swarm.catch_up_by_averaging is not False,  # on unless turned off
        clip_local_grad_norm=swarm.clip_local_grad_norm,  # clips each inner step's gradient
    )


STRATEGY = Strategy(
    "diloco", build_diloco_optimizer,
    # a round ends after H steps of each peer (its tracker's target is H x this peer's batch): H must agree
    agreed=lambda swarm: {"inner_steps": swarm.diloco.inner_steps}, owns=("inner_steps",),
    averager_suffixes=(averager_keys.DILOCO_STATE, averager_keys.DILOCO_OUTER),
    state_suffix=averager_keys.DILOCO_STATE,
    describe_round=lambda swarm: f"a round of {swarm.diloco.inner_steps} inner steps x the batch",
)
