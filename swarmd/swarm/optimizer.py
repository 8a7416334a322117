"""hivemind.Optimizer, made observable and bounded for a long-running daemon.

`SwarmOptimizer` is hivemind.Optimizer (pinned at 1.1.12) with these changes, each overriding one method:
- every gradient and state averaging round is recorded (outcome, group size, duration) in an AveragingLog,
  since hivemind only logs them;
- an averaged gradient that is NaN/Inf or implausibly large against this peer's own gradient is rejected and
  the step uses the local gradient: hivemind's all-reduce is a plain weighted mean of whatever peers send, so
  one broken or hostile peer would otherwise steer everyone (see docs/FAULTS.md);
- `load_state_from_peers` gives up after N attempts instead of retrying forever (upstream l.693-703);
- with `catch_up_by_averaging`, a peer whose download ended with the swarm further on than one epoch does not
  download again (on a slow link the next one would end behind too) but takes the swarm's epoch and catches up by
  averaging: it weighs next to nothing in the averages until the next state averaging gives it the swarm's
  parameters;
- averaging is not pre-scheduled while the peer is alone: upstream matchmakes for partners that do not exist
  and burns about one CPU core doing so (see docs/PERFORMANCE.md);
- successful state downloads from peers are counted;
- after a download that the swarm outran, the peer takes the swarm's parameters again without the optimizer's
  statistics (a third of the bytes) instead of downloading the whole state again (swarm/parameter_refresh.py);
- when a state average is applied, how far this peer's parameters were from it is measured (the drift);
- progress is published to the DHT every quarter of the time left to the epoch's end (0.5-10 s) instead of
  after every step (swarm/progress.py); every averager paces its DHT requests (swarm/averager_pace.py).
`build_sync_optimizer` maps the `swarm:` config section onto its arguments (swarm/strategy.py dispatches).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Optional

from hivemind.averaging.control import StepControl
from hivemind.optim import Optimizer
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager

from swarmd.swarm import averager_keys
from swarmd.swarm.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.averaging_log import AveragingLog, RoundTimeline
from swarmd.swarm.compression import make_compression
from swarmd.swarm.parameter_refresh import ServesParameters
from swarmd.swarm.partial_rounds import missing_share, what_did_not_arrive
from swarmd.swarm.robust_aggregation import Aggregation
from swarmd.swarm.state_stream import shared_copy
from swarmd.swarm.upstream_names import UpstreamRpcNames
from swarmd.swarm.progress import ThrottledProgressTracker

__all__ = ["SwarmOptimizer", "StateLoadFailed", "StateRefused", "build_sync_optimizer", "implausible_average"]

logger = logging.getLogger(__name__)

# A peer catching up by averaging weighs this much in the state round: it takes the swarm's state, not its older one
# (not 0: a group of such peers alone would divide by a zero total weight)
CATCHING_UP_WEIGHT = 1e-6

# After a state download that ended behind, this many parameter refreshes (swarm/parameter_refresh.py) before the
# next whole download: where even the parameters alone take longer than the swarm's epoch, refreshing cannot end
# the chase, and a whole download at least brings the optimizer's statistics up to date.
MAX_REFRESHES_PER_DOWNLOAD = 3


class StateLoadFailed(RuntimeError):
    """Downloading the swarm's state failed `load_state_attempts` times in a row."""


class StateRefused(StateLoadFailed):
    """Every peer that offers its state refused to send it (not retried: the next attempt would be refused too)."""


class _RecordsRounds(AdmitsAllowedPeers):
    """Sits between TrainingStateAverager and DecentralizedAverager in the MRO, where every round starts (above the
    gate that refuses callers outside a private swarm's list, swarm/averager_gate.py)."""

    _averaging_log: AveragingLog
    _epoch_of_round: Callable[[], int]
    _on_state_loaded: Callable[[], None]
    rounds_with_others = 0  # state rounds that succeeded in a group of two or more
    # A gradient or state round came back in part (swarm/partial_rounds.py): the group's members hold different
    # models. SwarmOptimizer then averages state at the next epoch's end, whatever average_state_every says.
    resync_requested = False

    def step(self, *args, **kwargs):
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

    def load_state_from_peers(self, *args, **kwargs):
        loaded = super().load_state_from_peers(*args, **kwargs)
        if loaded is not None:
            self._on_state_loaded()
        return loaded


