"""The swarm strategy a peer trains with (`swarm.strategy`), built from the config and the task.

- sync: hivemind.Optimizer (swarm/optimizer.py SwarmOptimizer): gradients (or, with local updates, parameters)
  averaged once per global epoch;
- diloco: swarm/diloco.py DiLoCoOptimizer: H inner steps of the task's optimizer, then an outer Nesterov step on
  the averaged pseudo-gradient.
Both must be built on the main thread (hivemind's averagers call signal.signal).
"""

from __future__ import annotations

__all__ = ["build_swarm_optimizer"]


def build_swarm_optimizer(*, dht, config, model, task, averaging_log):
    if config.swarm.strategy == "diloco":
        from swarmd.swarm.diloco import build_diloco_optimizer as build
    else:
        from swarmd.swarm.optimizer import build_sync_optimizer as build
    return build(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log)
