"""hivemind.Optimizer, made observable and bounded for a long-running daemon.

`SwarmOptimizer`, the optimizer of `swarm.strategy: sync` (swarm/strategies/sync.py builds it from the config), is
hivemind.Optimizer (pinned at 1.1.12) built from swarmd's parts (peer_parts.py, state_averager.py,
gradient_averager.py) with these changes, each overriding one method:
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
- a state round that has found no group two matchmaking times past its start gives up (upstream: averaging_timeout,
  while the next optimizer step waits for it; swarm/upstream/state_averager.py);
- after a download that the swarm outran, the peer takes the swarm's parameters again without the optimizer's
  statistics (a third of the bytes) instead of downloading the whole state again (swarm/upstream/parameter_refresh.py);
- every gradient round sends the epoch it averages, and a peer whose group averaged a later epoch (it was one
  behind: hivemind's group keys carry no epoch) takes the swarm's parameters again at its next step, instead of
  training one behind until upstream's once-an-epoch exact check sees it (swarm/round_epochs.py);
- when a state average is applied, how far this peer's parameters were from it is measured (the drift);
- progress is published to the DHT every quarter of the time left to the epoch's end (0.5-10 s) instead of
  after every step (progress.py); every averager paces its DHT requests (averager_pace.py).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from hivemind.averaging.control import StepControl
from hivemind.optim import Optimizer

from swarmd.swarm import averager_keys
from swarmd.swarm.averaging_log import AveragingLog, RoundTimeline
from swarmd.swarm.downloaded_statistics import restart_implausible_statistics
from swarmd.swarm.round_epochs import behind_as_told, epoch_the_others_averaged, gathered_epoch
from swarmd.swarm.schedule_rewind import scheduler_set_back
from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager, GradientAveragerKeepingOwn
from swarmd.swarm.upstream.partial_rounds import missing_share, what_did_not_arrive
from swarmd.swarm.upstream.peer_parts import (
    CATCHING_UP_WEIGHT,
    AveragerSettings,
    ReadsItsParts,
    StateDownloads,
    StateLoadFailed,
    StateRefused,
    clip_local_gradients,
    implausible_average,
    shutting_down_on_failure,
    start_progress_tracker,
    start_state_averager,
)
from swarmd.swarm.upstream.progress import ThrottledProgressTracker
from swarmd.swarm.upstream.state_averager import ObservedStateAverager

__all__ = ["SwarmOptimizer", "StateLoadFailed", "StateRefused"]

logger = logging.getLogger(__name__)

# After a state download that ended behind, this many parameter refreshes (parameter_refresh.py) before the next
# whole download: where even the parameters alone take longer than the swarm's epoch, refreshing cannot end the
# chase, and a whole download at least brings the optimizer's statistics up to date.
MAX_REFRESHES_PER_DOWNLOAD = 3
# Under gradient averaging a state round looks for its group at most this many matchmaking times past its scheduled
# start, not averaging_timeout (`swarm.state_round_search`; state_averager.py RecordsRounds.group_search_limit)
STATE_ROUND_SEARCH = 2.0
# After a round that said the swarm is an epoch ahead, fetch the progress records (every ROUND_RECORDS_POLL s) until
# they agree, for at most this many seconds: a liar's word alone costs an honest peer this much per round
ROUND_RECORDS_WAIT = 1.5
ROUND_RECORDS_POLL = 0.3


class SwarmOptimizer(ReadsItsParts, Optimizer):
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
    # True from a download under local updates until this peer's next step has checked the optimizer statistics
    # that came with it against its own gradient (swarm/downloaded_statistics.py)
    _statistics_unchecked = False

    def __init__(
        self,
        *,
        averaging_log: AveragingLog,
        load_state_attempts: int = 3,
        refresh_parameters: bool = True,
        refresh_one_behind: bool = False,
        state_round_search: float = STATE_ROUND_SEARCH,
        round_epoch_check: bool = True,
        step_on_partial_average: bool = True,
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
        self.refresh_parameters = refresh_parameters
        self.refresh_one_behind = refresh_one_behind
        self.round_epoch_check = round_epoch_check
        self.step_on_partial_average = step_on_partial_average
        # the swarm's epoch as a gradient round told it, where that round's group was ahead of this peer
        self._swarm_epoch_from_round: Optional[int] = None
        self._records_awaited_for: Optional[int] = None  # the told epoch whose records the peer last waited for
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
            kwargs.setdefault("grad_averager_factory", GradientAveragerKeepingOwn)
        self.downloads = StateDownloads(
            attempts=load_state_attempts, timeout=kwargs.get("load_state_timeout", 600.0), dht=kwargs["dht"]
        )
        self._downloads_since_global_step = 0
        self.parameter_refreshes_total = 0
        self._refreshes_since_download = 0
        self._rounds_with_others_at_catch_up = 0
        self._rounds_with_others_at_inexact_state = 0
        with shutting_down_on_failure(self, self._RUNNING_PARTS):
            super().__init__(**kwargs)
        if self.use_gradient_averaging and state_round_search > 0:
            # every peer begins an epoch's state round at that epoch's end: one that finds no group by then missed it
            self.state_averager.group_search_limit = state_round_search * self.matchmaking_time

    # What construction starts (threads, averager processes), in the order it shuts them down
    _RUNNING_PARTS = ("tracker", "grad_averager", "state_averager")

    def __del__(self):
        # Upstream's __del__ reads the averagers, which a failed construction may not have made; its AttributeError
        # would surface from the garbage collector as an "unraisable" exception. Python 3.11 formats those with
        # ast.parse, and when the collection runs inside another ast.parse (pytest formatting a failure) both fail
        # with SystemError "AST constructor recursion depth mismatch" (CPython gh-106905): a CI run ended so.
        if all(name in self.__dict__ for name in self._RUNNING_PARTS):
            super().__del__()

    def step(self, closure=None, batch_size=None, grad_scaler=None):
        # a scaled, accumulating .grad (grad_scaler) is refused by the config: clipping it would clip a partial sum
        if grad_scaler is None and not self.auxiliary:
            clip_local_gradients(self.param_groups, self.clip_local_grad_norm)
            if self._statistics_unchecked:
                self._check_downloaded_statistics()
        loss = super().step(closure=closure, batch_size=batch_size, grad_scaler=grad_scaler)
        if self.client_mode:  # a client offers its state through forwarders (state_forward.py), as the others serve
            self.state_averager.offer_state_as_client(None if self.catching_up else self.local_epoch)
        if self.catching_up:
            self._maybe_end_catch_up()
        if self.inexact_state:
            self._maybe_end_inexact_state()
        return loss

    # --- construction: upstream's hooks, with swarmd's parts (peer_parts.py) -------------------------------

    @property
    def averager_settings(self) -> AveragerSettings:
        return AveragerSettings(
            dht=self.dht, run_id=self.run_id, matchmaking_time=self.matchmaking_time,
            allreduce_timeout=self.allreduce_timeout, next_chunk_timeout=self.next_chunk_timeout,
            shutdown_timeout=self.shutdown_timeout, client_mode=self.client_mode,
        )

    def _make_state_averager(self, **kwargs) -> ObservedStateAverager:
        # Same arguments as upstream's, with the recording subclass under swarmd's key (averager_keys.py).
        return start_state_averager(
            ObservedStateAverager, self.averager_settings, averager_keys.STATE,
            averaging_log=self.averaging_log, on_state_loaded=self._count_state_load, state_stream=self.state_stream,
            offload_optimizer=self.offload_optimizer, status_loglevel=self.status_loglevel, auxiliary=self.auxiliary,
            **kwargs,
        )

    def _make_progress_tracker(self, target_batch_size: int, **kwargs) -> ThrottledProgressTracker:
        return start_progress_tracker(
            ThrottledProgressTracker, self.averager_settings, target_batch_size, status_loglevel=self.status_loglevel,
            **kwargs,
        )

    def _make_gradient_averager(self, factory, **kwargs):
        averager = super()._make_gradient_averager(factory, **{**self._grad_averager_opts, **kwargs})
        if isinstance(averager, AdmittingGradientAverager):
            # every round, pre-scheduled or begun at the epoch's end, averages this peer's epoch of that moment
            averager.round_epoch_source = lambda: self.local_epoch
        return averager

    def _count_state_load(self) -> None:
        self.downloads.count()
        self._downloads_since_global_step += 1
        self._refreshes_since_download = 0
        # under local updates the statistics are the donor's alone: checked at this peer's next step
        self._statistics_unchecked = self.use_local_updates

    def _check_downloaded_statistics(self) -> None:
        self._statistics_unchecked = False
        averager = self.state_averager
        with averager.lock_optimizer:
            gradients = [param.grad for param in averager.main_parameters]
            restart_implausible_statistics(averager.optimizer, gradients)

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
                self._step_after_partial_round(
                    missing, time.perf_counter() - started, RoundTimeline.of(maybe_step_control)
                )
                return
            self._note_the_rounds_epoch(group_info)
            implausible = self._implausible_average()
            if implausible:
                self._replace_average_with_own_gradients()
            self._load_averaged_gradients_into_optimizer_()
        except BaseException as e:
            # A round begun without a pre-scheduled group has no deadline in the averager's process (upstream's
            # step passes timeout=None): given up on here, it would look for a group on, find another peer's
            # next round, and average this epoch's gradient into it as a success of that peer's
            if not maybe_step_control.done():
                maybe_step_control.cancel()
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

    def _step_after_partial_round(
        self, missing: float, duration: float, timeline: Optional[RoundTimeline] = None
    ) -> None:
        """Part of the average did not arrive (a reducer failed or was late, or this peer refused its part as
        implausible): the buffers hold the average where it came and this peer's own gradient elsewhere. The step
        uses that mix (`step_on_partial_average`; the own gradient everywhere where the guard finds the mix
        implausible, or where the setting is off), and the group averages its state at this epoch's end
        (resync_requested): the parts that differ are the missing share's, not the whole vector.

        Why the mix and not the own gradient everywhere: a peer whose rounds came back partial round after round
        (94% of the average, on a loaded machine) stepped alone on its own gradients, held parameters apart from its
        group's until the state round, and sent gradients that pointed elsewhere there: honest peers found it
        against the round, and one excluded it in a clean run (docs/FAULTS.md, "a round returns only part of the
        average")."""
        implausible = self._implausible_average() if self.step_on_partial_average else ""
        on_own_gradients = not self.step_on_partial_average or bool(implausible)
        used = "the average where it came and local gradients elsewhere"
        if on_own_gradients:
            used = "local gradients" + (f" ({implausible})" if implausible else "")
        logger.warning(
            "Averaging gradients returned %.1f%% of the average (a reducer failed or was late, or its average was "
            "refused as implausible); this epoch uses %s and the group averages its parameters at the epoch's end",
            100 * (1 - missing), used,
        )
        self.averaging_log.record(
            "gradients", "partial", group_size=1, duration=duration, epoch=self.local_epoch,
            error=what_did_not_arrive(missing), timeline=timeline,
        )
        self.state_averager.resync_requested = True
        if on_own_gradients:
            self._step_on_own_contribution()
        else:
            self._load_averaged_gradients_into_optimizer_()

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

    # --- a round whose group was ahead: the swarm has moved on without this peer ----------------------------

    def _note_the_rounds_epoch(self, group_info) -> None:
        """Where most of the round's other members averaged a later epoch than this peer (it was one behind, and
        is still: each side counts one epoch on), remember the swarm's epoch after the round for the next steps;
        each round replaces what the last one said."""
        ahead = epoch_the_others_averaged(group_info, self.dht.peer_id) if self.round_epoch_check else None
        if ahead is not None and self.catching_up:
            ahead = None  # a peer catching up holds the swarm's epoch with an older state on purpose
        if ahead is not None:
            logger.info(
                "This peer averaged its epoch %s's gradients with a group at epoch %d: the swarm has moved on "
                "without it", gathered_epoch(group_info.get(self.dht.peer_id)), ahead,
            )
        self._swarm_epoch_from_round = None if ahead is None else ahead + 1

    def _should_load_state_from_peers(self) -> bool:
        """Upstream's check, and: behind the epoch the last round said the swarm is at, once the progress records
        say so too (round_epochs.behind_as_told)."""
        told = self._swarm_epoch_from_round
        if told is not None and self.local_epoch >= told:
            self._swarm_epoch_from_round = told = None  # caught up meanwhile (a download, a state round)
        if told is not None and self._records_awaited_for != told:
            self._records_awaited_for = told
            return self._records_agree_soon(told)
        if behind_as_told(told, self.local_epoch, self.tracker.global_epoch):
            return True
        return super()._should_load_state_from_peers() or self.downloads.came_from_a_suspect(self.state_averager)

    def _records_agree_soon(self, told: int) -> bool:
        """Once per round that told: fetch the progress records until they agree that the swarm is ahead, for at
        most ROUND_RECORDS_WAIT. Honest peers publish a new epoch at once (progress.py), a few tenths of a second
        after the round. Not waiting, the benchmark's joiner read the others' records of before the round, which
        extrapolate to a finished epoch: it began its next round at once, held the tracker's lock through it (no
        fetch meanwhile), and came one behind to three rounds in a row (docs/PERFORMANCE.md section 5)."""
        fetched = self.tracker.fetched_global_progress_this_epoch
        deadline = time.monotonic() + ROUND_RECORDS_WAIT
        while not behind_as_told(told, self.local_epoch, self.tracker.global_epoch):
            left = deadline - time.monotonic()
            if left <= 0:
                return super()._should_load_state_from_peers()
            fetched.clear()  # set again by the fetch asked for here (or by a later one)
            self.tracker.fetch_soon()
            fetched.wait(min(left, ROUND_RECORDS_POLL))
        return True

    # --- bounded state download, or catching up by averaging ----------------------------------------------

    def load_state_from_peers(self, **kwargs):
        """Upstream's load_state_from_peers with a bounded number of attempts (raises StateLoadFailed); or, when
        the last download already ended behind the swarm, catching up by averaging instead."""
        if self.scheduled_grads is not None and not self.scheduled_grads.done():
            self._tag_along_with_zero_weight(self.scheduled_grads)
            self.scheduled_grads = None
        self.state_averager.step(wait_for_delayed_updates=True)

        with self.tracker.pause_updates():
            whole = self.downloads.whole_state_due  # a donor found lying since: its optimizer statistics go too
            if not whole and self._should_catch_up_by_averaging():
                self._catch_up_by_averaging()
            else:
                behind_the_round, self._swarm_epoch_from_round = self._swarm_epoch_from_round is not None, None
                close_enough = not whole and not behind_the_round and self._one_behind_after_download()
                refreshed = not whole and not close_enough and self._download_parameters_again(behind_the_round)
                if not refreshed and not close_enough:
                    self.downloads.download(self.state_averager, **kwargs)
                self.catching_up = False  # the swarm's own state (its weights and sharing: just below)
                one_behind = self.tracker.global_epoch - 1 <= self.local_epoch < self.tracker.global_epoch
                if one_behind:
                    # upstream's rule: one epoch behind is close enough (a gradient one step stale)
                    logger.info("Catching up with the swarm at epoch %d, this peer's parameters a step stale (one "
                                "epoch behind is close enough; a state round evens them out)",
                                self.tracker.global_epoch)
                    self.state_averager.local_epoch = self.tracker.global_epoch
                self._set_inexact_state(refreshed or one_behind)
            self._start_epoch_afresh()

    def _one_behind_after_download(self) -> bool:
        """A download since the last global step left this sync peer exactly one epoch behind (the swarm stepped as
        it ended, and the tracker saw it only after): upstream's rule, one epoch behind is close enough, as where the
        tracker saw it in time (just below): the swarm's epoch, the parameters a step stale, the state inexact. The
        parameters again (`refresh_one_behind`) took 0.8-1.7 s of the join benchmark's 2.5-3.5 s epochs, and the
        swarm's round often formed meanwhile: the joiner's first round came an epoch or two later; either way its
        optimizer statistics are the download's (docs/PERFORMANCE.md section 5)."""
        if self.refresh_one_behind or self.use_local_updates or self.catching_up or self.auxiliary:
            return False
        return self._downloads_since_global_step >= 1 and self.tracker.global_epoch == self.local_epoch + 1

    def _download_parameters_again(self, behind_the_round: bool = False) -> bool:
        """A download since the last global step already ended behind the swarm (its epochs are shorter than a
        download), or a gradient round's group was an epoch ahead (`behind_the_round`): take the swarm's parameters
        again without the optimizer statistics, a third of the bytes (swarm/upstream/parameter_refresh.py). False
        where that does not apply or no peer sent them: download the state."""
        if not (
            self.refresh_parameters
            and (self._downloads_since_global_step >= 1 or behind_the_round)
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
        self.downloads.total += 1  # a load from peers all the same: e.g. the worker's parameter guard lets it pass
        logger.info(
            "The swarm outran %s: took its parameters again, of epoch %d, in %.1f s "
            "(refresh #%d; the optimizer statistics stay those of the download)",
            "this peer's last round" if behind_the_round else "the state download",
            self.local_epoch, time.monotonic() - started, self.parameter_refreshes_total,
        )
        return True

    def _take_epoch_back(self, epoch: int) -> None:
        """A refused download's epoch undone (ReadsItsParts.refuse_state): this peer at `epoch` again, its schedule
        set back with it, and its progress and the epoch it serves its state under said anew, as after a download."""
        averager = self.state_averager
        with averager.lock_optimizer:
            averager.local_epoch = epoch
            averager.scheduler = scheduler_set_back(averager.scheduler, averager.scheduler_factory, epoch)
        self._start_epoch_afresh()

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
        if isinstance(self.grad_averager, AdmittingGradientAverager):
            self.grad_averager.round_weight = CATCHING_UP_WEIGHT if self.catching_up else None
        if not self.client_mode and not self.auxiliary:
            # an auxiliary peer never serves (hivemind's default for it): its parameters are the ones it started
            # with or downloaded, never stepped (it applies no gradients and takes no average back, only reduces
            # others' parts), while its epoch moves on with the swarm's: a joiner would take them as the swarm's
            self.state_averager.allow_state_sharing = not self.catching_up
