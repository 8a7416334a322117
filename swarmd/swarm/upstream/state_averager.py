"""The state averager of every strategy: hivemind's TrainingStateAverager, observed (every state round recorded,
the parameters' drift from the average measured, every write of the model's parameters counted), weighted (a peer
catching up weighs next to nothing) and safe to serve from (copies, not the live tensors). DiLoCo's
(diloco_state.py) adds its outer state on top."""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from hivemind.averaging.control import StepControl
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.utils import get_dht_time

from swarmd.swarm.averaging_log import AveragingLog, RoundTimeline
from swarmd.swarm.optimizer_state_wire import COUNTER_KEYS
from swarmd.swarm.state_layout import StateLayout, optimizer_layout
from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.upstream.parameter_refresh import ServesParameters
from swarmd.swarm.upstream.partial_rounds import missing_share, what_did_not_arrive
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames

__all__ = ["ObservedStateAverager", "bounded_search", "taken_by_upstream"]

logger = logging.getLogger(__name__)


def bounded_search(timeout: float, scheduled_time: Optional[float], limit: float, now: Optional[float] = None) -> float:
    """A round's timeout (how long it may look for a group, upstream's DecentralizedAverager.step) cut to `limit`
    seconds past its scheduled start (a pre-scheduled round's lies ahead; upstream requires it before the deadline)."""
    now = get_dht_time() if now is None else now
    until_start = max(0.0, scheduled_time - now) if scheduled_time is not None else 0.0
    return min(timeout, until_start + limit)


class RecordsRounds(AdmitsAllowedPeers):
    """Sits between TrainingStateAverager and DecentralizedAverager in the MRO, where every round starts (above the
    gate that refuses callers outside a private swarm's list, swarm/upstream/averager_gate.py)."""

    _averaging_log: AveragingLog
    _epoch_of_round: Callable[[], int]
    _on_state_loaded: Callable[[], None]
    rounds_with_others = 0  # state rounds that succeeded in a group of two or more
    # Parameters are judged over this peer's whole share, at a wider bound (robust_aggregation.py SHARE_OUTLIER_RADII):
    # under local updates each peer steps alone between state rounds, so honest parameters differ by how many
    # steps each took since the last round and by the transitions its tracker has not made yet, and part by part
    # (a bias of 64 values) a slow or lagging peer looked like a liar: the attack benchmark's clean local-updates
    # cell excluded an honest peer as clipped in 4 runs of 6 (docs/FAULTS.md).
    judges_whole_share = True
    # ...and it does not average parameters in a group of two with a suspect: a quiet liar that some honest peers
    # excluded meets the others in pairs, where CenteredClip is the plain mean and no evidence against it comes at
    # honest scale; its parameters would replace half of the partner's model every round (the attack benchmark's
    # local-updates sign flip: 0.0255 against a clean 0.0023 after two of three honest peers excluded the attacker
    # and the third kept pairing with it)
    avoids_pairs_with_suspects = True
    # A gradient or state round came back in part (swarm/upstream/partial_rounds.py): the group's members hold different
    # models. SwarmOptimizer then averages state at the next epoch's end, whatever average_state_every says.
    resync_requested = False
    # Seconds a state round may look for its group past its scheduled start (None: upstream's, the round's whole
    # timeout). Under gradient averaging (SwarmOptimizer sets it) every peer begins the state round of an epoch at
    # that epoch's end, within a matchmaking time of the others; a peer that came later than that (a joiner, a slow
    # peer) found the group gone, and upstream kept looking for averaging_timeout (30 s by default) while its next
    # optimizer step waited on the round (delay_state_averaging: the step takes the round's result first). A
    # 20M-parameter joiner of benchmarks/join_time.py stood 17-25 s at one epoch so, and where the swarm's next
    # state round came first (ten epochs later) it averaged its parameters of ten epochs before into the swarm's
    # at a third of the weight. A round that gives up is recorded as failed, and the peer trains on.
    group_search_limit: Optional[float] = None

    @property
    def judged_step_tensors(self) -> int:
        # the parameters lead upstream's averaged tensors (TrainingStateAverager._init_averaged_tensors), optimizer
        # statistics and extras follow: each sender's parameters' step since this peer's last state round is judged
        # for direction (swarm/upstream/robust_aggregation.py); the statistics' changes point no common way
        return len(getattr(self, "_averaged_parameters", ()))

    def step(self, *args, **kwargs):
        if self.group_search_limit is not None and kwargs.get("timeout") is not None:
            kwargs["timeout"] = bounded_search(kwargs["timeout"], kwargs.get("scheduled_time"), self.group_search_limit)
        control = super().step(*args, **kwargs)
        if isinstance(control, StepControl):
            created = time.time()
            control.add_done_callback(lambda future: self._record_state_round(future, created))
        return control

    def _record_state_round(self, control: StepControl, created: float) -> None:
        # Pre-scheduled rounds are created before they may start: time the round from its scheduled start.
        duration = max(0.0, time.time() - max(created, control.scheduled_time))
        epoch = self._epoch_of_round()
        if control.cancelled():
            self._averaging_log.record("state", "skipped", group_size=1, duration=0.0, epoch=epoch)
            return
        self.resync_requested = False  # a state round ran: the request is served, whatever its outcome
        error = control.exception()
        missing = missing_share(control.result()) if error is None else 0.0
        timeline = RoundTimeline.of(control)
        if error is not None:
            self._averaging_log.record(
                "state", "failed", group_size=1, duration=duration, epoch=epoch, error=repr(error), timeline=timeline
            )
        elif missing:
            logger.warning("Averaging parameters returned %.1f%% of the average; averaging them again at the next "
                           "epoch's end", 100 * (1 - missing))
            self.resync_requested = True
            self._averaging_log.record("state", "partial", group_size=1, duration=duration, epoch=epoch,
                                       error=what_did_not_arrive(missing), timeline=timeline)
        else:
            group_size = len(control.result())
            self.rounds_with_others += group_size >= 2
            self._averaging_log.record("state", "success", group_size=group_size, duration=duration, epoch=epoch,
                                       timeline=timeline)

    # The metadata of what the last download brought (None: nothing came), before upstream (above) decided to take
    # it; not its tensors, which would stay alive (a whole state, in shared memory) until the next download
    _arrived_metadata = None

    def load_state_from_peers(self, *args, **kwargs):
        loaded = super().load_state_from_peers(*args, **kwargs)
        self._arrived_metadata = loaded[0] if loaded is not None else None
        return loaded


