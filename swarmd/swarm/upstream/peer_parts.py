"""What every strategy's optimizer is made of, as parts it composes: its averagers' common settings, its progress
tracker and state averager started the way hivemind.Optimizer starts them, bounded and counted state downloads, the
local gradients' clipping, and the shutdown of what a construction that fails part-way had started.

The sync strategy's SwarmOptimizer (optimizer.py) is a hivemind.Optimizer and plugs these into upstream's
construction hooks; DiLoCo's optimizer (swarm/strategies/diloco_optimizer.py) is not, and builds itself from them.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Optional

from swarmd.swarm import averager_keys, exclusion

__all__ = [
    "CATCHING_UP_WEIGHT", "AveragerSettings", "ReadsItsParts", "StateDownloads", "StateLoadFailed", "StateRefused",
    "clip_local_gradients", "implausible_average", "outliers_clipped_total", "shutting_down_on_failure",
    "start_progress_tracker", "start_state_averager",
]

logger = logging.getLogger(__name__)

# A peer catching up by averaging weighs this much in the state round: it takes the swarm's state, not its older one
# (not 0: a group of such peers alone would divide by a zero total weight)
CATCHING_UP_WEIGHT = 1e-6


class StateLoadFailed(RuntimeError):
    """Downloading the swarm's state failed `load_state_attempts` times in a row."""


class StateRefused(StateLoadFailed):
    """Every peer that offers its state refused to send it (not retried: the next attempt would be refused too)."""


@dataclass(frozen=True)
class AveragerSettings:
    """What every averager of one peer starts with, as hivemind.Optimizer gives its own: the DHT, the run's prefix,
    the timeouts and the client mode."""

    dht: Any
    run_id: str
    matchmaking_time: float
    allreduce_timeout: float
    next_chunk_timeout: float
    shutdown_timeout: float
    client_mode: bool

    def of(self, suffix: str) -> dict:
        """The keyword arguments of the averager keyed `suffix` (swarm/averager_keys.py)."""
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


def start_state_averager(
    averager_type: type, settings: AveragerSettings, suffix: str, *, averaging_log, on_state_loaded, state_stream: bool,
    offload_optimizer: bool, status_loglevel: int, auxiliary: bool, **kwargs,
):
    """A state averager (state_averager.py ObservedStateAverager or a subclass) as upstream's Optimizer starts one."""
    return averager_type(
        averaging_log=averaging_log,
        on_state_loaded=on_state_loaded,
        download_by_stream=state_stream,
        offload_optimizer=offload_optimizer,
        custom_gradients=offload_optimizer,
        status_loglevel=status_loglevel,
        auxiliary=auxiliary,
        **settings.of(suffix),
        **kwargs,
    )


def start_progress_tracker(tracker_type: type, settings: AveragerSettings, target_batch_size: int, *,
                           status_loglevel: int, **kwargs):
    """A progress tracker (progress.py ThrottledProgressTracker or a subclass) under the run's prefix."""
    return tracker_type(
        dht=settings.dht,
        prefix=settings.run_id,
        target_batch_size=target_batch_size,
        client_mode=settings.client_mode,
        status_loglevel=status_loglevel,
        start=True,
        **kwargs,
    )


