"""One DiLoCo outer round: when it is due (the progress tracker's ETA is the slowest peer's time to its send step),
the averager that carries the pseudo-gradients, what a peer sent to a round, and what the members gather with it
(outer step, apart flag, outer-state fingerprint).
swarm/strategies/diloco_optimizer.py drives it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import StepControl
from hivemind.optim.progress_tracker import GlobalTrainingProgress, LocalTrainingProgress
from hivemind.utils import get_dht_time

from swarmd.swarm import averager_keys
from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
from swarmd.swarm.digests import update_with_bytes
from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
from swarmd.swarm.upstream.progress import ThrottledProgressTracker

__all__ = [
    "OuterAverager", "RoundProgressTracker", "SentRound", "bytes_digest", "fingerprint_difference",
    "gathered_entry",
]


class OuterAverager(UpstreamRpcNames, AdmitsAllowedPeers):
    """hivemind's plain averager for the pseudo-gradients, behind the private swarm's gate (swarm/upstream/averager_gate.py),
    which also says when a round returned only part of the average (swarm/upstream/partial_rounds.py)."""

    _upstream = DecentralizedAverager
    judges_direction = True  # pseudo-gradients: one pointing away from the result is an outlier (robust_aggregation.py)

    def __init__(self, *args, **kwargs):
        # its buffers are this round's pseudo-gradients, nothing a joiner takes (it downloads the state averager's):
        # not offered for download, which also spares the DHT its periodic "download my state" declarations
        kwargs.setdefault("allow_state_sharing", False)
        super().__init__(*args, **kwargs)

    @classmethod
    def beside(cls, settings, parameters, compression, **averager_opts) -> "OuterAverager":
        """Started with the peer's averager settings (peer_parts.py AveragerSettings: its DHT, run id, timeouts and
        client mode); one fp32 host buffer per parameter."""
        return cls(
            averaged_tensors=[torch.zeros_like(p, device="cpu", dtype=torch.float32) for p in parameters],
            compression=compression,
            **settings.of(averager_keys.DILOCO_OUTER),
            **averager_opts,
        )


class RoundProgressTracker(ThrottledProgressTracker):
    """The swarm's ETA is the SLOWEST peer's time to finish its round, not the swarm's summed samples against a
    target: a DiLoCo round ends when every peer has taken its own H steps. Its target_batch_size is this peer's
    round up to its send step in samples ((H - overlap_steps) x batch), which assumes peers of one run use the same
    batch size (docs/DILOCO.md)."""

    round_in_flight = False  # this peer sent its pseudo-gradient and takes its overlap steps (swarm.diloco)

    def _parse_swarm_progress_data(self, metadata) -> GlobalTrainingProgress:
        progress = super()._parse_swarm_progress_data(metadata)
        if not isinstance(metadata, dict) or not metadata:
            return progress
        now = get_dht_time()
        slowest = 0.0
        for entry in metadata.values():
            if entry.value is None:
                continue
            peer = LocalTrainingProgress.parse_obj(entry.value)
            if peer.epoch != progress.epoch:
                continue
            done = peer.samples_accumulated + max(0.0, now - peer.time) * peer.samples_per_second
            remaining = max(0.0, self.target_batch_size - done)
            if remaining > 0:
                slowest = max(slowest, remaining / max(peer.samples_per_second, 1e-9))
        progress.eta_next_epoch = now + slowest
        # while this peer waits for the others, look often; otherwise as upstream would (also while its inner steps
        # overlap the round it sent: nothing waits on the swarm's progress then)
        waiting = self.local_progress.samples_accumulated >= self.target_batch_size and not self.round_in_flight
        refresh = self.min_refresh_period if waiting else min(max(slowest, self.min_refresh_period), self.max_refresh_period)
        progress.next_fetch_time = now + refresh
        return progress

    def publish_now(self) -> None:
        """Publish this peer's progress without the throttle's delay (its round is done: others wait on it)."""
        self._request_publication(urgent=True)

    def refresh_now(self) -> None:
        """Fetch the swarm's progress at once (e.g. when this peer's round is done and it starts waiting)."""
        self.global_progress.next_fetch_time = get_dht_time()
        self.global_state_updated.set()

    def restart_round(self, epoch: int, samples: int) -> None:
        """Say this peer is `samples` into the round of `epoch` (after a download) without counting them as
        throughput, which would make every other peer's ETA for this one wrong for a while."""
        self.local_progress = self._get_local_progress(epoch, samples)
        self.note_contribution(epoch, samples)
        self.performance_ema.reset_timer()
        self._request_publication(urgent=True)


@dataclass
class SentRound:
    """An outer round this peer sent its pseudo-gradient to (or could not: `control` None, `why` says why)."""

    epoch: int
    own: list  # this peer's pseudo-gradient: what it steps on if the round fails
    weight: float
    started: float  # time.perf_counter() at the send
    overlapped: bool  # sent before the H-th inner step: the model has moved on since
    control: Optional[StepControl] = None
    why: str = ""
    finished: Optional[float] = None  # time.perf_counter() when the round's result came
    waited: float = 0.0  # seconds the peer waited for the result (with overlap: what the overlap did not hide)
    peer_wait: float = 0.0  # seconds the peer waited before it sent, for the slowest peers to near their send step


def gathered_entry(value) -> tuple:
    """(epoch, apart, fingerprint, digest) from what a member sent with the round: [epoch, apart, check], the check
    being its outer state's fingerprint, or at the first outer step {"digest": ...}. Older swarmd sent [epoch, apart]
    or a fingerprint there, and no digest (it ignores a dict: no fingerprint to compare)."""
    if isinstance(value, (list, tuple)) and len(value) in (2, 3):
        check = value[2] if len(value) == 3 else []
        if isinstance(check, dict):
            return value[0], bool(value[1]), [], str(check.get("digest") or "")
        fingerprint = list(check) if isinstance(check, (list, tuple)) else []
        return value[0], bool(value[1]), fingerprint, ""
    return value, False, [], ""


def bytes_digest(tensors) -> str:
    """A digest of the tensors' bytes, in order: equal for equal values (and dtypes), and only then."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        update_with_bytes(digest, tensor)
    return digest.hexdigest()


def fingerprint_difference(fingerprints: list) -> float:
    """The largest relative difference between any member's fingerprint and the first one's, entry by entry."""
    reference = fingerprints[0]
    worst = 0.0
    for fingerprint in fingerprints[1:]:
        if len(fingerprint) != len(reference):
            return float("inf")
        for mine, theirs in zip(reference, fingerprint):
            scale = max(abs(mine), abs(theirs), 1e-12)
            worst = max(worst, abs(mine - theirs) / scale)
    return worst
