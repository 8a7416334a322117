"""The training worker: a thread that runs the task's steps through hivemind.Optimizer.

The daemon's event loop never blocks on training; this thread never touches the loop. It:
- catches up with the swarm at start (bounded state download), then trains step after step;
- runs forward under autocast for bf16/fp16 and scales the loss for fp16 (swarmd.ranks.precision);
- keeps NaN/Inf steps out of the swarm, and restores the last good parameters if a global step made them
  non-finite, or where a state it downloaded proves far worse on its own data (download_judge.py);
- survives a step that raises: logs it, backs off, restores the last good state, and gives up (the daemon
  exits 1) only after `max_consecutive_failures` failures in a row;
- at every global epoch: records the loss trend, evaluates and checkpoints on schedule, stops at max_epochs (with
  checkpoint.export_on_finish, after saving and exporting the last checkpoint);
- says what it is doing and for how long that may legitimately last (`stats.begin`), for systemd's watchdog.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from swarmd.ranks.batches import move_to_device
from swarmd.ranks.local import OneRank
from swarmd.ranks.precision import make_precision
from swarmd.ranks.step_sync import RankFailure
from swarmd.seeds import peer_data_seed  # re-exported: its callers knew it here
from swarmd.swarm.upstream.peer_parts import StateLoadFailed
from swarmd.worker.download_judge import DownloadJudge
from swarmd.worker.stats import WorkerStats
from swarmd.worker.threads import use_threads_in_this_thread

__all__ = ["TrainingWorker", "WorkerSettings", "resolve_device", "move_to_device", "peer_data_seed"]

logger = logging.getLogger(__name__)

_BACKOFF_CAP_SECONDS = 30.0
_SYNC_WAIT_SECONDS = 10.0  # how long to wait for the first view of the swarm's progress before training
# Work no config setting bounds; generous, so a large validation set or a slow disk is not taken for a hang.
_EVALUATION_BUDGET_SECONDS = 1800.0
_CHECKPOINT_BUDGET_SECONDS = 600.0
_EXPORT_BUDGET_SECONDS = 600.0
_NONFINITE_SAID_EVERY = 100  # steps of a run of non-finite ones between two warnings
_NONFINITE_RESTORE_AFTER = 50  # non-finite steps in a row (with finite parameters) before the last good state


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        from swarmd.errors import ConfigError

        raise ConfigError(f"training.device: {name} was asked for but CUDA is not available here; use cpu or auto")
    return device


@dataclass(frozen=True)
class WorkerSettings:
    """The part of the config the worker uses, and the waits it may legitimately make (the watchdog's budgets)."""

    auxiliary: bool = False
    precision: str = "fp32"
    reuse_grad_buffers: bool = False
    max_consecutive_failures: int = 5
    max_epochs: int = 0  # 0: run until stopped
    finish_wait: float = 0.0  # seconds to serve the state at max_epochs while other peers are behind
    checkpoint_every_epochs: int = 10
    guard_parameter_change: float = 0.0
    guard_download_loss_ratio: float = 0.0
    download_budget: float = 0.0  # seconds a state download may take
    step_budget: float = 0.0  # seconds one optimizer.step() may take

    @classmethod
    def from_config(cls, config) -> "WorkerSettings":
        # A state download is load_state_attempts tries of load_state_timeout, after waiting for a delayed update;
        # optimizer.step() may wait for the previous delayed update, average gradients (matchmaking +
        # averaging_timeout) and average state in the foreground, and may download state when out of sync.
        swarm = config.swarm
        download = swarm.load_state_attempts * swarm.load_state_timeout + swarm.averaging_timeout
        return cls(
            auxiliary=swarm.auxiliary,
            precision=config.training.precision,
            reuse_grad_buffers=swarm.reuse_grad_buffers,
            max_consecutive_failures=config.training.max_consecutive_failures,
            max_epochs=config.training.max_epochs,
            finish_wait=config.training.finish_wait_seconds,
            checkpoint_every_epochs=config.checkpoint.every_epochs,
            guard_parameter_change=swarm.guard_parameter_change,
            guard_download_loss_ratio=swarm.guard_download_loss_ratio,
            download_budget=download,
            step_budget=swarm.matchmaking_time + 3 * swarm.averaging_timeout + download,
        )


class TrainingWorker:
    def __init__(
        self,
        *,
        task,
        model: torch.nn.Module,
        optimizer,
        settings: WorkerSettings,
        stats: WorkerStats,
        averaging_log,
        device: torch.device,
        data_seed: int,
        save_checkpoint: Optional[Callable[[], None]] = None,
        export_model: Optional[Callable[[], None]] = None,
        threads: int = 0,
        ranks=None,
        resume=None,
        start_values: str = "",
        join_phases=None,
    ):
        self.task, self.model, self.optimizer, self.settings = task, model, optimizer, settings
        self.threads = threads  # CPU threads this thread computes with (0: leave torch's setting)
        self.stats = stats
        self.averaging_log = averaging_log  # for parameters rejected after a global step
        self.data_seed = data_seed
        self.save_checkpoint = save_checkpoint
        self.export_model = export_model  # checkpoint.export_on_finish: the last checkpoint, exported at max_epochs
        self.device = device
        # ranks/local.py LocalRanks: the peer's other devices; OneRank (or None): this one only
        self.ranks = ranks if ranks is not None else OneRank()
        self.auxiliary = settings.auxiliary
        self.reuse_grad_buffers = settings.reuse_grad_buffers
        self.precision = (
            None
            if self.auxiliary
            else make_precision(
                settings.precision, model=model, device=self.device, reuse_grad_buffers=self.reuse_grad_buffers
            )
        )
        self.start_values = start_values  # what the model started from (swarm/initial_state.py start_values)
        self.resume = resume  # worker/resume.py ResumePoint of the checkpoint the daemon resumed from, or None
        self.join_phases = join_phases  # daemon/join_phases.py JoinPhases: the catch-up's phases go there, then a line
        if resume is not None and self.precision is not None:
            self.precision.load_state_dict(resume.loss_scaler)
        self._stream_seed, self._batches_taken = data_seed, 0  # the data position (see resume_point)
        self.failure: Optional[BaseException] = None  # set when the worker gave up; the daemon exits 1
        self.reached_max_epochs = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swarmd-worker", daemon=True)
        # the model's parameters in the optimizer's order (param groups), which the offloaded copies follow
        self._params = list(optimizer.state_averager.main_parameters)
        self._backup: Optional[list[torch.Tensor]] = None
        self._nonfinite_in_a_row = 0  # steps dropped as non-finite since the last finite one
        self._backup_epoch: Optional[int] = None
        self._backup_state_loads = 0
        # a state downloaded after the join is judged by its first step's loss (and backed up only once it passed)
        self._downloads = DownloadJudge(0.0 if settings.auxiliary else settings.guard_download_loss_ratio)
        self._last_seen_epoch: Optional[int] = None  # auxiliary peers: the epoch seen after the previous step

    # --- control (called from the daemon) -------------------------------------------------------------------

    def start(self) -> None:
        if not self.auxiliary:
            self._read_epoch_state()  # so the status (and the tracking) has the learning rate from the first tick
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.threads:
                use_threads_in_this_thread(self.threads)
            self._catch_up_with_swarm()
            if self.auxiliary:
                self._assist()
            else:
                self._train()
            self.ranks.stop()
            self.stats.set_phase("stopped")
        except BaseException as e:  # noqa: BLE001 - reported to the daemon, which exits 1
            logger.exception("The training worker failed: %s", e)
            self.failure = e
            self.stats.record_fatal(e)

    def _catch_up_with_swarm(self) -> None:
        """Before training: see the swarm's progress and take the swarm's state (bounded) when it is ahead, or, for
        a trainer, when another trainer offers a state it should start from (swarm/initial_state.py)."""
        self.stats.set_phase("joining")
        tracker = self.optimizer.tracker
        timing = self.join_phases.timing if self.join_phases is not None else lambda phase: contextlib.nullcontext()
        with timing("look-up"):
            self.stats.begin("waiting for the swarm's progress", _SYNC_WAIT_SECONDS)
            tracker.fetched_global_progress_this_epoch.wait(_SYNC_WAIT_SECONDS)
            if tracker.global_epoch > self.optimizer.local_epoch and tracker.global_progress.num_peers > 1:
                reason = f"the swarm is at epoch {tracker.global_epoch}, this peer at {self.optimizer.local_epoch}"
            elif not self.auxiliary and self._another_trainer_offers_its_state():
                reason = ("another trainer is at the same epoch or ahead: starting from its parameters "
                          "(one model per swarm)")
            else:
                reason = None
        if reason is not None:
            logger.info("Downloading the swarm's state: %s", reason)
            try:
                self.stats.begin("downloading the swarm's state", self.settings.download_budget)
                loads = self.optimizer.state_loads_total
                with timing("download"):
                    self.optimizer.load_state_from_peers()
                if self.optimizer.state_loads_total == loads:  # every offer failed, or none was left by now
                    logger.warning("No peer sent the swarm's state: training on from this peer's own (epoch %d); it "
                                   "downloads again once it is behind the swarm", self.optimizer.local_epoch)
                elif tracker.global_epoch - self.optimizer.local_epoch > 1:  # what came is older than the swarm
                    logger.warning("Took a state of epoch %d, the swarm is at epoch %d: training on to catch up",
                                   self.optimizer.local_epoch, tracker.global_epoch)
                else:
                    logger.info("Caught up with the swarm at epoch %d", self.optimizer.local_epoch)
            except StateLoadFailed as e:
                logger.warning("%s; training on from the local state, hivemind will retry", e)
        if self.join_phases is not None:
            logger.info("%s", self.join_phases.summary())
        self._take_backup()
        self._downloads.begin(self.optimizer.state_loads_total)

    def _another_trainer_offers_its_state(self) -> bool:
        from swarmd.swarm.initial_state import (
            level_offers,
            offered_states,
            should_take_swarm_state,
            start_values_of_peers,
        )

        self.stats.begin("looking for the swarm's state", _SYNC_WAIT_SECONDS)
        offers = offered_states(self.optimizer, timeout=_SYNC_WAIT_SECONDS)
        epoch, peer_id = self.optimizer.local_epoch, self.optimizer.dht.peer_id.to_base58()
        level = level_offers(epoch, peer_id, offers)
        starts = {}
        if level and self.start_values:
            self.stats.begin("reading what the level peers started from", _SYNC_WAIT_SECONDS)
            starts = start_values_of_peers(self.optimizer.dht, self.optimizer.run_id, level, timeout=_SYNC_WAIT_SECONDS)
            same = [peer for peer in level if starts.get(peer) == self.start_values]
            if same:
                logger.info("%d level peer(s) started from this peer's parameter values: nothing to download from them",
                            len(same))
        return should_take_swarm_state(epoch, peer_id, offers, own_start=self.start_values, starts=starts)

    def _assist(self) -> None:
        """Auxiliary peers only help average; hivemind wants step() called regularly."""
        self.stats.set_phase("assisting")
        while not self._stop.is_set():
            self.stats.begin("averaging", self.settings.step_budget)
            self.optimizer.step()
            self._after_step_epoch_check()
            self._stop.wait(0.2)

    def _train(self) -> None:
        self.stats.set_phase("training")
        self.model.train()
        self.task.set_epoch(self.optimizer.local_epoch)
        self._read_epoch_state()
        batches = self._resumed_batches()
        consecutive_failures = failures_since_start = 0
        while not self._stop.is_set():
            try:
                self.stats.begin("computing")  # the next batch, forward, backward
                self._step(batches)
                consecutive_failures = 0
            except StopIteration:
                self.ranks.sync.abandon_step()  # the data ended after the lead: let the ranks finish the step
                raise
            except (KeyboardInterrupt, RankFailure):
                raise  # a rank that died or hung is not retried: the daemon stops and systemd restarts the peer
            except StateLoadFailed as e:
                logger.warning("%s; retrying after a pause", e)
                self.stats.begin("pausing after a failed state download", 5.0)
                self._stop.wait(5.0)
            except Exception as e:  # noqa: BLE001 - a failing step is survivable up to a bound
                self.ranks.sync.abandon_step()  # the other ranks finish the step's collectives with us
                consecutive_failures += 1
                failures_since_start += 1
                self.stats.record_failure(e)
                limit = self.settings.max_consecutive_failures
                if consecutive_failures >= limit:
                    raise RuntimeError(f"{limit} training steps failed in a row; last error: {e!r}") from e
                delay = min(_BACKOFF_CAP_SECONDS, 2.0 ** (consecutive_failures - 1))
                logger.exception(
                    "A training step failed (%d/%d in a row); restoring the last good state and retrying in %.0f s",
                    consecutive_failures,
                    limit,
                    delay,
                )
                self.stats.set_phase("restarting")
                self.stats.begin("backing off after a failed step", delay)
                self._stop.wait(delay)
                self._restore_backup()
                batches = self._batches(self.data_seed + failures_since_start)
                self.stats.set_phase("training")
            if self.reached_max_epochs:
                break

    # --- the data position and the random generators: what a checkpoint needs to continue exactly ------------

    def _batches(self, seed: int, skip: int = 0):
        """The task's batches of stream `seed` from batch `skip` on, counted as they are taken."""
        self._stream_seed, self._batches_taken = seed, skip  # now, not at the first batch: a save may come first
        source = self.task.resume_batches(seed, skip) if skip else self.task.train_batches(seed)

        def counted():
            for batch in source:
                self._batches_taken += 1
                yield batch

        return counted()

    def _resumed_batches(self):
        """Before the first batch: the random generators and data position of the checkpoint resumed from, or, on
        a fresh start, generators of this peer's own (the model was built with the run's shared seed)."""
        from swarmd.seeds import seed_own_generators
        from swarmd.worker.resume import restore_rng_states

        resume, self.resume = self.resume, None
        position = resume.data if resume is not None else None
        if position is None or position.peer_seed != self.data_seed:
            # a fresh start, or another peer's checkpoint (its generators and data position are that peer's)
            seed_own_generators(self.data_seed)
            return self._batches(self.data_seed)
        restore_rng_states(resume.rng)
        logger.info("Continuing the data where the checkpoint stopped: batch %d of stream %d", position.batches, position.seed)
        return self._batches(position.seed, position.batches)

    def resume_point(self):
        """Where training stands besides the weights; call between steps (the worker thread, or after it stopped)."""
        from swarmd.worker.resume import DataPosition, ResumePoint, capture_rng_states

        return ResumePoint(
            rng=capture_rng_states(),
            loss_scaler=self.precision.state_dict() if self.precision is not None else None,
            data=None if self.auxiliary else DataPosition(self.data_seed, self._stream_seed, self._batches_taken),
        )

    def _step(self, batches: Iterator) -> None:
        started = time.perf_counter()
        self.ranks.sync.lead(  # the ranks step with us, on rank 0's parameters
            params_version=self._parameters_version(), epoch=self.optimizer.local_epoch,
            loss_scale=self.precision.loss_scale() or 1.0,
        )
        # The batch after the lead, as the other ranks take theirs: taken before it, it made them start and finish
        # each step one batch later than this rank, and both waited that long every step (docs/RANKS.md).
        loading = time.perf_counter()
        batch = next(batches)
        started += time.perf_counter() - loading  # a step's seconds are its compute, not its data, as before
        batch = move_to_device(batch, self.device)
        with self.precision.autocast():
            output = self.task.training_step(self.model, batch)
        loss = output.loss
        self.precision.backward(loss)

        loss_value, samples = float(loss.detach().float().item()), output.batch_size
        # .grad becomes the mean over the ranks; hivemind gets the peer's whole batch
        totals = self.ranks.sync.average_gradients(samples=samples, loss=loss_value)
        loss_value, samples = totals.loss, totals.samples
        self.ranks.stats.record(totals)
        if self._judged_download_refused(loss_value):
            return
        epoch_before = self.optimizer.local_epoch
        self.stats.begin("optimizer step", self.settings.step_budget)
        optimizer_started = time.perf_counter()
        if not math.isfinite(loss_value) or not self.precision.step(self.optimizer, samples):
            if math.isfinite(loss_value) and self.precision.loss_scaling:
                # an fp16 overflow: the scaler lowered its scale and dropped the step (normal while it calibrates)
                logger.debug("fp16 overflow: step skipped, loss scale now %s", self.precision.loss_scale())
                if not self.reuse_grad_buffers:
                    self._zero_grad()
                return
            self._drop_nonfinite_step(loss_value)
            return
        self._nonfinite_in_a_row = 0

        if not self.reuse_grad_buffers:
            self._zero_grad()
        finished = time.perf_counter()
        self.stats.record_step(
            samples=samples,
            seconds=finished - started,
            loss=loss_value,
            optimizer_seconds=finished - optimizer_started,
            metrics=output.metrics,
        )
        if self.optimizer.local_epoch != epoch_before:
            self._on_new_epoch(epoch_before)

    def _judged_download_refused(self, loss_value: float) -> bool:
        """This step's loss on this peer's state (download_judge.py): where a state came since the last step, its
        first loss judges it; a refused one is replaced by this peer's last good parameters (from before it), and the
        step is dropped. True where it was refused."""
        loads = self.optimizer.state_loads_total
        if not self._downloads.pending(loads):
            self._downloads.record(loss_value)
            return False
        why = self._downloads.judge(loss_value, loads)
        if not why or self._backup is None:
            self._take_backup()  # the state that came passed: it is the last good one now
            return False
        self._discard_local_gradients()
        donors = self.optimizer.refuse_state(self._backup, self._backup_epoch)
        self.stats.record_restore()
        logger.error("Refused the state downloaded from %s: %s. This peer's parameters and epoch (%s) are back, its "
                     "optimizer statistics start afresh, and its donors are reported as evidence (swarmd status)",
                     ", ".join(donors) or "a peer", why, self._backup_epoch)
        if self.averaging_log is not None:
            self.averaging_log.record("state", "rejected", group_size=1, duration=0.0,
                                      epoch=self.optimizer.local_epoch, error=f"downloaded state refused: {why}")
        return True

    def _drop_nonfinite_step(self, loss_value: float) -> None:
        """A NaN/Inf contribution would poison the swarm's average: drop it. Said at the first of a run of them and
        then every _NONFINITE_SAID_EVERY (a model that diverged made 12,800 such lines in 2 minutes); a run of
        _NONFINITE_RESTORE_AFTER with finite parameters puts back the last good ones, as non-finite ones do at once."""
        self.stats.record_nonfinite_step()
        self._nonfinite_in_a_row += 1
        in_a_row = self._nonfinite_in_a_row
        if in_a_row == 1 or in_a_row % _NONFINITE_SAID_EVERY == 0:
            logger.warning("Non-finite loss or gradients (loss=%s): this step is not contributed (%d in a row)",
                           loss_value, in_a_row)
        self._discard_local_gradients()
        if not self._params_finite():
            logger.error("The parameters themselves are non-finite: restoring the last good state")
            self._restore_backup()
        elif in_a_row % _NONFINITE_RESTORE_AFTER == 0:
            logger.error("%d steps in a row had non-finite gradients: restoring the last good state", in_a_row)
            self._restore_backup()

    def _after_step_epoch_check(self) -> None:
        epoch = self.optimizer.local_epoch
        if self._last_seen_epoch is not None and self._last_seen_epoch != epoch:
            self._on_new_epoch(self._last_seen_epoch)
        self._last_seen_epoch = epoch

    def _on_new_epoch(self, previous_epoch: int) -> None:
        epoch = self.optimizer.local_epoch
        self.stats.end_epoch(previous_epoch)
        self.task.set_epoch(epoch)
        suspicious = self._suspicious_parameters()
        if suspicious:
            logger.error("After the step to epoch %d %s: restoring the last good state", epoch, suspicious)
            self.averaging_log.record("state", "rejected", group_size=1, duration=0.0, epoch=epoch, error=suspicious)
            self._restore_backup()
            return
        if not self._downloads.pending(self.optimizer.state_loads_total):
            self._take_backup()  # (a state that came is backed up once its first step judged it)
        self._read_epoch_state()
        if self._stop.is_set():
            return  # stopping: the daemon saves the final checkpoint itself, once hivemind is quiet
        if self.optimizer.catching_up:
            # DiLoCo took the swarm's epoch ahead of its state (swarm/strategies/diloco_optimizer.py _catch_up_by_averaging): the state
            # is the swarm's only after this round; neither evaluate nor save it under this epoch's name
            return
        every = self.task.eval_every_epochs
        if every and epoch % every == 0 and not self.auxiliary:
            self._evaluate(epoch)
        saved = False
        if self.save_checkpoint is not None and epoch % self.settings.checkpoint_every_epochs == 0:
            self.stats.begin("saving a checkpoint", _CHECKPOINT_BUDGET_SECONDS)
            self.save_checkpoint()
            saved = True
        max_epochs = self.settings.max_epochs
        if max_epochs and epoch >= max_epochs:
            self.reached_max_epochs = True
            if self.export_model is not None and self.save_checkpoint is not None:
                self._export_final_model(saved)
            self._wait_for_peers_behind(max_epochs)
            logger.info("Reached training.max_epochs=%d: stopping", max_epochs)
            self._stop.set()

    def _wait_for_peers_behind(self, last_epoch: int) -> None:
        """Serve this peer's state a while longer (training.finish_wait_seconds) while other peers are at an earlier
        epoch. A peer an epoch behind when the others reach the last one takes the swarm's state by a download; with
        every donor gone it would take the epoch by upstream's one-behind rule and stop an update short, with a
        model of its own (CI, router lab: 0.097 from the others' model, an epoch's move)."""
        tracker = getattr(self.optimizer, "tracker", None)  # a strategy's; absent from the unit tests' fakes
        if self.settings.finish_wait <= 0 or not hasattr(tracker, "peers_behind"):
            return
        deadline = time.monotonic() + self.settings.finish_wait
        fetches = 0
        while not self._stop.is_set():
            behind = tracker.peers_behind(last_epoch)
            if not behind:
                if fetches > 1:
                    logger.info("Every peer of the swarm reached epoch %d", last_epoch)
                return
            if time.monotonic() >= deadline:
                logger.warning("%d peer(s) still behind epoch %d after %.0f s: stopping without them",
                               behind, last_epoch, self.settings.finish_wait)
                return
            if fetches == 1:  # a fresh fetch, not one from before the last round, still shows them behind
                logger.info("%d peer(s) of the swarm are behind epoch %d: serving this peer's state up to %.0f s "
                            "so that they can take it", behind, last_epoch, self.settings.finish_wait)
                self.stats.begin("serving the last state to peers behind", self.settings.finish_wait + 30.0)
            tracker.fetch_soon()
            fetches += 1
            self._stop.wait(1.0)

    def _export_final_model(self, saved: bool) -> None:
        """checkpoint.export_on_finish: the last checkpoint now (the daemon's stop then finds it current and writes
        none) and its export beside it, here between steps rather than within the stop's bounded budget."""
        if not saved:
            self.stats.begin("saving a checkpoint", _CHECKPOINT_BUDGET_SECONDS)
            self.save_checkpoint()
        self.stats.begin("exporting the model", _EXPORT_BUDGET_SECONDS)
        self.export_model()

    def _evaluate(self, epoch: int) -> None:
        started = time.perf_counter()
        self.stats.begin("evaluating", _EVALUATION_BUDGET_SECONDS)
        results = self.task.evaluate(self.model)
        if results:
            self.stats.record_evaluation(epoch, results)
            shown = ", ".join(f"{k}={v:.4g}" for k, v in results.items())
            logger.info("Evaluation at epoch %d: %s (%.1f s)", epoch, shown, time.perf_counter() - started)

    # --- helpers ---------------------------------------------------------------------------------------------

    def _parameters_version(self) -> tuple:
        """Changes whenever rank 0's parameters may have changed: hivemind's writes (SwarmOptimizer counts them),
        the worker's own restores, and every global epoch (a strategy's outer step). The ranks' checksum every
        100 steps is the backstop."""
        return (getattr(self.optimizer, "parameters_version", None), self.stats.restores_total,
                self.optimizer.local_epoch)

    def restore_last_good_state(self) -> None:
        """After the worker stopped mid-step (a rank died): put back the last parameters known good, to save."""
        self._restore_backup()

    def _read_epoch_state(self) -> None:
        """Learning rates, loss scale and CUDA memory for the status and the tracking: once per epoch (the loss
        scale is a device sync on CUDA)."""
        from swarmd.worker.readings import epoch_readings

        self.stats.record_readings(epoch_readings(self.optimizer, self.precision, self.device))

    def _zero_grad(self) -> None:
        for param in self.model.parameters():
            param.grad = None

    def _discard_local_gradients(self) -> None:
        """Drop this step's gradients. With reuse_grad_buffers they are already mixed into the epoch's accumulated
        .grad, so those go too, with the samples they stood for (what hivemind itself does after an fp16 overflow)."""
        grad_averager = self.optimizer.grad_averager
        if self.reuse_grad_buffers and grad_averager is not None:
            grad_averager.reset_accumulated_grads_()
            self.optimizer.tracker.report_local_progress(self.optimizer.local_epoch, samples_accumulated=0)
        else:
            self._zero_grad()

    @torch.no_grad()
    def _suspicious_parameters(self) -> str:
        """Why the parameters after a global step cannot be trusted, or ""."""
        if not self._params_finite():
            return "the parameters are non-finite"
        limit = self.settings.guard_parameter_change
        if not limit or self._backup is None or self.optimizer.state_loads_total != self._backup_state_loads:
            return ""  # a download from peers legitimately replaces everything
        params = [p.detach().to("cpu") for p in self._params]
        change = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(torch._foreach_sub(params, self._backup))))
        size = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(self._backup)))
        if size > 0 and change > limit * size:
            return f"the parameters moved by {float(change / size):.3g}x their norm in one epoch"
        return ""

    def _params_finite(self) -> bool:
        return bool(torch.isfinite(torch.stack(torch._foreach_norm([p.detach() for p in self._params]))).all())

    @torch.no_grad()
    def _take_backup(self) -> None:
        """An in-memory copy of the last parameters known to be finite (on the host, so no device memory)."""
        if self._backup is None:
            self._backup = [p.detach().to("cpu", copy=True) for p in self._params]
        else:
            for saved, param in zip(self._backup, self._params):
                saved.copy_(param.detach())
        self._backup_epoch = self.optimizer.local_epoch
        self._backup_state_loads = self.optimizer.state_loads_total

    @torch.no_grad()
    def _restore_backup(self) -> None:
        if self._backup is None:
            return
        self.optimizer.restore_parameters(self._backup)
        self._discard_local_gradients()
        self.stats.record_restore()
        logger.info("Restored the parameters of epoch %s", self._backup_epoch)