class _ObservedStateAverager(UpstreamRpcNames, ServesParameters, TrainingStateAverager, _RecordsRounds):
    _upstream = TrainingStateAverager

    def __init__(self, *, averaging_log: AveragingLog, on_state_loaded: Callable[[], None], **kwargs):
        self._averaging_log = averaging_log
        self._on_state_loaded = on_state_loaded
        self._epoch_of_round = lambda: self.local_epoch
        super().__init__(**kwargs)

    def get_current_state(self):
        """Upstream's state for a peer that downloads it, as copies. Upstream hands out the live host tensors (`.cpu()`
        of a CPU tensor is itself), and its host thread sends them to the averager process through a pipe, whose
        pickler (torch.multiprocessing's) moves each storage into shared memory in place: the old memory is freed
        under the training thread that is stepping or reading it, and the serving peer dies of a SIGSEGV
        (docs/PERFORMANCE.md section 5). A copy costs one more pass over the state per download served; made in
        shared memory, it is the only one (the pipe then passes it by handle)."""
        metadata, tensors, infos = super().get_current_state()
        return metadata, [shared_copy(tensor) for tensor in tensors], infos

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


class _AdmittingGradientAverager(UpstreamRpcNames, GradientAverager, AdmitsAllowedPeers):
    """hivemind's gradient averager behind the private swarm's gate (swarm/averager_gate.py), with a weight of its
    own while this peer catches up by averaging (upstream weighs a round by the samples accumulated)."""

    _upstream = GradientAverager
    round_weight: Optional[float] = None  # None: the samples accumulated, as upstream; catching up: CATCHING_UP_WEIGHT

    def __init__(self, *args, **kwargs):
        # every peer's gradient round is triggered by the same event (the swarm's epoch end), so a leader whose round
        # is due need not wait for the stale scheduled time (swarm/averager_pace.py)
        kwargs.setdefault("assemble_when_triggered", True)
        # its gradient buffers are nothing a joiner can use (see SwarmOptimizer._download_state_bounded): not
        # offered for download, which also spares the DHT its "download my state" declarations
        kwargs.setdefault("allow_state_sharing", False)
        super().__init__(*args, **kwargs)

    def step(self, weight: Optional[float] = None, *args, **kwargs):
        return super().step(self.round_weight if weight is None else weight, *args, **kwargs)


class _GradientAveragerKeepingOwn(_AdmittingGradientAverager):
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


def implausible_average(own: list, averaged: list, norm_ratio: float) -> str:
    """Why an average of peers' tensors cannot be trusted against this peer's own contribution, or "" if it can.

    An honest average is a weighted mean of similar tensors, so its norm is at most the largest of them: far above
    this peer's own norm means someone sent garbage (or a reducer returned it). `norm_ratio` 0 checks finiteness only.
    """
    import torch

    own_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(own))))
    average_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(averaged))))
    if average_norm != average_norm or average_norm == float("inf"):
        return "the average is not finite"
    if norm_ratio > 0 and own_norm > 0 and average_norm > norm_ratio * own_norm:
        return f"its norm {average_norm:.3g} is {average_norm / own_norm:.3g}x this peer's {own_norm:.3g}"
    return ""


