"""The running daemon as its extensions see it: swarmd/extension.py's DaemonView, and nothing more of it."""

from __future__ import annotations

from typing import Any, Optional

from swarmd.extension import WorkerActivity

__all__ = ["LiveView"]


class LiveView:
    def __init__(self, daemon: Any):  # daemon/lifecycle.py Daemon (not imported: it imports this module)
        self._daemon = daemon

    @property
    def config(self):
        return self._daemon.config

    @property
    def dht(self):
        return self._daemon.dht

    def snapshot(self):
        return self._daemon.snapshot

    def worker_activity(self) -> Optional[WorkerActivity]:
        runtime = self._daemon.runtime
        return runtime.stats.activity() if runtime is not None else None

    def retune(self, changes: dict) -> None:
        from swarmd.daemon.retune import retune

        self._daemon.config = retune(self._daemon.runtime, self._daemon.config, changes)
