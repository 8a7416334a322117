"""Run under systemd (Type=notify): readiness, a status line, a watchdog that tracks training progress, stopping.

- READY=1 (with MAINPID) once the DHT is up, the optimizer is built and the worker started (the `ready` hook);
- STATUS=<one line> on every tick: phase, epoch, peers, samples/s, loss; `systemctl status` shows it;
- WATCHDOG=1 every half of $WATCHDOG_USEC, but only while the training worker makes progress or waits
  legitimately: its current activity (worker/stats.py `begin`) is within its allowance, which is the budget
  the worker derived from the config (averaging_timeout, load_state_timeout, ...) plus one ping interval. The
  worker's own work (a batch, forward, backward) has no budget: it must show progress within one interval, so
  systemd fires between 1 and 1.5 WatchdogSec after such work stops progressing. A blocked event loop stops the
  pings too;
- STOPPING=1 when the graceful stop begins, with EXTEND_TIMEOUT_USEC covering daemon.shutdown_timeout, so a
  shutdown_timeout raised in the config is not cut short by the unit's TimeoutStopSec.

`swarmd join` enables faulthandler (cli/join.py): the SIGABRT systemd sends on a watchdog timeout first prints
every thread's stack to the journal, which shows where training hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any, Optional

from swarmd.extension import DaemonView, Extension
from swarmd.daemon.sdnotify import Notifier, WatchdogSettings, watchdog_settings
from swarmd.status.snapshot import WatchdogInfo, progress_line

__all__ = ["SystemdNotifier", "systemd_notifier", "status_line", "progress_check", "STOP_MARGIN_SECONDS"]

logger = logging.getLogger("swarmd.systemd")

STOP_MARGIN_SECONDS = 30.0  # beyond daemon.shutdown_timeout: killing leftovers, closing sockets, exiting
_ENVIRONMENT = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_STARTING_LINES = {"starting": "starting: preparing the task and model", "joining": "joining the swarm"}


def systemd_notifier(*, shutdown_timeout: float) -> Optional["SystemdNotifier"]:
    """The extension when systemd started us with a notification socket ($NOTIFY_SOCKET), else None."""
    notifier = Notifier.from_environment()
    if notifier is None:
        return None
    return SystemdNotifier(notifier, watchdog_settings(), shutdown_timeout=shutdown_timeout)


class SystemdNotifier(Extension):
    def __init__(self, notifier: Notifier, watchdog: Optional[WatchdogSettings], *, shutdown_timeout: float):
        self.notifier = notifier
        self.watchdog = watchdog
        self.shutdown_timeout = shutdown_timeout
        self._view: Optional[DaemonView] = None
        self._tasks: list[asyncio.Task] = []
        self._ready = False
        self._stalled_since_ping = False

    async def start(self, view: DaemonView) -> None:
        self._view = view
        # hivemind's processes inherit the environment; these are meant for this process only (sd_notify(3)).
        for name in _ENVIRONMENT:
            os.environ.pop(name, None)
        if self.watchdog is not None:
            logger.info(
                "systemd's watchdog expects a sign of life every %g s; pinging every %g s while training progresses",
                self.watchdog.timeout,
                self.watchdog.interval,
            )
        self._tasks.append(asyncio.get_running_loop().create_task(self._report_startup(view, interval=1.0)))

    def ready(self, view: DaemonView) -> None:
        self._ready = True
        self.notifier.send("READY=1", f"MAINPID={os.getpid()}", "STATUS=" + status_line(view.snapshot()))
        if self.watchdog is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._feed_watchdog(view)))

    async def tick(self, view: DaemonView, snapshot) -> None:
        line = status_line(snapshot)
        check = self._check(view)
        if check is not None and not check[0]:
            line = f"stalled ({check[1]}); {line}"
        self.notifier.send("STATUS=" + line)

    def snapshot_fields(self) -> dict[str, Any]:
        activity = self._view.worker_activity() if self._view is not None else None
        if self.watchdog is None or activity is None:
            return {}
        name, seconds, budget = activity
        allowance = _allowance(budget, self.watchdog.interval)
        return {
            "watchdog": WatchdogInfo(
                timeout_seconds=self.watchdog.timeout,
                activity=name,
                activity_seconds=round(seconds, 3),
                allowance_seconds=round(allowance, 3),
                progressing=seconds <= allowance,
            )
        }

    def stopping(self, view: DaemonView) -> None:
        for task in self._tasks:
            task.cancel()
        extend = int((self.shutdown_timeout + STOP_MARGIN_SECONDS) * 1e6)
        self.notifier.send("STOPPING=1", f"EXTEND_TIMEOUT_USEC={extend}", "STATUS=stopping (saving, saying goodbye)")

    async def close(self) -> None:
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.notifier.close()

    # --- background ----------------------------------------------------------------------------------------

    async def _report_startup(self, view: DaemonView, interval: float) -> None:
        """Until ready: what the start is doing, for `systemctl status` during a long start."""
        last = None
        while not self._ready:
            state = view.snapshot().state
            line = _STARTING_LINES.get(state, state)
            if line != last:
                self.notifier.send("STATUS=" + line)
                last = line
            await asyncio.sleep(interval)

    async def _feed_watchdog(self, view: DaemonView) -> None:
        while True:
            check = self._check(view)
            if check is None or check[0]:
                if self._stalled_since_ping:
                    logger.info("The training worker is progressing again; feeding systemd's watchdog")
                    self._stalled_since_ping = False
                self.notifier.send("WATCHDOG=1")
            elif not self._stalled_since_ping:
                self._stalled_since_ping = True
                logger.warning(
                    "The training worker has stopped progressing (%s): no longer feeding systemd's watchdog, "
                    "which restarts swarmd within %g s unless it recovers",
                    check[1],
                    self.watchdog.timeout,
                )
            await asyncio.sleep(self.watchdog.interval)

    def _check(self, view: DaemonView) -> Optional[tuple[bool, str]]:
        activity = view.worker_activity()
        if self.watchdog is None or activity is None:
            return None
        return progress_check(activity, self.watchdog.interval)


def progress_check(activity: tuple[str, float, Optional[float]], interval: float) -> tuple[bool, str]:
    """(whether the worker's current activity is within its allowance, a description of it)."""
    name, seconds, budget = activity
    allowance = _allowance(budget, interval)
    return seconds <= allowance, f"{name} for {seconds:.1f} s, allowed {allowance:.1f} s"


def _allowance(budget: Optional[float], interval: float) -> float:
    """How long an activity may go on: its budget (none for the worker's own work) plus one ping interval."""
    return (budget or 0.0) + interval


def status_line(snapshot) -> str:
    """One line for `systemctl status`: phase: epoch (swarm's epoch), peers, samples/s, loss, last round."""
    return progress_line(snapshot, with_phase=True)