def taken_by_upstream(metadata, epoch_before: int, epoch_after: int) -> bool:
    """Whether upstream's TrainingStateAverager.load_state_from_peers took the state whose `metadata` arrived
    (returning None either way): it refuses one whose epoch is not an int or is behind this peer's (`epoch_before`),
    and a taken one sets the peer's epoch to its own. (Its other refusals, a state of another layout, do not get that
    far here: the download refuses those, state_stream.py `_misfit`.)"""
    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
    return isinstance(epoch, int) and epoch >= epoch_before and epoch_after == epoch


def _factory_of(scheduler) -> Optional[Callable]:
    """`scheduler` where it is what builds a schedule from an optimizer (upstream's SchedulerFactory), else None."""
    from torch.optim.lr_scheduler import LRScheduler

    return scheduler if callable(scheduler) and not isinstance(scheduler, LRScheduler) else None


# the param-group entries a downloaded optimizer state may set: the parameters' indices and the counters
_DONOR_GROUP_KEYS = ("params", *COUNTER_KEYS)


class ObservedStateAverager(UpstreamRpcNames, ServesParameters, TrainingStateAverager, RecordsRounds):
    _upstream = TrainingStateAverager

    def __init__(self, *, averaging_log: AveragingLog, on_state_loaded: Callable[[], None], **kwargs):
        self._averaging_log = averaging_log
        self._on_state_loaded = on_state_loaded
        self._epoch_of_round = lambda: self.local_epoch
        # what the schedule was built from (upstream builds it and keeps only the schedule): a refused download's
        # epoch undone sets it back by building it again (swarm/schedule_rewind.py)
        self.scheduler_factory = _factory_of(kwargs.get("scheduler"))
        super().__init__(**kwargs)

    def load_state_from_peers(self, *args, **kwargs):
        """Upstream's download, which loads the donor's optimizer state_dict whole, param groups included: the
        donor chose this peer's learning rate, momentum and weight decay (a lying one could set lr = 1e6). The
        hyperparameters are the run's, agreed and checked at join (manifest, compatibility), so each group keeps
        its own; only counters (timm's LAMB keeps its 'step' in the group) come from the donor, and the learning
        rate is the one this peer's schedule gives at the epoch that came."""
        own = [{key: value for key, value in group.items() if key not in _DONOR_GROUP_KEYS}
               for group in self.optimizer.param_groups]
        epoch_before, self._arrived_metadata = self.local_epoch, None
        try:
            result = super().load_state_from_peers(*args, **kwargs)
        finally:
            with self.lock_optimizer:
                for group, hyperparameters in zip(self.optimizer.param_groups, own):
                    group.update(hyperparameters)
                if self.scheduler is not None:
                    for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                        group["lr"] = lr
        # counted once taken: a state upstream refused (its epoch behind this peer's) is no download, or the worker
        # would judge this peer's own parameters as the download's (download_judge.py) and skip its guards once
        if taken_by_upstream(self._arrived_metadata, epoch_before, self.local_epoch):
            self._on_state_loaded()
        return result

    # DiLoCo's averager appends its inner optimizer's state to upstream's (diloco_state.py)
    appends_to_state = False

    def state_layout(self, kind: str) -> StateLayout:
        """This peer's own layout, which a donor's must match before anything of it is applied: upstream's loader
        trusts the donor's shapes and parameter indices (swarm/state_layout.py)."""
        own = [*(p for group in self.optimizer.param_groups for p in group["params"]), *self.extra_tensors]
        shapes = tuple(tuple(tensor.shape) for tensor in own)
        if kind != "state":
            return StateLayout(shapes)
        metadata, statistics = optimizer_layout(self.optimizer)
        return StateLayout(shapes + statistics, metadata, more_allowed=self.appends_to_state)

    def compared_tensors(self, kind: str) -> int:
        """The parameters and extras, which donors of one epoch share (swarm/state_parts.py); not the optimizer's
        statistics, which peers under local updates keep apart."""
        return len(self.state_layout("parameters").shapes)

    def get_current_state(self):
        """Upstream's state for a peer that downloads it, as copies. Upstream hands out the live host tensors (`.cpu()`
        of a CPU tensor is itself), and its host thread sends them to the averager process through a pipe, whose
        pickler (torch.multiprocessing's) moves each storage into shared memory in place: the old memory is freed
        under the training thread that is stepping or reading it, and the serving peer dies of a SIGSEGV
        (docs/PERFORMANCE.md section 5). A copy costs one more pass over the state per download served; made in
        shared memory, it is the only one (the pipe then passes it by handle)."""
        return self.served_state(*self.live_state())  # copies (shared_copy), of the part alone where one is asked

    # Counts the ways hivemind writes the model's own parameters, so the data-parallel ranks of this peer
    # (swarmd.ranks) get them again exactly when they changed: averaged state applied, the offloaded optimizer's
    # parameters copied back, or the local optimizer stepping them in place.
    parameters_version = 0

    # How far this peer's parameters were from the swarm's average at the last state averaging (L2 distance over
    # the average's norm; None until one applied): after failed or rejected gradient rounds a peer steps on its own
    # gradients and drifts, and only parameter averaging (every average_state_every epochs) pulls it back.
    last_parameter_drift: Optional[float] = None

    def _apply_averaging_results_(self):
        self.last_parameter_drift = self._parameter_drift()
        super()._apply_averaging_results_()
        self.parameters_version += 1

    # With the optimizer offloaded (hivemind's default on CPU) a round averages the optimizer's parameters in place
    # (reuse_tensors) and nothing is applied afterwards: the drift is then measured against a copy taken between
    # the optimizer step and the all-reduce (hivemind's _do calls _update_scheduler there, under lock_optimizer).
    _copy_before_round = False
    _own_before_round: Optional[list] = None

    def _update_scheduler(self):
        super()._update_scheduler()
        if self._copy_before_round:
            self._copy_before_round = False
            with self.get_tensors() as tensors:
                count = len(self.main_parameters)
                self._own_before_round = [tensor.detach().float().clone() for tensor in list(tensors)[:count]]

    def _measure_drift_of_round_in_place(self) -> None:
        own, self._own_before_round = self._own_before_round, None
        drift = self._parameter_drift(own) if own is not None else None
        if drift:  # 0: the round failed and left the tensors as they were (or nothing had moved: nothing new)
            self.last_parameter_drift = drift

    def _parameter_drift(self, own: Optional[list] = None) -> Optional[float]:
        import torch

        try:
            count = len(self.main_parameters)
            with self.get_tensors() as averaged_tensors:
                averaged = [tensor.detach().float() for tensor in list(averaged_tensors)[:count]]
                if own is None and self.delta_rule_averaging and self._old_tensors is not None:
                    own = list(self._old_tensors)[:count]  # what this peer sent: its parameters have moved since
                elif own is None:
                    own = list(self._local_tensors())[:count]
                own = [tensor.detach().to("cpu", torch.float32) for tensor in own]
                distance = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(torch._foreach_sub(own, averaged))))
                size = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(averaged)))
            return float(distance / size) if size > 0 else None
        except Exception as e:  # noqa: BLE001 - a measurement must never break the averaging it watches
            logger.debug("Could not measure the parameter drift: %r", e)
            return None

    def _apply_optimizer_parameters_(self):
        super()._apply_optimizer_parameters_()
        self.parameters_version += 1

    # This peer's weight in its state rounds; None: hivemind's (1). Catching up sets CATCHING_UP_WEIGHT.
    round_weight: Optional[float] = None

    def _do(self, wait_for_trigger, optimizer_step, zero_grad, averaging_round, averaging_control, *args, **kwargs):
        if averaging_round and self.round_weight is not None:
            if averaging_control is not None and not (averaging_control.triggered or averaging_control.done()):
                averaging_control.weight = self.round_weight  # pre-scheduled (upstream refuses a weight there)
            else:
                kwargs["weight"] = self.round_weight  # the round upstream's _do matchmakes itself
        in_place = averaging_round and self.reuse_tensors
        self._copy_before_round = in_place
        try:
            return super()._do(
                wait_for_trigger, optimizer_step, zero_grad, averaging_round, averaging_control, *args, **kwargs
            )
        finally:
            self._copy_before_round = False
            if in_place:
                self._measure_drift_of_round_in_place()
            if optimizer_step and not self.offload_optimizer:
                self.parameters_version += 1  # stepped the model's parameters themselves (awaited by step())

    def applied_a_round_with_others_since(self, rounds_with_others: int) -> bool:
        """Whether a state round with others succeeded since the count was `rounds_with_others`, and its result is
        in the parameters: its background update is over, and step() has taken what it left (the flag it set)."""
        return (
            self.rounds_with_others > rounds_with_others
            and all(update.done() for update in self.pending_updates)
            and not self.finished_averaging_round.is_set()
        )
