"""Calls the daemon makes that must not stop it: an extension's hook (a failing observer is logged and skipped)
and a step of the shutdown (within what is left of daemon.shutdown_timeout, whatever the step does)."""

from __future__ import annotations

import asyncio
import logging

__all__ = ["bounded", "guarded"]

logger = logging.getLogger("swarmd.daemon")


def guarded(hook, *args):
    """Call an extension hook; a failing observer is logged and skipped, never fatal."""
    try:
        return hook(*args)
    except Exception:  # noqa: BLE001
        logger.exception("%s failed", getattr(hook, "__qualname__", hook))
        return None


async def bounded(what: str, function, remaining) -> None:
    timeout = remaining()
    if timeout <= 0:
        logger.warning("No time left for %s", what)
        return
    try:
        await asyncio.wait_for(asyncio.to_thread(function), timeout)
    except asyncio.TimeoutError:
        logger.warning("Gave up %s after %.0f s", what, timeout)
    except Exception as e:  # noqa: BLE001 - shutdown goes on whatever one step does
        logger.warning("Error while %s: %r", what, e)
