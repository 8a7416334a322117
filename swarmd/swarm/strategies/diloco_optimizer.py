"""swarm.strategy: diloco. H local steps of the task's optimizer, then one outer step on the swarm's average.

DiLoCo (Douillard et al. 2023), after OpenDiLoCo's `open_diloco/hivemind_diloco.py`, as a drop-in for the worker
(the SwarmStrategy protocol, swarm/strategies/protocol.py). It is not a hivemind.Optimizer: it composes the parts
every strategy's optimizer is made of (swarm/upstream/peer_parts.py: the progress tracker, the state averager, the
bounded state downloads, the clipping) with its own pseudo-gradient averager. One global epoch is one outer step:

- every `step()` is one INNER step: the task's optimizer on the model's own parameters (on their device), and the
  task's LR schedule stepped once; the schedule counts inner steps (`epoch x H + steps into the round`), also for a
  peer that joins late or restarts from a checkpoint;
- after H inner steps: the pseudo-gradient (outer parameters minus local ones, fp32 on the host) is averaged
  through its own hivemind averager, weighted by the samples each peer contributed, with swarm.grad_compression;
  the outer SGD (Nesterov, on the host copies that hivemind's state averager keeps) steps on it, and the result
  is copied into the model;
- the round is triggered by this peer's own H steps, not by hivemind's target_batch_size: the progress tracker
  only says the epoch, who is in the swarm, and when the slowest peer will be done (the straggler wait); as
  hivemind does for a synchronous gradient round, matchmaking begins during the round's last inner steps, once the
  slowest peer is within matchmaking_time of its H-th, and the all-reduce waits for this peer's H-th step
  (`swarm.prescheduled_averaging`);
- with `overlap_steps` tau (Streaming DiLoCo's overlap, as torchft's fragment_sync_delay) the pseudo-gradient is
  sent at inner step H - tau and the round runs while the last tau inner steps do; the outer step still lands at
  the H-th, and the model then keeps `overlap_mixing` of its own parameters (torchft's fragment_update_alpha);
- a round that fails or times out, or a peer that is alone, steps on its OWN pseudo-gradient (AveragingLog
  ("outer", "local")), and so does a round whose average came back in part ("outer", "partial"); an average that is non-finite, implausibly large against this peer's own, or mixed with a
  peer of another outer step is rejected ("outer", "rejected") and the own pseudo-gradient used instead;
- a peer that finds the swarm already past the round it just finished downloads the swarm's state (outer
  parameters, outer momentum, inner optimizer state, and how far the swarm is into the round) instead; one that
  finds the swarm moved on during two downloads in a row (a link too slow for the state: it would chase the swarm
  forever) joins the swarm's current round instead, with nothing to contribute, and takes the swarm's outer state
  from that round's state averaging, where its own weighs next to nothing;
- parameters (with the outer momentum) are averaged only: at the first outer step when the members' outer states
  are not byte for byte the same (peers started from different seeds become equal); at the first outer step with
  company after one on this peer's own pseudo-gradient (peers that were alone or failed a round together become
  equal again); and every `diloco.average_state_every` outer steps when asked.
docs/DILOCO.md says more, and what differs from OpenDiLoCo.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional

import torch
from hivemind.averaging.control import StepControl
from hivemind.compression import NoCompression
from hivemind.utils import get_dht_time

from swarmd.swarm import averager_keys
from swarmd.swarm.averaging_log import AveragingLog, RoundTimeline
from swarmd.swarm.downloaded_statistics import restart_implausible_statistics
from swarmd.swarm.upstream.diloco_state import DiLoCoStateAverager
from swarmd.swarm.upstream.outer_round import (
    OuterAverager,
    RoundProgressTracker,
    SentRound,
    bytes_digest,
    fingerprint_difference,
    gathered_entry,
)
from swarmd.swarm.upstream.partial_rounds import missing_share, what_did_not_arrive
from swarmd.swarm.upstream.peer_parts import (
    CATCHING_UP_WEIGHT,
    AveragerSettings,
    ReadsItsParts,
    StateDownloads,
    clip_local_gradients,
    implausible_average,
    shutting_down_on_failure,
    start_progress_tracker,
    start_state_averager,
)

__all__ = ["DiLoCoOptimizer"]

logger = logging.getLogger(__name__)

_OUTER_KEYS = ("outer_param", "outer_momentum")  # per-parameter entries state_dict() adds to the inner state
_DOWNLOADS_BEFORE_CATCHING_UP = 2  # downloads in a row, each overtaken by the swarm, before averaging instead


def _outer_sgd(lr: float, momentum: float, nesterov: bool) -> Callable:
    """The outer optimizer's factory: SGD on the outer parameters. The task's group options (weight decay, ...)
    belong to the inner optimizer only."""

    def build(groups):
        return torch.optim.SGD(
            [{"params": group["params"]} for group in groups], lr=lr, momentum=momentum, nesterov=nesterov
        )

    return build


class DiLoCoOptimizer(ReadsItsParts):
    state_averager: DiLoCoStateAverager
    tracker: RoundProgressTracker
    grad_averager = None  # no gradient rounds: the outer averager averages pseudo-gradients
    auxiliary = False  # the config refuses auxiliary peers under diloco
    # True while the peer holds the swarm's epoch ahead of its state (_catch_up_by_averaging): the worker then neither
    # evaluates nor checkpoints under that epoch, and nobody downloads it
    catching_up = False
    _said_alone = False  # the last outer step's log said this peer was alone
    _statistics_unchecked = False  # a download's inner statistics, until the next inner step checked them
    # What construction starts (threads, averager processes), in the order it shuts them down
    _RUNNING_PARTS = ("outer_averager", "tracker", "state_averager")

    def __init__(
        self,
        *,
        dht,
        run_id: str,
        params,
        averaging_log: AveragingLog,
        inner_optimizer: Callable,
        inner_scheduler: Optional[Callable],
        batch_size: int,
        inner_steps: int,
        outer_lr: float, outer_momentum: float, nesterov: bool,
        max_straggler_wait: float,
        prescheduled_outer_rounds: bool,
        overlap_steps: int, overlap_mixing: float,
        average_state_every: int,
        grad_compression,
        state_check_tolerance: float,
        guard_gradient_norm_ratio: float = 0.0,
        catch_up_by_averaging: bool = True,
        clip_local_grad_norm: Optional[float] = None,
        load_state_attempts: int = 3, load_state_timeout: float = 600.0, state_stream: bool = True,
        # hivemind.Optimizer's defaults
        matchmaking_time: float = 15.0, averaging_timeout: float = 60.0, allreduce_timeout: Optional[float] = None,
        next_chunk_timeout: Optional[float] = None, shutdown_timeout: float = 5.0, client_mode: Optional[bool] = None,
        averager_opts: Optional[dict] = None,
        tracker_opts: Optional[dict] = None,
        **state_averager_options,  # extra_tensors, state_averaging_compression, load_state_compression, verbose
    ):
        param_groups = [dict(group, params=list(group["params"])) for group in params]
        self.dht, self.run_id, self.averaging_log = dht, run_id, averaging_log
        self.client_mode = dht.client_mode if client_mode is None else client_mode
        self.batch_size_per_step = batch_size
        self.inner_steps = inner_steps
        # Streaming DiLoCo's overlap: the pseudo-gradient goes out at this inner step of the round, the outer step
        # lands at the H-th (the same as H without overlap)
        self.overlap_steps, self.overlap_mixing = overlap_steps, overlap_mixing
        self._send_step = inner_steps - overlap_steps
        self.max_straggler_wait, self.prescheduled_outer_rounds = max_straggler_wait, prescheduled_outer_rounds
        self.diloco_average_state_every, self.state_check_tolerance = average_state_every, state_check_tolerance
        self.pseudo_gradient_guard_ratio = guard_gradient_norm_ratio
        self.catch_up_by_averaging, self.clip_local_grad_norm = catch_up_by_averaging, clip_local_grad_norm
        self.matchmaking_time, self.averaging_timeout = matchmaking_time, averaging_timeout
        self.settings = AveragerSettings(  # None: hivemind.Optimizer's rules
            dht, run_id, matchmaking_time, averaging_timeout if allreduce_timeout is None else allreduce_timeout,
            matchmaking_time if next_chunk_timeout is None else next_chunk_timeout, shutdown_timeout, self.client_mode,
        )
        self.downloads = StateDownloads(attempts=load_state_attempts, timeout=load_state_timeout, dht=dht)
        self._start_round_bookkeeping()
        self._check_exact_epoch = True
        self._parent_pid = os.getpid()
        with shutting_down_on_failure(self, self._RUNNING_PARTS):
            self._start_parts(param_groups, outer_lr, outer_momentum, nesterov, state_stream, dict(averager_opts or {}),
                              dict(tracker_opts or {}), state_averager_options)
            self.inner_optimizer = inner_optimizer(param_groups)
            self.state_averager.attach_inner_optimizer(self.inner_optimizer, inner_scheduler, inner_steps)
            self.outer_averager = OuterAverager.beside(
                self.settings, self._outer_parameters(), grad_compression, **dict(averager_opts or {})
            )

    def _start_parts(self, param_groups, outer_lr, outer_momentum, nesterov, state_stream: bool, averager_opts: dict,
                     tracker_opts: dict, options: dict) -> None:
        """The progress tracker and the state averager, as hivemind.Optimizer starts them for local updates."""
        status_loglevel = logging.INFO if options.pop("verbose", False) else logging.DEBUG
        # the tracker's ETA is the slowest peer's time to its send step: the round's all-reduce starts there
        self.tracker = start_progress_tracker(
            RoundProgressTracker, self.settings, self._send_step * self.batch_size_per_step,
            status_loglevel=status_loglevel, **tracker_opts,
        )
        self.state_averager = start_state_averager(
            DiLoCoStateAverager, self.settings, averager_keys.DILOCO_STATE,  # never a sync peer's of the same run_id
            averaging_log=self.averaging_log, on_state_loaded=self._state_loaded, state_stream=state_stream,
            offload_optimizer=True,  # the outer state lives on the host
            status_loglevel=status_loglevel, auxiliary=False,
            optimizer=_outer_sgd(outer_lr, outer_momentum, nesterov), params=param_groups, scheduler=None,
            delta_rule_averaging=False,
            compression=options.pop("state_averaging_compression", None) or NoCompression(),
            state_compression=options.pop("load_state_compression", None) or NoCompression(),
            # parameter averaging (first step, repairs, average_state_every) averages the outer momentum with them
            average_opt_statistics=("momentum_buffer",) if outer_momentum > 0 else (),
            extra_tensors=options.pop("extra_tensors", ()),
            **averager_opts,
        )
        if options:
            raise TypeError(f"DiLoCoOptimizer got unexpected arguments: {sorted(options)}")

    def _state_loaded(self) -> None:
        self.downloads.count()
        self._statistics_unchecked = True

    def _start_round_bookkeeping(self) -> None:
        """What the outer rounds keep from one inner step to the next, before the first."""
        self._sent_round: Optional[SentRound] = None  # sent at the send step, in flight until the H-th
        # (outer step, control) of the outer round whose matchmaking began before the H-th inner step
        self._scheduled_round: Optional[tuple[int, StepControl]] = None
        self.prescheduled_rounds_total = 0  # outer rounds whose group was being formed when their H-th step came
        self._eta_refreshed_at_epoch: Optional[int] = None
        self._round_samples = 0  # samples this peer contributed to the current round: its averaging weight
        # set when this peer stepped on its own pseudo-gradient: its outer state may now differ from the others'
        self._apart_from_swarm = False
        self._downloads_since_outer_step = 0

    # --- what the worker sees ----------------------------------------------------------------------------------

    @property
    def local_epoch(self) -> int:
        return self.state_averager.local_epoch

    def _behind_swarm(self) -> bool:
        """hivemind.Optimizer's rule: the exact epoch once after each outer step (once the tracker fetched the
        swarm's progress), then one behind is tolerated (the swarm's peers do not end a round at one instant)."""
        if self._check_exact_epoch and self.tracker.fetched_global_progress_this_epoch.is_set():
            self._check_exact_epoch = False
            return self.local_epoch != self.tracker.global_epoch
        return self.local_epoch < self.tracker.global_epoch - 1

    def _set_catching_up(self, catching_up: bool) -> None:
        """While catching up, this peer's state is older than its epoch says: nobody may download it, and it weighs
        next to nothing in its state rounds."""
        self.catching_up = catching_up
        self.state_averager.round_weight = CATCHING_UP_WEIGHT if catching_up else None
        if not self.client_mode:
            self.state_averager.allow_state_sharing = not catching_up

    @property
    def param_groups(self):
        return self.inner_optimizer.param_groups

    @property
    def round_steps(self) -> int:
        return self.state_averager.round_steps

    def step(self, closure=None, batch_size: Optional[int] = None, grad_scaler=None):
        """One inner step on this step's gradients; after the round's H-th, the outer step."""
        if grad_scaler is not None:
            raise ValueError("strategy diloco takes no hivemind.GradScaler: unscale the gradients before step()")
        batch_size = batch_size if batch_size is not None else self.batch_size_per_step
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.client_mode:  # a client offers its state through forwarders (state_forward.py), as the others serve
            self.state_averager.offer_state_as_client(None if self.catching_up else self.local_epoch)
        if self._behind_swarm():
            logger.info("This peer is behind the swarm (epoch %d < %d)", self.local_epoch, self.tracker.global_epoch)
            caught_out = self._downloads_since_outer_step >= _DOWNLOADS_BEFORE_CATCHING_UP
            if caught_out and self.catch_up_by_averaging and not self._alone():
                self._catch_up_by_averaging()
            else:
                self.load_state_from_peers()
            return loss  # these gradients belong to parameters the swarm has moved past
        if self.downloads.came_from_a_suspect(self.state_averager):
            self.load_state_from_peers()  # the outer state came from a peer found lying since: from the others
            return loss

        averager = self.state_averager
        send_due = self._sent_round is None and averager.round_steps >= self._send_step
        if send_due or averager.round_steps >= self.inner_steps:
            # the state came this far into its round (from a peer that had finished its inner steps, a checkpoint,
            # or catching up): that round's send or outer step comes before any inner step
            self._round_point(came_with_state=True)
            return loss
        clip_local_gradients(self.param_groups, self.clip_local_grad_norm)
        with averager.state_lock, averager.lock_optimizer:  # the inner state and round_steps are served together
            if self._statistics_unchecked:  # the donor's alone: checked against this peer's own first gradient
                self._statistics_unchecked = False
                gradients = [param.grad for group in self.param_groups for param in group["params"]]
                restart_implausible_statistics(self.inner_optimizer, gradients)
            self.inner_optimizer.step()
            averager.count_inner_step()
        self._round_samples += batch_size
        self.tracker.report_local_progress(self.local_epoch, averager.round_steps * self.batch_size_per_step)
        if averager.round_steps >= self._send_step:
            self._round_point(came_with_state=False)
        else:
            self._maybe_schedule_outer_round()
        return loss

    def _round_point(self, came_with_state: bool) -> None:
        """At the send step, send this peer's pseudo-gradient to the round (without overlap, the send step is the
        H-th); at the H-th, the outer step on the round's result."""
        if self._sent_round is None:
            self._sent_round = self._send_round(came_with_state)
            if self._sent_round is None:
                return  # it downloaded the swarm's state instead
        if self.round_steps >= self.inner_steps:
            sent, self._sent_round = self._sent_round, None
            self._finish_round(sent)

    # --- the outer round's matchmaking, begun before the round ends --------------------------------------------

    def _maybe_schedule_outer_round(self) -> None:
        """Begin matchmaking for this outer step once the slowest peer of the round is within matchmaking_time of
        its H-th inner step, so that the group is formed when the round ends (a round that began matchmaking only
        after the H-th step idled matchmaking_time every outer step: docs/PERFORMANCE.md section 9). The
        all-reduce waits for the trigger that _average gives once the pseudo-gradient is in the averager."""
        if self._scheduled_round is not None or not self.prescheduled_outer_rounds or self._alone():
            return
        epoch = self.local_epoch
        if self._eta_refreshed_at_epoch != epoch:
            # The swarm's ETA is as old as the tracker's last fetch, which comes when that ETA said the round would
            # end: one fetch early in the round with a low samples/s missed the window (half the rounds, measured
            # on loopback). Fetch afresh once this peer's own round is within matchmaking_time of its end.
            own_left = (self._send_step - self.round_steps) * self.batch_size_per_step
            if own_left / max(self.tracker.performance_ema.samples_per_second, 1e-9) <= self.matchmaking_time:
                self._eta_refreshed_at_epoch = epoch
                self.tracker.refresh_now()
        now = get_dht_time()
        slowest_done = self.tracker.global_progress.eta_next_epoch
        if slowest_done - now > self.matchmaking_time:
            return
        # a client cannot lead a group: it waits to be taken in, as hivemind schedules a client's gradient round
        if self.client_mode:
            scheduled_time = now + self.averaging_timeout / 2
        else:
            scheduled_time = max(slowest_done, now + self.matchmaking_time)
        control = self._matchmake(epoch, weight=0.0, scheduled_time=scheduled_time, require_trigger=True)
        self._scheduled_round = (epoch, control)
        logger.debug("Outer step %d: matchmaking begins, the slowest peer is done in %.1f s", epoch, slowest_done - now)

    def _take_scheduled_round(self, epoch: int) -> Optional[StepControl]:
        """The pre-scheduled round of outer step `epoch`, still waiting for its trigger; None (and any other one
        cancelled) if there is none: the round then begins its matchmaking now."""
        scheduled, self._scheduled_round = self._scheduled_round, None
        if scheduled is None:
            return None
        scheduled_epoch, control = scheduled
        if scheduled_epoch == epoch and not control.done():
            return control
        self._cancel_round(control)
        return None

    def _cancel_scheduled_round(self) -> None:
        scheduled, self._scheduled_round = self._scheduled_round, None
        if scheduled is not None:
            self._cancel_round(scheduled[1])

    def _leave_round(self) -> None:
        """Cancel the rounds of the epoch this peer leaves (a download, catching up, shutdown): the one whose
        matchmaking began and the one its pseudo-gradient went to (overlap)."""
        self._cancel_scheduled_round()
        sent, self._sent_round = self._sent_round, None
        if sent is not None and sent.control is not None:
            self._cancel_round(sent.control)
        self.tracker.round_in_flight = False

    @staticmethod
    def _cancel_round(control: Optional[StepControl]) -> None:
        if control is not None and not control.done():
            control.cancel()

    def _matchmake(self, epoch: int, weight: float, **schedule) -> StepControl:
        """Begin outer step `epoch`'s round. Its matchmaking keys carry the outer step, so peers of different steps
        never form a group (hivemind's keys carry no epoch); the all-gather still checks it, for keys that wrap
        around. What the group gathers: the outer step, whether this peer stepped apart from the swarm since it last
        averaged state, and its outer state's fingerprint, or at the first outer step the digest of its bytes (all
        three fixed during the inner steps)."""
        if epoch == 0:  # whether the members start alike: if so, the first step need not average their state
            check = {"digest": self._state_digest()}
        else:
            check = self._state_fingerprint() if self.state_check_tolerance else []
        self.outer_averager.set_group_bits(averager_keys.group_bits(averager_keys.DILOCO_OUTER, epoch))
        return self.outer_averager.step(
            weight=weight, gather=[epoch, self._apart_from_swarm, check], timeout=self.averaging_timeout,
            wait=False, **schedule,
        )

    # --- the outer step ----------------------------------------------------------------------------------------

    def _next_state_round(self, before, timeout: float = 2.0):
        """The state round recorded after `before` (the recording is a done-callback of the round's control, which
        may run a moment after the round returned), or None."""
        deadline = time.monotonic() + timeout
        while True:
            last = self.averaging_log.last("state")
            if last is not None and last is not before:
                return last
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def _outer_parameters(self) -> list:
        return [param for group in self.state_averager.optimizer.param_groups for param in group["params"]]

    def _alone(self) -> bool:
        return self.tracker.other_peers == 0

    def _swarm_moved_on(self, epoch: int) -> bool:
        return self.tracker.global_epoch > epoch and not self._alone()

    def _send_round(self, came_with_state: bool) -> Optional[SentRound]:
        """Send this peer's pseudo-gradient to the round of its outer step; returns once the round is under way
        (it runs in the averager's process). None if it downloaded the swarm's state instead."""
        epoch = self.local_epoch
        overlapped = self.round_steps < self.inner_steps
        if self.overlap_steps and came_with_state and not self.catching_up:
            # it took (or restored) a state whose round had already sent its pseudo-gradients: there is no round
            # left to join, and what it computes now belongs to no outer step; take the outer step's result
            self._cancel_scheduled_round()
            if self._wait_for_swarm_to_move_on(epoch):
                self._skip_round(epoch, "this peer came into the round after its pseudo-gradients were sent")
                return None
        self.tracker.publish_now()
        self.tracker.refresh_now()
        peer_wait = 0.0
        if self._scheduled_round is None:  # a pre-scheduled round's group is formed: waiting would only delay it
            peer_wait = self._wait_for_stragglers(epoch)
        if self._swarm_moved_on(epoch):
            self._skip_round(epoch, "the swarm finished this outer step without this peer")
            return None

        sent = SentRound(epoch, self._pseudo_gradient(), float(self._round_samples), time.perf_counter(), overlapped,
                         peer_wait=peer_wait)
        if implausible_average(sent.own, sent.own, 0.0):
            # never send it: take part with weight 0, i.e. step on the others' average (or on nothing)
            logger.error("This peer's own pseudo-gradient is not finite: it contributes nothing to outer step %d", epoch)
            for tensor in sent.own:
                tensor.zero_()
            sent.weight = 0.0
        self._send(sent)
        return sent

    def _skip_round(self, epoch: int, why: str) -> None:
        logger.warning("%s (outer step %d, the swarm is at %d): downloading its state", why, epoch,
                       self.tracker.global_epoch)
        self.averaging_log.record("outer", "skipped", group_size=1, duration=0.0, epoch=epoch, error=why)
        self.load_state_from_peers()

    def _wait_for_swarm_to_move_on(self, epoch: int) -> bool:
        """Wait (at most averaging_timeout, the round's own bound) until the swarm has finished outer step `epoch`;
        False if it has not by then, or if this peer is alone."""
        deadline = time.monotonic() + self.averaging_timeout
        self.tracker.refresh_now()
        while not self._swarm_moved_on(epoch):
            if self._alone() or time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True

    def _finish_round(self, sent: SentRound) -> None:
        """The outer step on the round's result (or on this peer's own pseudo-gradient)."""
        epoch, weight = sent.epoch, sent.weight
        pseudo_gradient, outcome, group_size, why, group_apart = self._receive(sent)
        if outcome in ("local", "partial") and weight == 0 and not self._alone():
            # nothing of its own to step on (it joined at the round's end): a lone step would only apply momentum
            # and leave this peer apart from the swarm for good; take the swarm's result instead
            self._skip_round(epoch, f"the round failed for a peer with nothing to contribute ({why})")
            return
        if outcome == "local" and self._swarm_moved_on(epoch):
            # the round found no group because the others are past this outer step (one took it alone before it
            # saw this peer): a lone step would keep this peer one step behind them for good, every round of both
            # failing (seen in CI); take the swarm's state instead
            self._skip_round(epoch, f"the round failed ({why}) and the swarm is past this outer step")
            return
        # overlap: the model took inner steps since it sent; keep a share of them (Streaming DiLoCo's mixing), but
        # not of a state this peer only caught up to. Taken now: averaging the state writes the model too.
        own_parameters = self._own_parameters() if sent.overlapped and not self.catching_up else None
        # Every peer of the group decides alike (the flags came with the round), so they average state together,
        # before the outer step and at this epoch: a peer that downloads the state meanwhile gets this epoch's,
        # finds the round over and downloads again, never a state from before the repair labelled as after it.
        if outcome == "success" and (group_apart or self._should_average_state(epoch + 1)):
            self._average_state_with_group(epoch, group_apart)
        self._apply_outer_step(pseudo_gradient, own_parameters)
        duration = (sent.finished or time.perf_counter()) - sent.started
        if outcome == "success":
            overlap = f", sent {self.overlap_steps} inner steps before its end" if sent.overlapped else ""
            logger.info(
                "Outer step %d: averaged pseudo-gradients with %d peers (%.2f s%s; waited %.2f s for it, %.2f s for "
                "slower peers before sending)",
                epoch, group_size, duration, overlap, sent.waited, sent.peer_wait,
            )
        elif why != "alone in the swarm":
            logger.warning("Outer step %d on this peer's own pseudo-gradient: %s", epoch, why)
        elif not self._said_alone:  # as sync says it: info, once until peers come, not a warning every outer step
            logger.info("Outer step %d on its own pseudo-gradient: alone in the swarm (said once while alone)", epoch)
        self._said_alone = why == "alone in the swarm"
        self.averaging_log.record(
            "outer", outcome, group_size=group_size, duration=duration, epoch=epoch, error=why,
            waited=sent.waited if sent.overlapped and sent.control is not None else None, peer_wait=sent.peer_wait,
            timeline=RoundTimeline.of(sent.control),
        )
        if outcome in ("local", "partial", "rejected"):
            # alone, a failed round or a rejected average: other peers stepped otherwise; the next outer step that
            # succeeds with company averages the outer state, or the peers would stay apart for good
            self._apart_from_swarm = True
        self._downloads_since_outer_step = 0
        with self.tracker.pause_updates():
            self.tracker.update_epoch(new_epoch=self.local_epoch)
            self._check_exact_epoch = True
            if not self.client_mode:
                self.state_averager.state_sharing_priority = self.local_epoch

    def _average_state_with_group(self, epoch: int, group_apart: str) -> None:
        """A state round with this outer step's group (a scheduled one, or a repair when `group_apart` says why)."""
        if group_apart:
            logger.info("Averaging parameters and outer momentum at outer step %d: %s", epoch, group_apart)
        before = self.averaging_log.last("state")
        # a peer catching up weighs next to nothing in it (the averager's round_weight: _set_catching_up)
        self.state_averager.step(
            averaging_round=True,
            delay_averaging=False,
            wait_for_delayed_updates=True,
            averaging_opts=dict(timeout=self.averaging_timeout),
        )
        after = self._next_state_round(before)
        if after is not None and after.outcome == "success":
            self._apart_from_swarm = False
            self._set_catching_up(False)
        else:  # the repair round failed: still apart, so the next successful outer step repairs again
            logger.warning("Averaging parameters and outer momentum at outer step %d did not succeed", epoch)

    def _wait_for_stragglers(self, epoch: int) -> float:
        """Wait until the slowest peer of this round is within matchmaking_time of its last inner step (it then
        joins during matchmaking), for at most max_straggler_wait seconds; then go without the rest. Returns the
        seconds waited: with H inner steps for every peer, a faster peer waits for the slowest every outer step."""
        began = time.monotonic()
        deadline = began + self.max_straggler_wait
        while True:
            progress = self.tracker.global_progress
            if self._alone() or progress.epoch > epoch:
                break
            eta = progress.eta_next_epoch - get_dht_time()
            if eta <= self.matchmaking_time:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning("Outer step %d goes without the slowest peers (done in about %.0f s)", epoch, eta)
                break
            time.sleep(min(left, 0.25))
        return time.monotonic() - began

    def _outer_state(self) -> tuple[list, list]:
        """The outer parameters and the outer momentum buffers."""
        params = self._outer_parameters()
        state = self.state_averager.optimizer.state
        # .get: torch's optimizer state is a defaultdict, and an outer SGD without momentum keeps no buffer
        momentum = [state.get(param, {}).get("momentum_buffer") for param in params]
        return params, [buffer for buffer in momentum if buffer is not None]

    def _state_digest(self) -> str:
        return bytes_digest(tensor for tensors in self._outer_state() for tensor in tensors)

    @torch.no_grad()
    def _state_fingerprint(self) -> list[float]:
        """Four float64 numbers that two peers with the same outer state share, and that one outer step (or a
        download of another epoch's state) changes: the L1 norms and squared L2 norms of the outer parameters and
        of the outer momentum (norms, not sums: a sum near 0 would make rounding look like a difference)."""
        fingerprint = []
        for tensors in self._outer_state():
            l1 = l2 = 0.0
            for tensor in tensors:  # one float64 copy at a time
                flat = tensor.detach().to(torch.float64).flatten()
                l1, l2 = l1 + float(flat.abs().sum()), l2 + float(flat.dot(flat))
            fingerprint += [l1, l2]
        return fingerprint

    @torch.no_grad()
    def _pseudo_gradient(self) -> list:
        """Outer parameters minus this peer's current ones, fp32 on the host: how far H inner steps moved it."""
        return [
            outer.detach() - main.detach().to(device="cpu", dtype=torch.float32)
            for outer, main in zip(self._outer_parameters(), self.state_averager.main_parameters)
        ]

    def _send(self, sent: SentRound) -> None:
        """Put the pseudo-gradient into the outer averager and start (or trigger the pre-scheduled) round."""
        if self._alone():
            self._cancel_scheduled_round()
            sent.why = "alone in the swarm"
            return
        with torch.no_grad(), self.outer_averager.get_tensors() as tensors:
            for tensor, mine in zip(tensors, sent.own):
                tensor.copy_(mine)
        control = self._take_scheduled_round(sent.epoch)
        try:
            if control is None:
                control = self._matchmake(sent.epoch, sent.weight)
            else:  # its matchmaking began during the last inner steps; the pseudo-gradient is in the averager now
                control.weight = sent.weight
                control.allow_allreduce()
                self.prescheduled_rounds_total += 1
        except BaseException as e:  # noqa: BLE001 - any failure of the round falls back to the own pseudo-gradient
            self._cancel_round(control)
            sent.why = f"the round failed: {e!r}"
            return
        sent.control = control
        control.add_done_callback(lambda _: setattr(sent, "finished", time.perf_counter()))
        self.tracker.round_in_flight = sent.overlapped

    def _receive(self, sent: SentRound) -> tuple[list, str, int, str, str]:
        """(pseudo-gradient to step on, outcome, group size, why not averaged, why the group must average its outer
        state first: a member stepped apart from the swarm since it last averaged state, or the members' outer
        states differ; "" if it need not) for the round sent."""
        own, control, epoch = sent.own, sent.control, sent.epoch
        self.tracker.round_in_flight = False
        if control is None:
            return own, "local", 1, sent.why, ""
        waiting_since = time.perf_counter()
        try:
            # the whole bound from the send: an overlapped round has had the overlap steps' time already
            left = sent.started + self.averaging_timeout + self.matchmaking_time - waiting_since
            gathered = control.result(max(left, 0.0))
            if not gathered:
                raise RuntimeError("the averaging round found no group")
        except BaseException as e:  # noqa: BLE001 - any failure of the round falls back to the own pseudo-gradient
            self._cancel_round(control)
            return own, "local", 1, f"the round failed: {e!r}", ""
        finally:
            sent.waited = time.perf_counter() - waiting_since
        missing = missing_share(gathered)
        if missing:  # the group's members now hold different mixes: stepped on its own, apart until repaired
            return own, "partial", 1, what_did_not_arrive(missing), ""
        gathered = dict(gathered)
        with torch.no_grad(), self.outer_averager.get_tensors() as tensors:
            averaged = [tensor.clone() for tensor in tensors]
        gathered = [gathered_entry(value) for value in gathered.values()]
        others = sorted({peer_epoch for peer_epoch, *_ in gathered if peer_epoch != epoch}, key=repr)
        problem = f"peers of outer step {others} took part" if others else ""
        problem = problem or implausible_average(own, averaged, self.pseudo_gradient_guard_ratio)
        if problem:
            return own, "rejected", len(gathered), f"rejected the average: {problem}", ""
        return averaged, "success", len(gathered), "", self._why_apart(gathered, epoch)

    def _why_apart(self, gathered: list, epoch: int) -> str:
        """Why the group must average its outer state before this step ("" if it need not). Every member decides
        from the same gathered values, so all of them decide alike."""
        if any(apart for _, apart, _, _ in gathered):
            return "a peer of the group had stepped on its own pseudo-gradient"
        if epoch == 0:
            # Peers of one run start alike (one seed, or the state of a level peer: swarm/initial_state.py), and
            # averaging equal states only cost time: ~17 s of parameters and momentum at 20 Mbit/s for the 9M
            # parameters of benchmarks/wan.py, once per run (docs/DILOCO.md). Older swarmd sends no digest: average.
            digests = {digest for *_, digest in gathered}
            if len(digests) != 1 or "" in digests:
                return "the first outer step, and the members did not all start from the same outer state"
            return ""
        fingerprints = [fingerprint for _, _, fingerprint, _ in gathered if fingerprint]
        if self.state_check_tolerance > 0 and len(fingerprints) > 1:
            difference = fingerprint_difference(fingerprints)
            if difference > self.state_check_tolerance:
                return f"the members' outer states differ (fingerprints off by {difference:.1e}, relative)"
        return ""

    @torch.no_grad()
    def _own_parameters(self) -> list:
        return [param.detach().clone() for param in self.state_averager.main_parameters]

    @torch.no_grad()
    def _apply_outer_step(self, pseudo_gradient: list, own_parameters: Optional[list] = None) -> None:
        """The outer step; the new outer parameters become the model's, mixed with `own_parameters` (overlap) as
        model = outer + overlap_mixing x (own - outer)."""
        averager = self.state_averager
        # a peer downloading the state meanwhile gets it whole and labelled with its epoch, before or after
        with averager.state_lock, averager.lock_optimizer, averager.lock_averaged_tensors:
            for param, gradient in zip(self._outer_parameters(), pseudo_gradient):
                param.grad.copy_(gradient)
            averager.optimizer.step()
            averager.outer_parameters_to_model()  # the new outer parameters become the model's
            if own_parameters is not None and self.overlap_mixing > 0:
                for param, own in zip(averager.main_parameters, own_parameters):
                    param.lerp_(own, self.overlap_mixing)
            averager.move_to(averager.local_epoch + 1, round_steps=0)
        self._round_samples = 0

    def _should_average_state(self, next_epoch: int) -> bool:
        every = self.diloco_average_state_every
        return every > 0 and next_epoch % every == 0

    # --- joining, checkpoints, shutdown ------------------------------------------------------------------------

    def load_state_from_peers(self, **kwargs):
        """The swarm's outer parameters, outer momentum, inner optimizer state and round progress (bounded tries;
        raises StateLoadFailed). This peer then takes the rest of the swarm's round from the outer parameters."""
        self._leave_round()
        self._downloads_since_outer_step += 1
        with self.tracker.pause_updates():
            self.downloads.download(self.state_averager, **kwargs)
            # the tracker's view of the swarm may be older than the state that came: let it not send us back
            self.tracker.update_epoch(new_epoch=self.local_epoch)
            if not self.client_mode:
                self.state_averager.state_sharing_priority = self.local_epoch
        self._set_catching_up(False)
        self._restart_round(apart_from_swarm=False)
        logger.info(
            "Took the swarm's state at outer step %d, %d inner steps into the round (inner step %d)",
            self.local_epoch,
            self.state_averager.round_steps,
            self.state_averager.inner_step,
        )

    def _catch_up_by_averaging(self) -> None:
        """The swarm moves on faster than its state downloads (at 20 Mbit/s a 9M-parameter model's state takes
        45-60 s, against outer steps of seconds: docs/PERFORMANCE.md section 9): another download would end behind
        it again. Join the swarm's current outer step at its end, with nothing to contribute (weight 0); the group
        then averages its outer state first (this peer says it is apart), with this peer's own weighing next to
        nothing, and steps on the others' average: this peer ends the round with the swarm's outer state."""
        self._leave_round()
        epoch = self.tracker.global_epoch
        logger.warning(
            "The swarm moved on during %d state downloads in a row: joining its outer step %d (this peer's state is "
            "from step %d) to take the swarm's outer state by averaging",
            self._downloads_since_outer_step, epoch, self.local_epoch,
        )
        self._set_catching_up(True)  # before its epoch changes: nobody may download its old state under the new one
        # nothing to compute: the next step() joins the round where its pseudo-gradients are sent
        self._move_apart_to(epoch, round_steps=self._send_step)

    def _restart_downloaded_statistics(self) -> None:
        """The outer optimizer's statistics and the inner optimizer's, which a DiLoCo state carries too: a liar's
        inner moments kept would steer this peer's next inner steps (only the outer ones were restarted before).
        Under the state lock: a peer downloading this one's state meanwhile gets them all before or all after."""
        from swarmd.swarm.downloaded_statistics import restart_statistics

        with self.state_averager.state_lock:
            super()._restart_downloaded_statistics()
            restart_statistics(self.inner_optimizer)

    def _take_epoch_back(self, epoch: int) -> None:
        """A refused download's outer step undone (ReadsItsParts.refuse_state): the parameters put back are the
        worker's backup of `epoch`'s start, no inner step into its round; the inner schedule follows (move_to), and
        the round starts again apart from the swarm's, as after a catch-up."""
        self._move_apart_to(epoch, round_steps=0)

    def _move_apart_to(self, epoch: int, round_steps: int) -> None:
        """This peer at outer step `epoch`, `round_steps` into its round, with a state not the swarm's: the averager
        (under its state lock), the tracker and the round follow."""
        averager = self.state_averager
        with averager.state_lock:
            averager.move_to(epoch, round_steps=round_steps)
        with self.tracker.pause_updates():
            self.tracker.update_epoch(new_epoch=epoch)
        self._restart_round(apart_from_swarm=True)

    @torch.no_grad()
    def restore_parameters(self, saved: list) -> None:
        """The worker's last good parameters back (ReadsItsParts), here the outer ones too. Where that undoes an outer
        step (the worker rejected what it made), the outer momentum goes as well: it carries that step, and kept it
        would push the next outer steps the same way (each restore met a larger step, 1.9x to 3.8x the parameters'
        norm, on the ALBERT micro at LAMB lr 0.05, H = 32). This peer's outer state then differs from the swarm's,
        so it is apart until a round averages it."""
        undoes_outer_step = any(not torch.equal(outer, value.to(outer))
                                for outer, value in zip(self._outer_parameters(), saved))
        super().restore_parameters(saved)
        if not undoes_outer_step:
            return
        outer_state = self.state_averager.optimizer.state
        with self.state_averager.lock_optimizer:
            for param in self._outer_parameters():
                momentum = outer_state.get(param, {}).get("momentum_buffer")
                if momentum is not None:
                    momentum.zero_()  # in place: the state averager shares this tensor
        self._apart_from_swarm = True
        logger.warning("The outer step to epoch %d was undone: its outer momentum is dropped with it", self.local_epoch)

    def _restart_round(self, *, apart_from_swarm: bool) -> None:
        """After a download (the swarm's state) or a catch-up (the swarm's epoch, this peer's old state): the round
        goes on from the averager's epoch and round_steps, with nothing of this peer's in it yet."""
        self._round_samples = 0
        self._apart_from_swarm = apart_from_swarm
        self.tracker.restart_round(self.local_epoch, self.state_averager.round_steps * self.batch_size_per_step)

    def state_dict(self) -> dict:
        """The inner optimizer's state_dict, each parameter's entry holding its outer parameter and momentum too,
        plus local_epoch and round_steps: what a checkpoint needs to resume mid-round (flat, for checkpoint.py)."""
        inner = self.inner_optimizer.state_dict()
        state = {index: dict(values) for index, values in inner["state"].items()}  # not the live dicts
        outer_state = self.state_averager.optimizer.state
        for index, param in enumerate(self._outer_parameters()):
            entry = state.setdefault(index, {})
            entry["outer_param"] = param.detach().clone()
            momentum = outer_state.get(param, {}).get("momentum_buffer")
            if momentum is not None:
                entry["outer_momentum"] = momentum.detach().clone()
        state["local_epoch"] = self.local_epoch
        state["round_steps"] = self.state_averager.round_steps
        return {"state": state, "param_groups": inner["param_groups"]}

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict["state"])
        epoch = state.pop("local_epoch", None)
        round_steps = state.pop("round_steps", 0)
        inner_state, outer_entries = {}, {}
        for index, values in state.items():
            values = dict(values)
            outer_entries[int(index)] = {key: values.pop(key) for key in _OUTER_KEYS if key in values}
            if values:
                inner_state[index] = values
        self.inner_optimizer.load_state_dict({"state": inner_state, "param_groups": state_dict["param_groups"]})
        outer_state = self.state_averager.optimizer.state
        with torch.no_grad():
            for index, param in enumerate(self._outer_parameters()):
                entry = outer_entries.get(index, {})
                if "outer_param" in entry:
                    param.copy_(entry["outer_param"])
                if "outer_momentum" in entry:
                    momentum = outer_state[param].get("momentum_buffer")
                    if momentum is None:
                        outer_state[param]["momentum_buffer"] = entry["outer_momentum"].to(param).clone()
                    else:
                        momentum.copy_(entry["outer_momentum"])  # in place: the state averager shares this tensor
        if epoch is not None:
            self.state_averager.local_epoch = int(epoch)
        self.state_averager.round_steps = int(round_steps)

    def shutdown(self):
        """As hivemind.Optimizer's: goodbye to the tracker's peers, the pending state update, then the averagers."""
        self._leave_round()
        self.tracker.shutdown(self.settings.shutdown_timeout)
        self.state_averager.step(wait_for_delayed_updates=True)
        self.state_averager.shutdown()
        self.outer_averager.shutdown()

    def __del__(self):
        # only a whole construction in the process that made it: a failed one shut its parts down already
        # (shutting_down_on_failure), and a forked child must not shut down its parent's averagers
        if self.__dict__.get("_parent_pid") == os.getpid() and all(
            name in self.__dict__ for name in self._RUNNING_PARTS
        ) and self.state_averager.is_alive():
            self.shutdown()
