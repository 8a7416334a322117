"""The swarm strategies a peer trains with (`swarm.strategy`), and the one protocol the rest of swarmd uses of them.

- sync (sync.py): hivemind.Optimizer (swarm/upstream/optimizer.py SwarmOptimizer): gradients (or, with local
  updates, parameters) averaged once per global epoch of `swarm.target_batch_size` samples;
- diloco (diloco.py, diloco_optimizer.py): H inner steps of the task's optimizer, then an outer Nesterov step on
  the averaged pseudo-gradient; built from the same parts as the sync optimizer (swarm/upstream/peer_parts.py),
  not from the sync optimizer itself.

Each strategy's `Strategy` (protocol.py) says, for its name: how its optimizer is built from the config and the
task, which of its settings the swarm's peers must agree on (swarm/compatibility.py), and which averagers it runs
(swarm/averager_keys.py). Nothing outside this package and the config's validation tests a strategy's name
(tests/unit/test_strategies.py). `SwarmStrategy` is what the daemon, the worker, the snapshot and the checkpoints
may use of a built one. Both must be built on the main thread (hivemind's averagers call signal.signal).
"""

from __future__ import annotations

from swarmd.swarm.strategies import diloco, sync
from swarmd.swarm.strategies.protocol import STRATEGY_FIELDS, Strategy, SwarmStrategy

__all__ = ["STRATEGIES", "STRATEGY_FIELDS", "Strategy", "SwarmStrategy", "build_swarm_optimizer", "strategy_of"]

STRATEGIES = {strategy.name: strategy for strategy in (sync.STRATEGY, diloco.STRATEGY)}


def strategy_of(config) -> Strategy:
    """The strategy of a validated config (its schema admits only the names above)."""
    return STRATEGIES[config.swarm.strategy]


def build_swarm_optimizer(*, dht, config, model, task, averaging_log) -> SwarmStrategy:
    return strategy_of(config).build(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log)
