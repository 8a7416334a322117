"""hivemind's ProgressTracker, publishing this peer's progress at a bounded rate instead of after every step.

Upstream wakes its reporter on every `report_local_progress`, i.e. after every training step, and each wake-up is
a signed DHT store (an RSA signature, a round trip to the DHT process, and a store RPC to each nearby peer that
verifies it). At the micro task's ~15 steps/s that is work on the cores the training needs (docs/PERFORMANCE.md).
Other peers only poll the progress key every `min_refresh_period` (0.5 s by default) and extrapolate between polls
from each peer's samples/s, so publishing more often than that buys them nothing.

This subclass publishes at once whatever changes the swarm's bookkeeping (a new epoch, a reset of the
accumulated samples) and coalesces plain sample counts to at most one publication per interval. The interval is
`report_interval` near the end of the epoch and a quarter of the estimated time to it further away, at most
`max_refresh_period` (10 s): other peers extrapolate each record by its samples/s, and they fetch the key at
about ETA x peers / (peers + 3) themselves, so on an epoch of minutes a count every 0.5 s was ~100 signed stores
per epoch where ~10 tell them as much. The newest count is never lost: a count held back is published by the next
step after the interval or, when no step follows (the worker waits on averaging), by a timer when the interval
is up. Set the minimum with `swarm.tracker_opts: {report_interval: SECONDS}`; 0 publishes after every step as
upstream.

It also fixes when a peer counts as taking part. Upstream's reporter publishes only while the peer "reported
samples" in the current or the previous global epoch, and it judges that from the sample count it reads when it
wakes up, on its own thread. A step that completes an epoch (a batch as large as the swarm's target, or the last
step of a round) resets the count to 0 before the reporter reads it, so such a peer stops publishing, drops out of
every other peer's count, and its own record expires: two lone peers of one run then never see each other
(CI, 2026-12-01: "1 peer", then "0 peers" after the 60 s expiration). Here the contribution is noted when the
step reports it, on the caller's thread, and the reporter reads that.

And it checks other peers' claims before it sums them (issue 34 item 3, swarm/claims.py): each other peer's
samples/s and samples are capped to what the swarm makes plausible, a peer whose samples were capped is reported as
evidence to the exclusions (swarm/exclusion.py), and the records of a peer this one excluded count for nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Optional


from hivemind.optim.progress_tracker import LocalTrainingProgress, ProgressTracker
from hivemind.p2p import PeerID
from hivemind.utils import ValueWithExpiration, get_dht_time, get_logger

from swarmd.swarm import exclusion
from swarmd.swarm.claims import Claim, plausible_claims

upstream_logger = get_logger("hivemind.optim.progress_tracker")

__all__ = ["ThrottledProgressTracker"]

CLAIM_GRACE_SECONDS = 10.0  # claims.py's grace: at least this, or the tracker's longest wait between fetches


class ThrottledProgressTracker(ProgressTracker):
    def __init__(self, *args, report_interval: float = 0.5, **kwargs):
        # set before super().__init__, which starts the reporter thread
        self.report_interval = report_interval
        self._publication_lock = threading.Lock()
        self._last_published = -float("inf")
        self._held_back = False
        self._flush_timer: Optional[threading.Timer] = None
        self.contributed_epoch = -float("inf")  # the last epoch this peer reported samples in
        self._epoch_seen = (-1, get_dht_time())  # (the swarm's epoch, when this peer first saw it): claims.py
        super().__init__(*args, **kwargs)
        self._constructed = True

    other_epochs: tuple = ()  # the epochs of the other peers' records at the last fetch that showed any record

    @property
    def other_peers(self) -> int:
        """Peers in the swarm other than this one (upstream's num_peers counts this one once it reported)."""
        return len(self.other_epochs)

    def update_epoch(self, new_epoch: Optional[int] = None) -> int:
        epoch = super().update_epoch(new_epoch)
        self._saw_epoch(self.global_progress.epoch, get_dht_time())
        return epoch

    def _saw_epoch(self, epoch: int, now: float) -> None:
        if epoch > self._epoch_seen[0]:
            self._epoch_seen = (epoch, now)

    def _checked_claims(self, metadata):
        """`metadata` (upstream's {subkey: ValueWithExpiration(record)}) with excluded peers' records left out and
        the others' claims capped (swarm/claims.py); capped peers reported to the exclusions."""
        excluding = exclusion.installed()
        if excluding is None or not isinstance(metadata, dict):
            return metadata
        now, own = get_dht_time(), self.dht.peer_id.to_bytes()
        kept, parsed = {}, []
        for subkey, entry in metadata.items():
            try:
                record = LocalTrainingProgress.parse_obj(entry.value)
                peer = PeerID(record.peer_id).to_base58()
            except Exception:  # noqa: BLE001 - a goodbye (None) or a malformed record: upstream's to judge
                kept[subkey] = entry
                continue
            if record.peer_id != own and excluding.excludes(peer):
                continue
            parsed.append((subkey, entry, record, peer))
        if excluding.policy.claim_rate_ratio <= 0 or not parsed:
            return {**kept, **{subkey: entry for subkey, entry, _, _ in parsed}}
        epochs = [record.epoch for *_, record, _ in parsed if not record.client_mode]
        epoch = max([self.local_progress.epoch, *epochs])
        self._saw_epoch(epoch, now)
        claims = [Claim(record.peer_id, record.epoch, record.samples_accumulated, record.samples_per_second,
                        record.time, record.client_mode) for *_, record, _ in parsed]
        checked = plausible_claims(
            claims, own, rate_ratio=excluding.policy.claim_rate_ratio, epoch=epoch,
            epoch_began=self._epoch_seen[1] if self._epoch_seen[0] == epoch else now, now=now,
            grace=max(CLAIM_GRACE_SECONDS, self.max_refresh_period),
        )
        over = [peer for (*_, peer), (_, too_many) in zip(parsed, checked) if too_many]
        for (subkey, entry, record, peer), (claim, _) in zip(parsed, checked):
            if (claim.samples, claim.rate, claim.time) != (record.samples_accumulated, record.samples_per_second,
                                                           record.time):
                record = record.copy(update=dict(samples_accumulated=claim.samples, samples_per_second=claim.rate,
                                                 time=claim.time))
                entry = ValueWithExpiration(record.dict(), entry.expiration_time)
            kept[subkey] = entry
        if over:
            excluding.report_claims(over, epoch)
        return kept

    def _parse_swarm_progress_data(self, metadata):
        metadata = self._checked_claims(metadata)
        progress = super()._parse_swarm_progress_data(metadata)
        own_id = self.dht.peer_id.to_bytes()
        records = [
            LocalTrainingProgress.parse_obj(entry.value)
            for entry in (metadata.values() if isinstance(metadata, dict) else ()) if entry.value is not None
        ]
        # A fetch that shows nobody, not even this peer's own record (which its reporter keeps fresh), failed: a DHT
        # slow under load answers None. It says nothing about who else is in the swarm, and "alone" would end a
        # catch-up or an inexact state before any state round evened it out.
        if records:
            self.other_epochs = tuple(record.epoch for record in records if record.peer_id != own_id)
        return progress

    def peers_behind(self, epoch: int) -> int:
        """How many other peers of the swarm were at an epoch below `epoch` at the last fetch (clients too: they take
        the state as well; excluded peers' records count for nothing, see _checked_claims)."""
        return sum(other < epoch for other in self.other_epochs)

    def fetch_soon(self) -> None:
        """Fetch the swarm's progress now rather than at the time upstream's estimate set (up to
        max_refresh_period away while nobody accumulates samples): the fetcher wakes up on global_state_updated,
        finds the next fetch due and fetches."""
        self.global_progress.next_fetch_time = get_dht_time()
        self.global_state_updated.set()

    def __del__(self):
        # Upstream's __init__ reads the DHT before it makes the thread, and its __del__ asserts on a thread that was
        # never made: a DHT that failed there would leave an "unraisable" AssertionError for the garbage collector
        # (SwarmOptimizer.__del__ says why those must not happen).
        if self.__dict__.get("_constructed"):
            super().__del__()

    def report_local_progress(self, local_epoch: int, samples_accumulated: int, update_global_samples: bool = True):
        # Upstream's body (progress_tracker.py l.153-168) but for its last line, which wakes the reporter every
        # time: the reporter cannot be told afterwards that a wake-up was not meant.
        extra_samples = samples_accumulated - self.local_progress.samples_accumulated
        if update_global_samples and local_epoch == self.local_progress.epoch == self.global_progress.epoch:
            self.global_progress.samples_accumulated += extra_samples
        if extra_samples > 0:
            self.performance_ema.update(task_size=extra_samples)
        else:
            self.performance_ema.reset_timer()
        urgent = local_epoch != self.local_progress.epoch or extra_samples <= 0
        self.local_progress = self._get_local_progress(local_epoch, samples_accumulated)
        self.note_contribution(local_epoch, samples_accumulated)
        self._request_publication(urgent)

    def note_contribution(self, epoch: int, samples: int) -> None:
        if samples > 0:
            self.contributed_epoch = max(self.contributed_epoch, epoch)

    def takes_part(self) -> bool:
        """Upstream's "synchronized and actively reporting samples": contributed in this or the previous epoch.
        Auxiliary peers never contribute and so never publish, as upstream."""
        return self.contributed_epoch >= self.global_epoch - 1

    async def _progress_reporter(self):
        # Upstream's loop (progress_tracker.py l.195-233) with `takes_part()` in place of its own bookkeeping of
        # the last reported epoch, which read the sample count at wake-up (see the module's docstring).
        store_task = None
        last_report_time = -float("inf")
        try:
            while not self.shutdown_triggered.is_set():
                wait_timeout = max(0.0, last_report_time - get_dht_time() + self.metadata_expiration / 2)
                await asyncio.get_event_loop().run_in_executor(None, self.should_report_progress.wait, wait_timeout)
                self.should_report_progress.clear()
                local_progress = self.local_progress
                last_report_time = get_dht_time()
                if self.takes_part():
                    store_task = asyncio.create_task(
                        asyncio.wait_for(
                            self.dht.store(
                                key=self.training_progress_key,
                                subkey=self._local_public_key,
                                value=local_progress.dict(),
                                expiration_time=last_report_time + self.metadata_expiration,
                                return_future=True,
                            ),
                            timeout=self.metadata_expiration,
                        )
                    )
        finally:
            upstream_logger.log(self.status_loglevel, f"No longer reporting progress for {self.prefix}")
            if store_task is not None:
                store_task.cancel()

    def publication_interval(self) -> float:
        """Seconds between publications of plain sample counts: a quarter of the estimated time to the epoch's
        end, within [report_interval, max_refresh_period]; 0 (every step) if report_interval is 0."""
        if self.report_interval <= 0:
            return 0.0
        time_to_epoch_end = self.global_progress.eta_next_epoch - get_dht_time()
        return min(max(self.report_interval, time_to_epoch_end / 4), max(self.report_interval, self.max_refresh_period))

    def _request_publication(self, urgent: bool) -> None:
        with self._publication_lock:
            now = time.monotonic()
            interval = self.publication_interval()
            if urgent or now - self._last_published >= interval:
                self._publish_locked(now)
                return
            self._held_back = True
            if self._flush_timer is None or not self._flush_timer.is_alive():
                # if no step follows (the worker waits on averaging), the held-back count goes out when due
                delay = self._last_published + interval - now
                self._flush_timer = threading.Timer(delay, self._flush)
                self._flush_timer.daemon = True
                self._flush_timer.start()

    def _flush(self) -> None:
        with self._publication_lock:
            if self._held_back:
                self._publish_locked(time.monotonic())

    def _publish_locked(self, now: float) -> None:
        self._last_published = now
        self._held_back = False
        self.should_report_progress.set()
