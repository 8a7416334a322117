"""hivemind's ProgressTracker, publishing this peer's progress at a bounded rate instead of after every step.

Upstream wakes its reporter on every `report_local_progress`, i.e. after every training step, and each wake-up is
a signed DHT store (an RSA signature, a round trip to the DHT process, and a store RPC to each nearby peer that
verifies it). At the micro task's ~15 steps/s that is work on the cores the training needs (docs/PERFORMANCE.md).
Other peers only poll the progress key every `min_refresh_period` (0.5 s by default) and extrapolate between polls
from each peer's samples/s, so publishing more often than that buys them nothing.

This subclass publishes at once whatever changes the swarm's bookkeeping (a new epoch, a reset of the
accumulated samples) and coalesces plain sample counts to at most one publication per `report_interval`. The
newest count is never lost: a count held back is published by the next step after the interval or, when no
step follows (the worker waits on averaging), by a timer when the interval is up.
Set the interval with `swarm.tracker_opts: {report_interval: SECONDS}`; 0 publishes after every step as upstream.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from hivemind.optim.progress_tracker import ProgressTracker

__all__ = ["ThrottledProgressTracker"]


class ThrottledProgressTracker(ProgressTracker):
    def __init__(self, *args, report_interval: float = 0.5, **kwargs):
        # set before super().__init__, which starts the reporter thread
        self.report_interval = report_interval
        self._publication_lock = threading.Lock()
        self._last_published = -float("inf")
        self._held_back = False
        self._flush_timer: Optional[threading.Timer] = None
        super().__init__(*args, **kwargs)

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
        self._request_publication(urgent)

    def _request_publication(self, urgent: bool) -> None:
        with self._publication_lock:
            now = time.monotonic()
            if urgent or now - self._last_published >= self.report_interval:
                self._publish_locked(now)
                return
            self._held_back = True
            if self._flush_timer is None or not self._flush_timer.is_alive():
                # if no step follows (the worker waits on averaging), the held-back count goes out when due
                delay = self._last_published + self.report_interval - now
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
