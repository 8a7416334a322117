"""What a strategy is (`Strategy`: its name, build, agreed settings and averagers) and what the rest of swarmd may use
of a built one (`SwarmStrategy`). Each strategy's module (sync.py, diloco.py) defines its own `Strategy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

__all__ = ["STRATEGY_FIELDS", "Strategy", "SwarmStrategy"]

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
    outliers_clipped_total: int  # senders robust aggregation clipped as outliers (swarm/upstream/robust_aggregation.py)
    catching_up: bool  # holds the swarm's epoch ahead of its state: neither evaluate nor checkpoint
    param_groups: list

    @property
    def local_epoch(self) -> int: ...

    @property
    def parameters_version(self) -> Any: ...  # changes whenever the model's parameters were written

    def step(self, closure=None, batch_size: Optional[int] = None, grad_scaler=None): ...

    def load_state_from_peers(self, **kwargs) -> None: ...

    def restore_parameters(self, saved: list) -> None: ...  # the worker's last good parameters, after a bad step

    # a downloaded state refused: `saved` (the parameters of `epoch`) back; returns the donors
    def refuse_state(self, saved: list, epoch: Optional[int] = None) -> list: ...

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
