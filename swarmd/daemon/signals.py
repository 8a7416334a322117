"""SIGTERM/SIGINT for the daemon: the first asks for a graceful stop, a second forces the exit. SIGHUP: read the
settings that can change while running again (`ReloadSignal`; without a handler SIGHUP would kill the daemon).

The handlers only set a flag on the event loop (uvicorn's pattern); the forced exit kills every child process
first, so no p2pd or averager outlives us.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Callable, Optional

from swarmd.errors import ExitCode

__all__ = ["StopSignals", "ReloadSignal"]

logger = logging.getLogger("swarmd.daemon")
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self, socket_path: Callable[[], Optional[Path]]):
        self.requested = asyncio.Event()
        self._socket_path = socket_path  # removed on a forced exit, which skips the normal clean-up
        self._received = 0

    def install(self) -> None:
        """(Again after building hivemind.Optimizer: its averagers reset SIGINT.)"""
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def restore(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self._received += 1
        if self._received == 1:
            logger.info("Received %s: stopping gracefully (send it again to force)", signal.Signals(sig).name)
            self.requested.set()
            return
        from swarmd.swarm.children import kill_descendants

        logger.error("Received %s again: forcing exit", signal.Signals(sig).name)
        kill_descendants()
        path = self._socket_path()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        os._exit(int(ExitCode.FAILURE))


class ReloadSignal:
    """SIGHUP calls `on_reload` on the event loop (never inside the signal handler itself)."""

    def __init__(self, on_reload: Callable[[], None]):
        self._on_reload = on_reload

    def install(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_signal)

    def restore(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def _on_signal(self) -> None:
        logger.info("Received SIGHUP: reading network.allowed_peers again")
        self._on_reload()
