"""A progress line in the log every `logging.progress_interval` seconds: what an operator tailing the log (or
journalctl) wants to see without running `swarmd status`."""

from __future__ import annotations

import logging
import time
from typing import Any

from swarmd.daemon.extensions import DaemonExtension

__all__ = ["ProgressLogger", "progress_line"]

logger = logging.getLogger("swarmd.progress")


def progress_line(snapshot: dict[str, Any]) -> str:
    parts = [f"epoch {snapshot['local_epoch']}"]
    if snapshot.get("global_epoch") is not None and snapshot["global_epoch"] != snapshot["local_epoch"]:
        parts[0] += f" (swarm {snapshot['global_epoch']})"
    peers = snapshot.get("num_peers")
    parts.append(f"{peers} peer{'s' if peers != 1 else ''}")
    parts.append(f"{snapshot.get('samples_per_second') or 0:.0f} samples/s")
    if snapshot.get("loss") is not None:
        parts.append(f"loss {snapshot['loss']:.4g}")
    last = snapshot.get("last_averaging")
    if last:
        parts.append(f"last round: {last['kind']} {last['outcome']} with {last['group_size']}")
    return ", ".join(parts)


class ProgressLogger(DaemonExtension):
    def __init__(self, interval: float):
        self.interval = interval
        self._next = time.monotonic() + interval

    async def tick(self, daemon, snapshot: dict[str, Any]) -> None:
        now = time.monotonic()
        if now < self._next or snapshot.get("local_epoch") is None or snapshot.get("state") != "training":
            return
        self._next = now + self.interval
        logger.info("%s", progress_line(snapshot))