class StateDownloads:
    """The swarm's state downloaded into a peer's state averager: `attempts` tries at most, each bounded by
    `timeout`, and counted (`total`, which the worker's parameter guard and the ranks read as "the state was
    replaced")."""

    def __init__(self, *, attempts: int, timeout: float, dht):
        self.attempts, self.timeout, self.dht = attempts, timeout, dht
        self.total = 0
        # (donor, "suspected" or "excluded"): why a state was taken again already (came_from_a_suspect)
        self._donors_doubted: set[tuple[str, str]] = set()
        # set by came_from_a_suspect until the next download: the whole state is due, the doubted donor's optimizer
        # statistics with its parameters (not the parameters alone, nor a catch-up that averages parameters only)
        self.whole_state_due = False

    def came_from_a_suspect(self, state_averager) -> bool:
        """Whether the last download came from a peer that this peer has since found evidence against (a suspect,
        or excluded: swarm/exclusion.py): then the state is to be taken again, from the peers without evidence first
        (state_stream.py donor_order). Once per donor and degree (suspected, then excluded): where every donor is a
        suspect, downloads would otherwise go from one to the other at each step. Before the evidence is in, a
        joiner may take a liar's state (an attacker serves its own, or one its attack set astray); kept, its
        parameters stay apart from the honest peers', whose updates it then finds "pulling against" its own: in
        the liar swarm test an honest joiner so excluded its honest partner (tests/swarm/test_lying_peers.py)."""
        listed = exclusion.installed()
        if listed is None:
            return False
        degrees = {donor: "excluded" if listed.excludes(donor) else "suspected" if listed.suspected(donor) else ""
                   for donor in state_averager.donors_of_the_state()}
        fresh = [(donor, degree) for donor, degree in degrees.items()
                 if degree and (donor, degree) not in self._donors_doubted]
        if not fresh:
            return False
        self._donors_doubted.update(fresh)
        self.whole_state_due = True
        logger.warning("This peer's state came from %s, which it now has evidence against: taking the state again",
                       ", ".join(f"{donor} ({degree})" for donor, degree in fresh))
        return True

    def count(self) -> None:
        self.total += 1
        logger.info("Downloaded the swarm's state from a peer (download #%d)", self.total)

    def download(self, state_averager, **kwargs) -> None:
        """Raises StateLoadFailed after `attempts` failures, StateRefused when every peer that offers its state
        refused it (retrying would be refused too)."""
        self.whole_state_due = False
        for attempt in range(1, self.attempts + 1):
            loads, refusals = self.total, state_averager.download_refusals.value
            try:
                # Upstream's Optimizer then downloads the gradient averager's "state" too (its gradient buffers: the
                # parameters' size again), which DecentralizedAverager.load_state_from_peers only returns, and
                # nobody applies (the accumulators are reset right after): not asked for here, nor served
                # (gradient_averager.py).
                state_averager.load_state_from_peers(timeout=self.timeout, **kwargs)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                logger.warning("Downloading state from peers failed (attempt %d/%d): %r", attempt, self.attempts, e)
                continue
            refused = state_averager.download_refusals.value - refusals
            if self.total == loads and refused:
                raise StateRefused(
                    f"every peer that offers the swarm's state refused to send it ({refused} peer(s)): in a private "
                    f"swarm this peer ({self.dht.peer_id}) must be on network.allowed_peers; ask the run's operator "
                    "to add it"
                )
            return
        raise StateLoadFailed(f"could not download the swarm's state in {self.attempts} attempts")


