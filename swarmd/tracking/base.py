"""The tracking interface and the fan-out that keeps every backend off the training hot path.

A backend (TensorBoard, Weights & Biases) is a `BaseLogger`: `open()` does its side effects (files, processes,
network), `log()` records one set of scalars at one step, `close()` flushes. `BaseLogger` itself does nothing,
which is what a peer without tracking gets.

`LoggerFanout` is what the daemon talks to: `log()` only puts the record on a bounded queue, and one thread of
its own opens the backends and feeds them, so a slow disk, a wandb upload or a backend stuck in its own retries
never delays the event loop or the worker. A backend that raises is closed and dropped for the rest of the run
with one warning naming it and its error; the others go on, and so does training. No torch import.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Mapping, Optional, Sequence

__all__ = ["AXES", "BaseLogger", "LoggerFanout"]

logger = logging.getLogger("swarmd.tracking")

AXES = ("epoch", "local_step")
"""What a record's step counts: this peer's epoch (global steps it took part in), or its local training steps."""


class BaseLogger:
    """A tracking backend that records nothing (tracking off); real backends override what they need."""

    name = "none"

    def open(self) -> None:
        """Create files, start processes, connect: called once, on the fan-out's thread."""

    def log(self, scalars: Mapping[str, float], step: int, axis: str = "epoch") -> None:
        """Record `scalars` at `step` of `axis` (one of AXES)."""

    def close(self) -> None:
        """Flush and release what open() took."""


_CLOSE = object()  # the queue's last item


class LoggerFanout:
    """Feeds every backend from one thread through a bounded queue; drops a backend that fails.

    Counters (read by the status and metrics, from any thread):
      failures_total  backends dropped because they raised
      dropped_total   records thrown away because the queue was full (the backends could not keep up)
    """

    def __init__(self, backends: Sequence[BaseLogger], *, queue_size: int = 1000):
        self._backends = list(backends)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self.failures_total = 0
        self.dropped_total = 0
        self.failed: list[str] = []  # "name: error" of every dropped backend

    @property
    def active(self) -> list[str]:
        with self._lock:
            return [backend.name for backend in self._backends]

    def start(self) -> None:
        if self._thread is None and self._backends:
            self._thread = threading.Thread(target=self._run, name="swarmd-tracking", daemon=True)
            self._thread.start()

    def log(self, scalars: Mapping[str, float], step: int, axis: str = "epoch") -> None:
        """Never blocks: a full queue drops the record (and says so once)."""
        if self._thread is None or not scalars:
            return
        try:
            self._queue.put_nowait((dict(scalars), int(step), axis))
        except queue.Full:
            self.dropped_total += 1
            if self.dropped_total == 1:
                logger.warning(
                    "Tracking cannot keep up (%s): records are dropped until it catches up", ", ".join(self.active)
                )

    def close(self, timeout: float) -> bool:
        """Log what is queued, close every backend; False if that took longer than `timeout` seconds."""
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        deadline = time.monotonic() + timeout
        while True:  # the sentinel must get in even when the queue is full of records
            try:
                self._queue.put(_CLOSE, timeout=max(0.01, deadline - time.monotonic()))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    break
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.warning("Tracking did not finish within %.0f s (%s); some records may be lost", timeout, self.active)
            return False
        return True

    # --- the fan-out thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        for backend in list(self._backends):
            self._call(backend, backend.open)
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                break
            scalars, step, axis = item
            for backend in list(self._backends):
                self._call(backend, backend.log, scalars, step, axis)
        for backend in list(self._backends):
            self._call(backend, backend.close)

    def _call(self, backend: BaseLogger, method, *args) -> None:
        try:
            method(*args)
        # BaseException too: a library may raise KeyboardInterrupt from a prompt it should not have shown, and an
        # exception that ended this thread would leave the backends unclosed and the records silently piling up.
        except BaseException as e:  # noqa: BLE001 - a tracking backend must never stop training
            self._drop(backend, e, close=method != backend.close)

    def _drop(self, backend: BaseLogger, error: BaseException, *, close: bool) -> None:
        with self._lock:
            if backend not in self._backends:
                return
            self._backends.remove(backend)
            self.failures_total += 1
            self.failed.append(f"{backend.name}: {error!r}"[:300])
        logger.warning(
            "Tracking backend %s failed (%r); it is off for the rest of this run, training goes on", backend.name, error
        )
        if not close:
            return
        try:
            backend.close()
        except BaseException:  # noqa: BLE001 - already broken; its error was reported above
            logger.debug("closing the failed %s backend raised too", backend.name, exc_info=True)
