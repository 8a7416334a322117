"""What the start-up runs at once, and the rule that keeps its forks safe (issue 37: a join spent 16 s before it
asked for the swarm's state, one phase after another).

- The model needs nothing of the swarm, and the DHT (with its reachability probe) nothing of the model: they run at
  once (`together`), the model on a pool thread while the probe waits on the network.
- torch imports `torch._dynamo` (with sympy, torch.fx's symbolic shapes and FSDP: about a thousand modules) lazily,
  at the first torch.optim.Optimizer built (`torch._disable_dynamo` on its methods): the state averager's, in
  hivemind.Optimizer's constructor. That was 2.5-8 s of "DHT up -> optimizer built" on a 2-core machine. `Preload`
  imports it on a thread of its own while the DHT bootstraps. Every optimizer step imports it anyway.
- A process forked while another thread is inside an import inherits that module's lock, held by a thread that no
  longer exists there, and hangs if it imports the module too; a lock of torch's held at a fork stays held likewise.
  So `ForkGate` forks the DHT's process once the model is built and no preload runs, starts the preload right after,
  and the averagers' processes are forked once it is done.
- The daemon's stop waits for it too (`Preload.join`, bounded): a process that exits while the thread is inside an
  import is finalized under it, and a thread inside C++ (torch's, scipy's) that is unwound then aborts the process
  ("FATAL: exception not rethrown", exit -6 instead of the exit code). Seen in CI on a peer stopped with exit code 2
  right after its DHT came up, the preload's imports still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
import time
from typing import Awaitable, Optional, TypeVar

__all__ = ["PRELOADED_MODULES", "Preload", "ForkGate", "together"]

logger = logging.getLogger(__name__)

PRELOADED_MODULES = ("torch._dynamo",)
T = TypeVar("T")


async def together(*coroutines):
    """Their results, run at once; the first to fail cancels the others, waits for them to wind up (a DHT being
    started is stopped) and is raised."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((task for task in tasks if task.done() and not task.cancelled() and task.exception()), None)
        if failed is not None:
            raise failed.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Preload:
    """`start()` imports `modules` on a thread of its own (once); `await wait()` until it is done (at once when it
    never started). A module that fails to import is left to fail again where it is really used."""

    def __init__(self, modules: tuple[str, ...] = PRELOADED_MODULES):
        self.modules = modules
        self.seconds: Optional[float] = None  # how long the imports took, once done
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="swarmd-preload", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def wait(self) -> None:
        if self.running:
            await asyncio.to_thread(self.join)

    def join(self, timeout: Optional[float] = None) -> None:
        """Block until the imports are done (at once when they never started), at most `timeout` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        started = time.monotonic()
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 - only a head start: the real import raises it where it matters
                logger.debug("Could not preload %s: %r", name, e)
        self.seconds = time.monotonic() - started
        logger.debug("Preloaded %s in %.1f s", ", ".join(self.modules), self.seconds)


class ForkGate:
    """The start-up's forks, each while no other thread of this process runs (see the module docstring); the
    model's and the DHT's phases timed into `phases` (daemon/join_phases.py), the DHT's without its wait here."""

    def __init__(self, phases, preload: Optional[Preload] = None):
        self.phases = phases
        self.preload = preload if preload is not None else Preload()
        self._model_built = asyncio.Event()

    async def model(self, building: Awaitable[T]) -> T:
        """The model's build (a coroutine that runs its work on pool threads), timed; the DHT's fork waits for it."""
        with self.phases.timing("model"):
            result = await building
        self._model_built.set()
        return result

    @contextlib.asynccontextmanager
    async def dht_fork(self):
        """Around each fork of the DHT's process (a bootstrap retry forks again)."""
        began = time.monotonic()
        await self._model_built.wait()
        await self.preload.wait()
        self.phases.add("DHT", -(time.monotonic() - began))  # the DHT's phase does not count this wait
        yield
        self.preload.start()

    async def before_averagers(self) -> None:
        """Before hivemind.Optimizer is built: its averagers' processes are forked."""
        await self.preload.wait()
