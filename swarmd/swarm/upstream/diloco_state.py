"""The DiLoCo peer's state as hivemind's state averager holds and serves it: the OUTER state (host copies of the
parameters, the outer SGD and its momentum), plus the inner optimizer, its schedule and the round's progress, which
a peer that downloads the state takes with it. swarm/strategies/diloco_optimizer.py drives it."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import CompressionInfo, TensorRole

from swarmd.swarm.optimizer_state_wire import describe_optimizer_state, load_described_state
from swarmd.swarm.schedule_rewind import schedule_at
from swarmd.swarm.upstream.state_averager import ObservedStateAverager

__all__ = ["DiLoCoStateAverager"]

logger = logging.getLogger(__name__)


class HoldsDownloadUntilApplied(DecentralizedAverager):
    """Sits just above DecentralizedAverager in the MRO: remembers the metadata of the last state download, which
    TrainingStateAverager consumes without returning, and takes `state_lock` as soon as a download is in, so that
    nobody is served a half-applied state; DiLoCoStateAverager releases it once all of it is applied."""

    _downloaded = None
    state_lock: threading.RLock
    _applying_download = False

    def load_state_from_peers(self, *args, **kwargs):
        loaded = super().load_state_from_peers(*args, **kwargs)
        self._downloaded = loaded
        if loaded is not None and not self._applying_download:
            self.state_lock.acquire()
            self._applying_download = True
        return loaded

    def _downloaded_state_applied(self) -> None:
        if self._applying_download:
            self._applying_download = False
            self.state_lock.release()


class DiLoCoStateAverager(ObservedStateAverager, HoldsDownloadUntilApplied):
    """hivemind's state averager holding the OUTER state (host copies of the parameters, the outer SGD), plus the
    inner optimizer and schedule, which it shares with a peer that downloads the state."""

    inner_optimizer = None  # set by DiLoCoOptimizer once built
    inner_scheduler_factory: Optional[Callable] = None
    inner_scheduler = None
    inner_steps_per_epoch = 1
    round_steps = 0  # inner steps taken since the last outer step (or given by the peer the state came from)
    appends_to_state = True  # the inner optimizer's state, after upstream's

    def __init__(self, **kwargs):
        # One snapshot: the outer parameters and momentum, local_epoch, round_steps and the inner optimizer change
        # together under this lock (the outer step, a download being applied), and a peer downloading this one's
        # state reads them under it. Upstream reads local_epoch for the state's label only after it released
        # lock_averaged_tensors: an outer step in between served the old parameters labelled with the new epoch,
        # and a joiner that took them stayed one outer step apart from the swarm for good.
        self.state_lock = threading.RLock()
        super().__init__(**kwargs)

    @property
    def inner_step(self) -> int:
        return self.local_epoch * self.inner_steps_per_epoch + self.round_steps

    # --- what DiLoCoOptimizer does to it (under state_lock where others may read the state meanwhile) -------------

    def attach_inner_optimizer(self, inner_optimizer, scheduler_factory: Optional[Callable], inner_steps: int) -> None:
        """The inner optimizer works on the model's parameters themselves; this averager holds it with its schedule,
        counted in inner steps, and serves both to joiners."""
        self.inner_steps_per_epoch = inner_steps
        self.inner_scheduler_factory = scheduler_factory
        self.inner_optimizer = inner_optimizer
        self._update_scheduler()

    def count_inner_step(self) -> None:
        """The inner optimizer stepped: one more step into the round, the schedule follows, and the model's
        parameters moved (this peer's other ranks need them)."""
        self.round_steps += 1
        self._update_scheduler()
        self.parameters_version += 1

    def outer_parameters_to_model(self) -> None:
        """The outer parameters (the offloaded optimizer's, on the host) become the model's."""
        self._apply_optimizer_parameters_()

    def move_to(self, epoch: int, round_steps: int) -> None:
        """This peer's place in the run: outer step `epoch`, `round_steps` inner steps into its round."""
        self.local_epoch = epoch
        self.round_steps = round_steps
        self._update_scheduler()

    def _update_scheduler(self):
        """Bring the inner schedule to the inner step (hivemind calls this after downloads, restore.py after loads)."""
        super()._update_scheduler()
        if self.inner_scheduler_factory is None or self.inner_optimizer is None:
            return
        self.inner_scheduler = schedule_at(self.inner_scheduler, self.inner_scheduler_factory, self.inner_optimizer,
                                           self.inner_step)

    def get_current_state(self):
        """Upstream's state (outer parameters, extras, outer SGD state) plus the inner optimizer's state and the
        round's progress, appended so that upstream's loader, which indexes its own tensors only, ignores them.
        Copied under the state lock (ObservedStateAverager.get_current_state): the averager process streams them to
        the downloader later, while the next outer step may already be changing the live ones."""
        with self.state_lock:
            return super().get_current_state()

    def live_state(self):
        metadata, tensors, infos = super().live_state()
        if self.inner_optimizer is not None:
            with torch.no_grad():
                # by name, not hivemind's dump_optimizer_state (swarm/optimizer_state_wire.py says why)
                inner_description, inner_tensors = describe_optimizer_state(self.inner_optimizer)
            metadata["diloco"] = dict(
                inner_optimizer_state=inner_description, inner_offset=len(tensors), round_steps=self.round_steps
            )
            tensors = list(tensors) + list(inner_tensors)
            infos = list(infos) + [
                CompressionInfo.from_tensor(tensor, key=("inner", i), role=TensorRole.OPTIMIZER)
                for i, tensor in enumerate(inner_tensors)
            ]
        return metadata, tensors, infos

    def load_state_from_peers(self, **kwargs):
        self._downloaded = None
        try:
            super().load_state_from_peers(**kwargs)
            self._apply_downloaded_round()
        finally:
            self._downloaded_state_applied()

    def _apply_downloaded_round(self) -> None:
        """The inner optimizer's state and the round's progress that came with the outer state upstream applied."""
        metadata, tensors = self._downloaded or (None, None)
        if not isinstance(metadata, dict) or metadata.get("epoch") != self.local_epoch:
            return  # nothing came, or upstream refused it (a peer behind this one)
        diloco = metadata.get("diloco")
        if isinstance(diloco, dict) and self.inner_optimizer is not None:
            try:
                offset = diloco.get("inner_offset")
                if not isinstance(offset, int) or not 0 <= offset <= len(tensors):
                    raise ValueError(f"inner_offset {offset!r:.40} is not an index into the {len(tensors)} tensors")
                with self.lock_optimizer:
                    load_described_state(self.inner_optimizer, diloco.get("inner_optimizer_state"), tensors[offset:])
            except (ValueError, RuntimeError) as e:  # RuntimeError: torch's own load refused it
                logger.warning("The downloaded inner optimizer state does not fit this peer's optimizer (%s): "
                               "keeping this peer's", e)
            round_steps = diloco.get("round_steps", 0)
            # a peer's claim: within the round, or the round from its start
            valid = isinstance(round_steps, int) and 0 <= round_steps <= self.inner_steps_per_epoch
            self.round_steps = round_steps if valid else 0
        else:
            self.round_steps = 0
        self._share_statistics()
        self._update_scheduler()

    @torch.no_grad()
    def _share_statistics(self) -> None:
        """Averaged optimizer statistics (the outer momentum) must stay the very tensors the averager holds
        (reuse_tensors): a load replaces the optimizer's tensors, so copy the values back into the shared ones."""
        if not self.opt_keys_for_averaging or not self.reuse_tensors:
            return
        opt_parameters = [param for group in self.optimizer.param_groups for param in group["params"]]
        with self.get_tensors() as averaged:
            index = len(opt_parameters)
            for key in self.opt_keys_for_averaging:
                for param in opt_parameters:
                    shared, current = averaged[index], self.optimizer.state[param][key]
                    if current is not shared:
                        shared.copy_(current)
                        self.optimizer.state[param][key] = shared
                    index += 1
