"""`swarm.strategy: sync`: hivemind's Optimizer (swarm/upstream/optimizer.py SwarmOptimizer): the peers' gradients
averaged once per global epoch of `swarm.target_batch_size` samples (or, with `use_local_updates`, their
parameters every `average_state_every` epochs). Its peers must agree on the target batch size."""

from __future__ import annotations

from swarmd.swarm import averager_keys
from swarmd.swarm.averaging_log import AveragingLog
from swarmd.swarm.strategies.protocol import Strategy

__all__ = ["STRATEGY", "build_sync_optimizer"]


def build_sync_optimizer(*, dht, config, model, task, averaging_log: AveragingLog):
    """`swarm.strategy: sync`: SwarmOptimizer (a hivemind.Optimizer) from the config and task."""
    from swarmd.swarm.strategies.shared import shared_optimizer_options
    from swarmd.swarm.upstream.optimizer import SwarmOptimizer

    swarm = config.swarm
    return SwarmOptimizer(
        **shared_optimizer_options(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log),
        refresh_parameters=swarm.refresh_parameters,
        refresh_one_behind=swarm.refresh_one_behind,
        state_round_search=swarm.state_round_search,
        round_epoch_check=swarm.round_epoch_check,
        step_on_partial_average=swarm.step_on_partial_average,
        catch_up_by_averaging=bool(swarm.catch_up_by_averaging),  # off unless asked (the config's description)
        prescheduled_averaging=swarm.prescheduled_averaging,
        clip_local_grad_norm=swarm.clip_local_grad_norm,
        target_batch_size=swarm.target_batch_size,
        batch_size_per_step=None if swarm.auxiliary else config.training.batch_size,
        optimizer=task.build_optimizer,
        scheduler=task.build_scheduler,
        reuse_grad_buffers=swarm.reuse_grad_buffers,
        offload_optimizer=swarm.offload_optimizer,
        delay_optimizer_step=swarm.delay_optimizer_step,
        delay_grad_averaging=swarm.delay_grad_averaging,
        delay_state_averaging=swarm.delay_state_averaging,
        average_state_every=swarm.average_state_every,
        use_local_updates=swarm.use_local_updates,
        auxiliary=swarm.auxiliary,
        average_opt_statistics=tuple(swarm.average_opt_statistics),
    )


STRATEGY = Strategy(
    "sync", build_sync_optimizer,
    agreed=lambda swarm: {"target_batch_size": swarm.target_batch_size}, owns=("target_batch_size",),
    averager_suffixes=(averager_keys.STATE, averager_keys.GRADIENTS), state_suffix=averager_keys.STATE,
    describe_round=lambda swarm: f"target batch {swarm.target_batch_size}",
)
