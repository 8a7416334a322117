"""The swarm strategies a peer trains with (`swarm.strategy`), and the one protocol the rest of swarmd uses of them.

- sync: hivemind.Optimizer (swarm/optimizer.py SwarmOptimizer): gradients (or, with local updates, parameters)
  averaged once per global epoch of `swarm.target_batch_size` samples;
- diloco: swarm/diloco.py DiLoCoOptimizer: H inner steps of the task's optimizer, then an outer Nesterov step on
  the averaged pseudo-gradient.

Each `Strategy` says, for its name: how its optimizer is built from the config and the task, which of its settings
the swarm's peers must agree on (swarm/compatibility.py), and which averagers it runs (swarm/averager_keys.py).
Nothing outside this module and the config's validation tests a strategy's name (tests/unit/test_strategies.py).
`SwarmStrategy` is what the daemon, the worker, the snapshot and the checkpoints may use of a built one.
Both must be built on the main thread (hivemind's averagers call signal.signal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from swarmd.swarm import averager_keys

__all__ = ["STRATEGIES", "Strategy", "SwarmStrategy", "build_swarm_optimizer", "strategy_of"]

# the compatibility fields whose meaning depends on the strategy: each strategy sets the ones it owns, 0 the others
STRATEGY_FIELDS = ("target_batch_size", "inner_steps")


class SwarmStrategy(Protocol):
    """A built strategy, as the daemon (lifecycle, checkpointer, restore), the worker and the snapshot use it."""

    dht: Any  # the peer's hivemind.DHT
    run_id: str
    client_mode: bool
    auxiliary: bool
    tracker: Any  # hivemind's ProgressTracker: global_progress, global_epoch, report_local_progress
    # hivemind's TrainingStateAverager: main_parameters, local_epoch, lock_optimizer, state_sharing_priority,
    # last_parameter_drift, step(wait_for_delayed_updates=True); the optimizer state (and DiLoCo's outer one) lives in it
    state_averager: Any
    grad_averager: Any  # None where gradients are not averaged (local updates, DiLoCo)
    state_loads_total: int  # downloads of the swarm's state so far
    outliers_clipped_total: int  # senders robust aggregation clipped as outliers (swarm/robust_aggregation.py)
    catching_up: bool  # holds the swarm's epoch ahead of its state: neither evaluate nor checkpoint
    param_groups: list

    @property
    def local_epoch(self) -> int: ...

    @property
    def parameters_version(self) -> Any: ...  # changes whenever the model's parameters were written

    def step(self, closure=None, batch_size: Optional[int] = None, grad_scaler=None): ...

    def load_state_from_peers(self, **kwargs) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state_dict: dict) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Strategy:
    name: str
    build: Callable[..., SwarmStrategy]  # (*, dht, config, model, task, averaging_log)
    # the STRATEGY_FIELDS it owns, which every peer of the run must share, from the swarm config
    agreed: Callable[[Any], dict]
    owns: tuple[str, ...]
    averager_suffixes: tuple[str, ...]  # every averager it may run
    state_suffix: str  # the averager whose state a joiner downloads
    # one round (global epoch) of it in words, from the swarm config, for the log ("target batch 1024")
    describe_round: Callable[[Any], str]

    def compatibility(self, swarm_config) -> dict:
        """The strategy-dependent compatibility fields of this peer: the strategy's own, 0 for the rest."""
        return {**dict.fromkeys(STRATEGY_FIELDS, 0), **self.agreed(swarm_config)}

    def of_record(self, fields: dict) -> dict:
        """A peer record's compatibility fields with the strategy-dependent ones it does not own set to 0 (older
        records carried a target batch size under DiLoCo, which means nothing there)."""
        return {key: 0 if key in STRATEGY_FIELDS and key not in self.owns else value for key, value in fields.items()}


def _build_sync(**kwargs) -> SwarmStrategy:
    from swarmd.swarm.optimizer import build_sync_optimizer

    return build_sync_optimizer(**kwargs)


def _build_diloco(**kwargs) -> SwarmStrategy:
    from swarmd.swarm.diloco import build_diloco_optimizer

    return build_diloco_optimizer(**kwargs)


STRATEGIES = {
    "sync": Strategy(
        "sync", _build_sync,
        agreed=lambda swarm: {"target_batch_size": swarm.target_batch_size}, owns=("target_batch_size",),
        averager_suffixes=(averager_keys.STATE, averager_keys.GRADIENTS), state_suffix=averager_keys.STATE,
        describe_round=lambda swarm: f"target batch {swarm.target_batch_size}",
    ),
    "diloco": Strategy(
        "diloco", _build_diloco,
        # a round ends after H steps of each peer (its tracker's target is H x this peer's batch): H must agree
        agreed=lambda swarm: {"inner_steps": swarm.diloco.inner_steps}, owns=("inner_steps",),
        averager_suffixes=(averager_keys.DILOCO_STATE, averager_keys.DILOCO_OUTER),
        state_suffix=averager_keys.DILOCO_STATE,
        describe_round=lambda swarm: f"a round of {swarm.diloco.inner_steps} inner steps x the batch",
    ),
}


def strategy_of(config) -> Strategy:
    """The strategy of a validated config (its schema admits only the names above)."""
    return STRATEGIES[config.swarm.strategy]


def build_swarm_optimizer(*, dht, config, model, task, averaging_log) -> SwarmStrategy:
    return strategy_of(config).build(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log)