class SwarmOptimizer(Optimizer):
    # True while the peer holds the swarm's epoch ahead of its state (catching up by averaging, below and in
    # diloco.py): the worker then neither evaluates nor checkpoints under that epoch, and nobody downloads it.
    catching_up = False
    # True from a download or refresh that left this sync peer's state short of the swarm's exact one (its
    # parameters a step stale: upstream's "one epoch behind is close enough"; or the swarm's parameters with the
    # older optimizer statistics of a refresh) until a state round with others has averaged it: its parameters
    # drift from the swarm's with every step (5 % of their norm by the next state round in
    # tests/swarm/test_sync_catch_up.py, 16-17 % for a 20M-parameter joiner: docs/PERFORMANCE.md section 5), and
    # that round would pull the swarm's toward them by its share. Meanwhile it weighs next to nothing in state
    # rounds. Its gradients keep their weight (taken at the swarm's parameters, or a step from them, as upstream
    # allows), and it still serves downloads: refusing could leave a newcomer nobody to download from.
    inexact_state = False

    def __init__(
        self,
        *,
        averaging_log: AveragingLog,
        load_state_attempts: int = 3,
        refresh_parameters: bool = True,
        state_stream: bool = True,
        catch_up_by_averaging: bool = False,
        prescheduled_averaging: bool = True,
        guard_gradient_norm_ratio: float = 0.0,
        clip_local_grad_norm: Optional[float] = None,
        **kwargs,
    ):
        self.clip_local_grad_norm = clip_local_grad_norm
        # set before super().__init__: it builds the averagers, which use these
        self.averaging_log = averaging_log
        self.load_state_attempts = load_state_attempts
        self.refresh_parameters = refresh_parameters
        self.state_stream = state_stream
        self.catch_up_by_averaging = catch_up_by_averaging
        self.prescheduled_averaging = prescheduled_averaging
        self.guard_gradient_norm_ratio = guard_gradient_norm_ratio
        # upstream documents averager_opts as "forwarded to both" averagers but gives them to the state averager
        # only; the gradient averager then keeps request_timeout=3 s, above a short matchmaking_time (deadlock risk)
        self._grad_averager_opts = dict(kwargs.get("averager_opts") or {})
        if not kwargs.get("use_local_updates"):
            # gated in a private swarm, and keeping this peer's own contribution: what the guard judges the average
            # against, and what a failed or partial round falls back to (_step_on_own_contribution)
            kwargs.setdefault("grad_averager_factory", _GradientAveragerKeepingOwn)
        self.state_loads_total = 0
        self.last_state_load_time: Optional[float] = None
        self._downloads_since_global_step = 0
        self.parameter_refreshes_total = 0
        self._refreshes_since_download = 0
        self._rounds_with_others_at_catch_up = 0
        self._rounds_with_others_at_inexact_state = 0
        with self._shutting_down_on_failure():
            super().__init__(**kwargs)

    # --- construction that fails part-way ----------------------------------------------------------------------

    # What construction starts (threads, averager processes), in the order it shuts them down; subclasses add theirs.
    _running_parts: tuple[str, ...] = ("tracker", "grad_averager", "state_averager")

    @property
    def outliers_clipped_total(self) -> int:
        """Senders that this peer's averagers clipped as outliers, one per sender and round (robust_aggregation)."""
        counters = (getattr(getattr(self, part, None), "outliers_clipped", None) for part in self._running_parts)
        return sum(counter.value for counter in counters if counter is not None)

    @contextlib.contextmanager
    def _shutting_down_on_failure(self):
        """A construction that raises (a DHT that does not answer, an averager that does not start) shuts down the
        parts it started: an averager's process and the tracker's thread would otherwise outlive the error."""
        try:
            yield
        except BaseException:
            for name in self._running_parts:
                part = self.__dict__.get(name)
                if part is None or not part.is_alive():
                    continue
                try:
                    part.shutdown()
                except Exception as e:  # the construction's error is the one to report
                    logger.warning("Could not shut down %s of a failed construction: %r", name, e)
            raise

    def __del__(self):
        # Upstream's __del__ reads the averagers, which a failed construction may not have made; its AttributeError
        # would surface from the garbage collector as an "unraisable" exception. Python 3.11 formats those with
        # ast.parse, and when the collection runs inside another ast.parse (pytest formatting a failure) both fail
        # with SystemError "AST constructor recursion depth mismatch" (CPython gh-106905): a CI run ended so.
        if all(name in self.__dict__ for name in self._running_parts):
            super().__del__()

    def step(self, closure=None, batch_size=None, grad_scaler=None):
        # a scaled, accumulating .grad (grad_scaler) is refused by the config: clipping it would clip a partial sum
        if grad_scaler is None:
            self._clip_local_gradients()
        loss = super().step(closure=closure, batch_size=batch_size, grad_scaler=grad_scaler)
        if self.catching_up:
            self._maybe_end_catch_up()
        if self.inexact_state:
            self._maybe_end_inexact_state()
        return loss

    def _clip_local_gradients(self) -> None:
        """`swarm.clip_local_grad_norm`: each local step's own (unscaled) gradient is clipped before it is used
        (accumulated into the swarm's average; under DiLoCo, the inner step), as hivemind's ALBERT example does
        through HF Trainer's max_grad_norm."""
        if not self.clip_local_grad_norm or self.auxiliary:
            return
        import torch

        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if params:
            torch.nn.utils.clip_grad_norm_(params, self.clip_local_grad_norm)

    # --- observation ---------------------------------------------------------------------------------------

    _state_averager_type: type = _ObservedStateAverager  # subclasses may give a subclass of it
    _state_averager_suffix = averager_keys.STATE  # upstream's prefix: run_id + this

    def averager_settings(self, suffix: str) -> dict:
        """What every averager of this optimizer starts with (as upstream's): its DHT, the run's prefix with
        `suffix`, the timeouts and the client mode."""
        return dict(
            dht=self.dht,
            prefix=averager_keys.averager_prefix(self.run_id, suffix),
            min_matchmaking_time=self.matchmaking_time,
            allreduce_timeout=self.allreduce_timeout,
            next_chunk_timeout=self.next_chunk_timeout,
            shutdown_timeout=self.shutdown_timeout,
            client_mode=self.client_mode,
            start=True,
        )

    def _make_state_averager(self, **kwargs) -> TrainingStateAverager:
        # Same arguments as upstream's, with the recording subclass.
        return self._state_averager_type(
            averaging_log=self.averaging_log,
            on_state_loaded=self._count_state_load,
            download_by_stream=self.state_stream,
            offload_optimizer=self.offload_optimizer,
            custom_gradients=self.offload_optimizer,
            status_loglevel=self.status_loglevel,
            auxiliary=self.auxiliary,
            **self.averager_settings(self._state_averager_suffix),
            **kwargs,
        )

    _progress_tracker_type: type = ThrottledProgressTracker  # subclasses may give a subclass of it

    def _make_progress_tracker(self, target_batch_size: int, **kwargs) -> ThrottledProgressTracker:
        return self._progress_tracker_type(
            dht=self.dht,
            prefix=self.run_id,
            target_batch_size=target_batch_size,
            client_mode=self.client_mode,
            status_loglevel=self.status_loglevel,
            start=True,
            **kwargs,
        )

    def _make_gradient_averager(self, factory, **kwargs):
        return super()._make_gradient_averager(factory, **{**self._grad_averager_opts, **kwargs})

    @property
    def parameters_version(self) -> tuple[int, int]:
        """Changes whenever hivemind may have written the model's parameters (a step, averaged state, a state
        download); what rank 0 passes to StepSync.lead so the other ranks follow (swarmd.ranks)."""
        return (self.state_averager.parameters_version, self.state_loads_total)

    def _count_state_load(self) -> None:
        self.state_loads_total += 1
        self._downloads_since_global_step += 1
        self._refreshes_since_download = 0
        self.last_state_load_time = time.time()
        logger.info("Downloaded the swarm's state from a peer (download #%d)", self.state_loads_total)

    def _begin_averaging_gradients(self, grad_scaler) -> bool:
        began = super()._begin_averaging_gradients(grad_scaler)
        if not began:  # alone in the swarm (or the round could not start): the step uses local gradients
            self.averaging_log.record("gradients", "skipped", group_size=1, duration=0.0, epoch=self.local_epoch)
            self.grad_averager.load_accumulators_into_averager_()  # what upstream does next (idempotent)...
            self._measure_grad_norm()  # ...so that the norm is that of this epoch's local gradient
        return began

    def _average_gradients_and_load_into_optimizer(self, maybe_step_control: Optional[StepControl]):
        # Upstream's logic, keeping the outcome that upstream only logs.
        if maybe_step_control is None:
            self.averaging_log.record("gradients", "skipped", group_size=1, duration=0.0, epoch=self.local_epoch)
            self._load_local_gradients_into_optimizer()
            return
        started = time.perf_counter()
        try:
            group_info = maybe_step_control.result(self.averaging_timeout)
            missing = missing_share(group_info)
            if missing:
                self._use_own_gradients_after_partial_round(
                    missing, time.perf_counter() - started, RoundTimeline.of(maybe_step_control)
                )
                return
            implausible = self._implausible_average()
            if implausible:
                self._replace_average_with_own_gradients()
            self._load_averaged_gradients_into_optimizer_()
        except BaseException as e:
            logger.warning("Averaging gradients failed (%r); this epoch uses local gradients", e)
            self.averaging_log.record(
                "gradients", "failed", group_size=1, duration=time.perf_counter() - started,
                epoch=self.local_epoch, error=repr(e), timeline=RoundTimeline.of(maybe_step_control),
            )
            self._step_on_own_contribution()
            return
        if implausible:
            logger.warning("Rejected the averaged gradients (%s); this epoch uses local gradients", implausible)
        self.averaging_log.record(
            "gradients", "rejected" if implausible else "success", group_size=len(group_info),
            duration=time.perf_counter() - started, epoch=self.local_epoch, error=implausible,
            timeline=RoundTimeline.of(maybe_step_control),
        )

    def _use_own_gradients_after_partial_round(
        self, missing: float, duration: float, timeline: Optional[RoundTimeline] = None
    ) -> None:
        """Part of the average did not arrive: the buffers hold the average where it came and this peer's own
        gradient elsewhere, a mix no other peer has. Step on the own gradient, as after a failed round, and have
        the group average its state at this epoch's end (resync_requested), so that its members hold one model
        again instead of drifting apart until the next scheduled state round."""
        logger.warning(
            "Averaging gradients returned %.1f%% of the average (a reducer failed or was late, or its average was "
            "refused as implausible); this epoch uses local gradients and the group averages its parameters at the "
            "epoch's end", 100 * (1 - missing),
        )
        self.averaging_log.record(
            "gradients", "partial", group_size=1, duration=duration, epoch=self.local_epoch,
            error=what_did_not_arrive(missing), timeline=timeline,
        )
        self.state_averager.resync_requested = True
        self._step_on_own_contribution()

    def _step_on_own_contribution(self) -> None:
        """After a round that began and failed (or came back in part): the gradient this peer contributed to it, kept
        when the round began. Upstream's fallback (_load_local_gradients_into_optimizer) reloads the accumulators,
        which the round's start has already reset (GradientAverager.step): it would step on zeros."""
        if getattr(self.grad_averager, "own_gradients", None) is None:
            self._load_local_gradients_into_optimizer()  # not a swarmd gradient averager: upstream's way
            return
        self._replace_average_with_own_gradients()
        self._load_averaged_gradients_into_optimizer_()

    def _implausible_average(self) -> str:
        """Why the averaged gradient cannot be trusted, or "" if it can.

        An honest average is a weighted mean of similar gradients, so its norm is at most the largest of them:
        far above this peer's own norm means someone sent garbage (or a reducer returned it).
        """
        own = getattr(self.grad_averager, "own_gradients", None)
        if self.guard_gradient_norm_ratio <= 0 or own is None or self.auxiliary:
            return ""
        with self.grad_averager.get_tensors() as averaged:
            return implausible_average(own, list(averaged), self.guard_gradient_norm_ratio)

    last_grad_norm: Optional[float] = None  # of the gradient the last global step used (averaged, or local)

    def _load_averaged_gradients_into_optimizer_(self):
        super()._load_averaged_gradients_into_optimizer_()  # a failed round's local fallback goes through here too
        self._measure_grad_norm()

    def _measure_grad_norm(self) -> None:
        """The norm of the gradient in the averager's buffers: the one this epoch's optimizer step uses."""
        import torch

        with torch.no_grad(), self.grad_averager.get_tensors() as gradients:
            norms = torch._foreach_norm(list(gradients))
            self.last_grad_norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else None

    def _replace_average_with_own_gradients(self) -> None:
        with self.grad_averager.get_tensors() as averaged:
            for target, own in zip(averaged, self.grad_averager.own_gradients):
                target.copy_(own)

    # --- no matchmaking with nobody ----------------------------------------------------------------------

    def _alone(self) -> bool:
        return self.tracker.global_progress.num_peers <= 1

    def _maybe_schedule_gradient_averaging(self) -> None:
        if self.prescheduled_averaging and not self._alone():
            super()._maybe_schedule_gradient_averaging()
        elif self.scheduled_grads is not None and (self.scheduled_grads.triggered or self.scheduled_grads.done()):
            # Only upstream's scheduling replaces a finished round; left in place, it makes the next global step
            # skip averaging ("Not using pre-scheduled group"), i.e. every other step without pre-scheduling.
            self.scheduled_grads = None

    def _maybe_schedule_state_averaging(self) -> None:
        if not self._alone():
            super()._maybe_schedule_state_averaging()

    def _update_global_epoch(self, grad_scaler) -> None:
        super()._update_global_epoch(grad_scaler)
        self._downloads_since_global_step = 0

    # hivemind reads average_state_every where it decides whether an epoch's end averages state (and pre-schedules
    # that round): after a partial round, the next epoch's end does, so that the group holds one model again
    @property
    def average_state_every(self) -> int:
        averager = self.__dict__.get("state_averager")
        return 1 if averager is not None and averager.resync_requested else self._average_state_every

    @average_state_every.setter
    def average_state_every(self, every: int) -> None:
        self._average_state_every = every

    # --- bounded state download, or catching up by averaging ----------------------------------------------

    def load_state_from_peers(self, **kwargs):
        """Upstream's load_state_from_peers with a bounded number of attempts (raises StateLoadFailed); or, when
        the last download already ended behind the swarm, catching up by averaging instead."""
        if self.scheduled_grads is not None and not self.scheduled_grads.done():
            self._tag_along_with_zero_weight(self.scheduled_grads)
            self.scheduled_grads = None
        self.state_averager.step(wait_for_delayed_updates=True)

        with self.tracker.pause_updates():
            if self._should_catch_up_by_averaging():
                self._catch_up_by_averaging()
            else:
                refreshed = self._download_parameters_again()
                if not refreshed:
                    self._download_state_bounded(**kwargs)
                self.catching_up = False  # the swarm's own state (its weights and sharing: just below)
                one_behind = self.tracker.global_epoch - 1 <= self.local_epoch < self.tracker.global_epoch
                if one_behind:
                    # upstream's rule: one epoch behind is close enough (a gradient one step stale)
                    logger.info("Catching up with the swarm at epoch %d", self.tracker.global_epoch)
                    self.state_averager.local_epoch = self.tracker.global_epoch
                self._set_inexact_state(refreshed or one_behind)
            self._start_epoch_afresh()

    def _download_parameters_again(self) -> bool:
        """A download since the last global step already ended behind the swarm (its epochs are shorter than a
        download): take the swarm's parameters again without the optimizer statistics, a third of the bytes
        (swarm/parameter_refresh.py). False where that does not apply or no peer sent them: download the state."""
        if not (
            self.refresh_parameters
            and self._downloads_since_global_step >= 1
            and self._refreshes_since_download < MAX_REFRESHES_PER_DOWNLOAD
            and not self.auxiliary
        ):
            return False
        self._refreshes_since_download += 1
        started = time.monotonic()
        try:
            refreshed = self.state_averager.load_parameters_from_peers(timeout=self.load_state_timeout)
        except Exception as e:  # noqa: BLE001 - a timeout or a broken peer: the whole download is the way left
            logger.warning("Could not take the swarm's parameters again (%r); downloading its whole state", e)
            return False
        if not refreshed:
            logger.info("No peer sent its parameters alone (plain hivemind peers do not); downloading the whole state")
            return False
        self.parameter_refreshes_total += 1
        self.state_loads_total += 1  # a load from peers all the same: e.g. the worker's parameter guard lets it pass
        logger.info(
            "The swarm outran the state download: took its parameters again, of epoch %d, in %.1f s "
            "(refresh #%d; the optimizer statistics stay those of the download)",
            self.local_epoch, time.monotonic() - started, self.parameter_refreshes_total,
        )
        return True

    def _start_epoch_afresh(self) -> None:
        """After a download or a catch-up: nothing accumulated yet at the (new) epoch, served under it."""
        self.tracker.report_local_progress(local_epoch=self.local_epoch, samples_accumulated=0)
        if not self.client_mode:
            self.state_averager.state_sharing_priority = self.local_epoch
        if self.use_gradient_averaging:
            self.grad_averager.reset_accumulated_grads_()
            if not self.client_mode:
                self.grad_averager.state_sharing_priority = self.local_epoch

    def _should_catch_up_by_averaging(self) -> bool:
        """A download since the last global step already ended more than an epoch behind: the swarm's epochs are
        shorter than a download (docs/PERFORMANCE.md section 5), so another would end behind too. Only where the
        state averaging that repairs it comes with gradient averaging (with local updates, downloads stay)."""
        return (
            self.catch_up_by_averaging
            # a peer that is catching up stays so: its state is not the swarm's, a download would end behind as well
            and (self._downloads_since_global_step >= 1 or self.catching_up)
            and self.local_epoch < self.tracker.global_epoch  # others are ahead: there is a swarm to average with
            and self.use_gradient_averaging
            and not self.auxiliary
        )

    def _catch_up_by_averaging(self) -> None:
        """Take the swarm's epoch with this peer's older state, and train on: nobody downloads from it, it weighs
        next to nothing in the gradient rounds, and in the next state averaging (every average_state_every epochs),
        which gives it the swarm's parameters and statistics."""
        epoch = self.tracker.global_epoch
        logger.warning(
            "The swarm moved on during the state download (this peer's state is of epoch %d): joining the swarm's "
            "epoch %d and taking its parameters by averaging in the next state round (every %d epochs) instead of "
            "downloading again", self.local_epoch, epoch, self.average_state_every,
        )
        self._set_catching_up(True)  # before its epoch changes: nobody may download its old state under the new one
        self._rounds_with_others_at_catch_up = self.state_averager.rounds_with_others
        self.state_averager.local_epoch = epoch
        self.state_averager._update_scheduler()

    def _maybe_end_catch_up(self) -> None:
        if self.state_averager.applied_a_round_with_others_since(self._rounds_with_others_at_catch_up):
            logger.info("Took the swarm's parameters by averaging: caught up at epoch %d", self.local_epoch)
            self._set_catching_up(False)
        elif self.tracker.other_peers == 0:
            logger.info("The swarm is this peer alone now: its state is the swarm's (epoch %d)", self.local_epoch)
            self._set_catching_up(False)

    def _set_catching_up(self, catching_up: bool) -> None:
        """While catching up, this peer's state is older than its epoch says: nobody may download it, and it
        weighs next to nothing in the averages: its gradients, taken at those older parameters, would pull the
        swarm back (measured: docs/PERFORMANCE.md section 5), and its state would too."""
        self.catching_up = catching_up
        self._apply_round_weights()

    def _set_inexact_state(self, inexact: bool) -> None:
        if inexact and not self.inexact_state:
            self._rounds_with_others_at_inexact_state = self.state_averager.rounds_with_others
        self.inexact_state = inexact
        self._apply_round_weights()

    def _maybe_end_inexact_state(self) -> None:
        if self.state_averager.applied_a_round_with_others_since(self._rounds_with_others_at_inexact_state):
            logger.info("A state round evened this peer's parameters out with the swarm's (epoch %d)", self.local_epoch)
            self._set_inexact_state(False)
        elif self.tracker.other_peers == 0:
            self._set_inexact_state(False)  # alone: its state is the swarm's

    def _apply_round_weights(self) -> None:
        """This peer's weights in the rounds and whether it serves downloads, from catching_up and inexact_state."""
        inexact = self.catching_up or self.inexact_state
        self.state_averager.round_weight = CATCHING_UP_WEIGHT if inexact else None
        if isinstance(self.grad_averager, _AdmittingGradientAverager):
            self.grad_averager.round_weight = CATCHING_UP_WEIGHT if self.catching_up else None
        if not self.client_mode:
            self.state_averager.allow_state_sharing = not self.catching_up

    def _download_state_bounded(self, **kwargs) -> None:
        """The averagers' downloads, `load_state_attempts` tries; raises StateLoadFailed (StateRefused when every
        peer that offers its state refused it)."""
        for attempt in range(1, self.load_state_attempts + 1):
            loads, refusals = self.state_loads_total, self.state_averager.download_refusals.value
            try:
                # Upstream then downloads the gradient averager's "state" too (its gradient buffers: the
                # parameters' size again), which DecentralizedAverager.load_state_from_peers only returns, and
                # nobody applies (the accumulators are reset right after): not asked for here, nor served
                # (_AdmittingGradientAverager).
                self.state_averager.load_state_from_peers(timeout=self.load_state_timeout, **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                logger.warning(
                    "Downloading state from peers failed (attempt %d/%d): %r", attempt, self.load_state_attempts, e
                )
                continue
            refused = self.state_averager.download_refusals.value - refusals
            if self.state_loads_total == loads and refused:
                raise StateRefused(
                    f"every peer that offers the swarm's state refused to send it ({refused} peer(s)): in a private "
                    f"swarm this peer ({self.dht.peer_id}) must be on network.allowed_peers; ask the run's operator "
                    "to add it"
                )
            return
        raise StateLoadFailed(f"could not download the swarm's state in {self.load_state_attempts} attempts")


def shared_optimizer_options(*, dht, config, model, task, averaging_log: AveragingLog) -> dict:
    """What every strategy passes to its hivemind-based optimizer alike: the swarm, its timeouts, wire formats,
    guards and the model's tensors (build_sync_optimizer and diloco.build_diloco_optimizer add their own)."""
    swarm = config.swarm
    averager_opts = dict(swarm.averager_opts)
    # hivemind warns (and risks matchmaking deadlocks) when an RPC may outlast the matchmaking window
    averager_opts.setdefault("request_timeout", min(3.0, swarm.matchmaking_time / 2))
    # every averager (state, gradients, DiLoCo's outer) reduces its share this way (swarm/robust_aggregation.py)
    averager_opts.setdefault("aggregation", Aggregation(**swarm.aggregation.model_dump()))
    return dict(
        averaging_log=averaging_log,
        load_state_attempts=swarm.load_state_attempts,
        guard_gradient_norm_ratio=swarm.guard_gradient_norm_ratio,
        dht=dht,
        run_id=config.run_id,
        params=task.parameter_groups(model),
        matchmaking_time=swarm.matchmaking_time,
        averaging_timeout=swarm.averaging_timeout,
        allreduce_timeout=swarm.allreduce_timeout,
        next_chunk_timeout=swarm.next_chunk_timeout,  # None: hivemind's matchmaking_time
        load_state_timeout=swarm.load_state_timeout,
        # hivemind 1.1.12 inverts this flag (optimizer.py l.205): only the DHT's own value is used correctly.
        client_mode=dht.client_mode,
        grad_compression=make_compression(swarm.grad_compression, "swarm.grad_compression"),
        state_averaging_compression=make_compression(
            swarm.state_averaging_compression, "swarm.state_averaging_compression"
        ),
        load_state_compression=make_compression(swarm.load_state_compression, "swarm.load_state_compression"),
        state_stream=swarm.state_stream,
        extra_tensors=tuple(task.extra_tensors(model)),
        averager_opts=averager_opts,
        tracker_opts=dict(swarm.tracker_opts),
        verbose=False,
    )


def build_sync_optimizer(*, dht, config, model, task, averaging_log: AveragingLog) -> SwarmOptimizer:
    """`swarm.strategy: sync`: hivemind.Optimizer from the config and task (swarm/strategy.py picks the strategy)."""
    swarm = config.swarm
    return SwarmOptimizer(
        **shared_optimizer_options(dht=dht, config=config, model=model, task=task, averaging_log=averaging_log),
        refresh_parameters=swarm.refresh_parameters,
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