class ReadsItsParts:
    """What the rest of swarmd reads of either strategy's optimizer (swarm/strategies/protocol.py SwarmStrategy)
    that is only its parts' figures: written once for both. Needs `downloads` (StateDownloads), `state_averager`
    and `_RUNNING_PARTS`."""

    downloads: StateDownloads
    _RUNNING_PARTS: tuple[str, ...]

    @property
    def state_loads_total(self) -> int:
        """Downloads (and parameter refreshes) of the swarm's state so far."""
        return self.downloads.total

    @property
    def load_state_timeout(self) -> float:
        """Each download's bound: StateDownloads' (a `swarm run update` changes it live, daemon/retune.py)."""
        return self.downloads.timeout

    @load_state_timeout.setter
    def load_state_timeout(self, seconds: float) -> None:
        self.downloads.timeout = seconds

    @property
    def parameters_version(self) -> tuple[int, int]:
        """Changes whenever the model's parameters were written (a step, averaged state, a download): what rank 0
        passes to StepSync.lead so the other ranks follow (swarmd.ranks)."""
        return (self.state_averager.parameters_version, self.state_loads_total)

    @property
    def outliers_clipped_total(self) -> int:
        """Senders this peer's averagers clipped as outliers, one per sender and round (robust_aggregation.py)."""
        return outliers_clipped_total(self, self._RUNNING_PARTS)

    @property
    def state_forwarded_bytes_total(self) -> int:
        """Bytes of clients' state this peer forwarded to joiners (state_forward.py), read from its process."""
        counter = getattr(self.state_averager, "forwarded_bytes", None)
        return counter.value if counter is not None else 0

    def restore_parameters(self, saved: list) -> None:
        """Put `saved` (the model's parameters, last known good, in order) back as this peer's parameters: the
        model's, and the offloaded optimizer's own host copies (DiLoCo's outer parameters) too, or the next step
        would write the rejected ones back. The caller discards its local gradients."""
        import torch

        averager = self.state_averager
        with torch.no_grad():
            for value, param in zip(saved, averager.main_parameters):
                param.copy_(value.to(param.device))
            if averager.offload_optimizer:
                with averager.lock_optimizer:
                    opt_params = [p for group in averager.optimizer.param_groups for p in group["params"]]
                    for value, opt_param in zip(saved, opt_params):
                        opt_param.copy_(value)

    def refuse_state(self, saved: list, epoch: Optional[int] = None) -> list[str]:
        """The state the last download brought, refused (the worker judged it on this peer's own data,
        swarmd/worker/download_judge.py): `saved` (the worker's last good parameters, from before the download)
        back, with their `epoch` (the state's was its donor's word: a liar's may be any, and kept, this peer would
        train and publish its progress at it, its schedule's rate stepped there), the optimizer statistics that came
        with it started afresh (the donor's momentum would carry this peer's next steps its way: in the attack
        benchmark's wreck every honest peer stepped uphill for ~20 s on a downloaded momentum), and each donor
        reported as evidence (swarm/exclusion.py, "state": a suspect, asked last). The state is this peer's own
        again: no donor of it is left to take it again from (came_from_a_suspect). The donors."""
        averager = self.state_averager
        donors = list(averager.donors_of_the_state())
        self.restore_parameters(saved)
        self._restart_downloaded_statistics()
        if epoch is not None and epoch < averager.local_epoch:
            self._take_epoch_back(epoch)
        averager.note_donors(())
        listed = exclusion.installed()
        if listed is not None and donors:
            listed.report_state(donors)
        return donors

    def _restart_downloaded_statistics(self) -> None:
        """The optimizer statistics a refused state brought, started afresh: the state averager's optimizer's (DiLoCo's
        inner optimizer's too, DiLoCoOptimizer)."""
        from swarmd.swarm.downloaded_statistics import restart_statistics

        with self.state_averager.lock_optimizer:
            restart_statistics(self.state_averager.optimizer)

    def _take_epoch_back(self, epoch: int) -> None:
        """This peer at `epoch` again (a refused state's was later), its schedule, records and offers with it: each
        optimizer says how (SwarmOptimizer, DiLoCoOptimizer)."""
        raise NotImplementedError


def clip_local_gradients(param_groups, max_norm: Optional[float]) -> None:
    """`swarm.clip_local_grad_norm`: each local step's own (unscaled) gradient is clipped before it is used
    (accumulated into the swarm's average; under DiLoCo, the inner step), as hivemind's ALBERT example does through
    HF Trainer's max_grad_norm."""
    if not max_norm:
        return
    import torch

    params = [p for group in param_groups for p in group["params"] if p.grad is not None]
    if params:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


@contextlib.contextmanager
def shutting_down_on_failure(owner, part_names: tuple[str, ...]):
    """A construction that raises (a DHT that does not answer, an averager that does not start) shuts down the
    parts it started (`owner`'s attributes `part_names`, in that order): an averager's process and the tracker's
    thread would otherwise outlive the error."""
    try:
        yield
    except BaseException:
        for name in part_names:
            part = owner.__dict__.get(name)
            if part is None or not part.is_alive():
                continue
            try:
                part.shutdown()
            except Exception as e:  # the construction's error is the one to report
                logger.warning("Could not shut down %s of a failed construction: %r", name, e)
        raise


def outliers_clipped_total(owner, part_names: tuple[str, ...]) -> int:
    """Senders that `owner`'s averagers clipped as outliers, one per sender and round (robust_aggregation.py)."""
    counters = (getattr(getattr(owner, name, None), "outliers_clipped", None) for name in part_names)
    return sum(counter.value for counter in counters if counter is not None)


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
