"""A progress line in the log every `logging.progress_interval` seconds: what an operator tailing the log (or
journalctl) wants to see without running `swarmd status`. The line is status/snapshot.py `progress_line`, the
same summary systemd's STATUS shows."""

from __future__ import annotations

import logging
import time

from swarmd.extension import DaemonView, Extension
from swarmd.status.snapshot import Snapshot, progress_line

__all__ = ["ProgressLogger", "progress_line"]

logger = logging.getLogger("swarmd.progress")


class ProgressLogger(Extension):
    def __init__(self, interval: float):
        self.interval = interval
        self._next = time.monotonic() + interval

    async def tick(self, view: DaemonView, snapshot: Snapshot) -> None:
        now = time.monotonic()
        if now < self._next or snapshot.local_epoch is None or snapshot.state != "training":
            return
        self._next = now + self.interval
        logger.info("%s", progress_line(snapshot))
