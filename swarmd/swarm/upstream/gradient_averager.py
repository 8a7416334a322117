"""The sync strategy's gradient averager: hivemind's GradientAverager behind the private swarm's gate, weighted while
this peer catches up, and keeping this peer's own contribution (what the guard judges an average against, and what a
failed or partial round falls back to)."""

from __future__ import annotations

from typing import Callable, Optional

from hivemind.optim.grad_averager import GradientAverager

from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames

__all__ = ["AdmittingGradientAverager", "GradientAveragerKeepingOwn"]


class AdmittingGradientAverager(UpstreamRpcNames, GradientAverager, AdmitsAllowedPeers):
    """hivemind's gradient averager behind the private swarm's gate (swarm/upstream/averager_gate.py), with a weight of its
    own while this peer catches up by averaging (upstream weighs a round by the samples accumulated)."""

    _upstream = GradientAverager
    round_weight: Optional[float] = None  # None: the samples accumulated, as upstream; catching up: CATCHING_UP_WEIGHT
    # evidence judged over this peer's whole share, as for parameters (robust_aggregation.py SHARE_OUTLIER_RADII): part
    # by part, honest gradients were clipped in the tiny parts (a bias, a last layer of 64 values) of the attack
    # benchmark's sync cells, and an honest peer was excluded in its clean and x -1e6 cells (2026-12-06)
    judges_whole_share = True
    judges_direction = True  # gradients: a sender pointing away from the result is an outlier (robust_aggregation.py)

    def __init__(self, *args, **kwargs):
        # every peer's gradient round is triggered by the same event (the swarm's epoch end), so a leader whose round
        # is due need not wait for the stale scheduled time (swarm/upstream/averager_pace.py)
        kwargs.setdefault("assemble_when_triggered", True)
        # its gradient buffers are nothing a joiner can use (see SwarmOptimizer._download_state_bounded): not
        # offered for download, which also spares the DHT its "download my state" declarations
        kwargs.setdefault("allow_state_sharing", False)
        super().__init__(*args, **kwargs)

    # reads the epoch a round averages as the round begins (the optimizer's local epoch, set at its construction),
    # sent with it to the group (swarm/round_epochs.py); None: nothing sent, as upstream
    round_epoch_source: Optional[Callable[[], int]] = None

    def step(self, weight: Optional[float] = None, *args, **kwargs):
        return super().step(self.round_weight if weight is None else weight, *args, **kwargs)

    def schedule_step(self, scheduled_time: Optional[float] = None, **kwargs):
        # every round begins here: a pre-scheduled one, and one that step() begins without a scheduled group
        if self.round_epoch_source is not None:
            kwargs.setdefault("gather", self.round_epoch_source())
        return super().schedule_step(scheduled_time, **kwargs)


class GradientAveragerKeepingOwn(AdmittingGradientAverager):
    """Remembers this peer's own contribution to the round, so the average can be judged against it."""

    own_gradients: Optional[list] = None

    def load_accumulators_into_averager_(self):
        super().load_accumulators_into_averager_()
        with self.get_tensors() as contribution:
            if self.own_gradients is None:
                self.own_gradients = [tensor.clone() for tensor in contribution]
            else:
                for own, tensor in zip(self.own_gradients, contribution):
                    own.copy_(tensor)
