"""The stop says what it waits for: Ctrl-C inside a failing averaging round once waited 27 s without a word."""

import asyncio
import logging
import threading

from swarmd.daemon.runtime import Runtime
from swarmd.worker.stats import WorkerStats


class _Worker:
    """A worker thread busy in its optimizer step until the stop is asked for (then a moment more)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: (self._stop.wait(10), self._stop.wait(0.05)), daemon=True)
        self._thread.start()
        self.failure = None

    def request_stop(self):
        self._stop.set()

    def join(self, timeout):
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self):
        return self._thread.is_alive()


def test_the_stop_logs_what_it_waits_for_and_its_bound(caplog):
    clock = [100.0]
    stats = WorkerStats(clock=lambda: clock[0])
    stats.begin("optimizer step", 95.0)  # matchmaking + 3 x averaging_timeout + a download
    clock[0] += 12.0
    runtime = Runtime(task=None, model=None, optimizer=None, stats=stats, averaging_log=None, worker=_Worker())
    with caplog.at_level(logging.INFO, logger="swarmd.daemon"):
        asyncio.run(runtime.stop_training(lambda: 60.0, final_save_needed=lambda: False))
    assert not runtime.worker.alive
    [line] = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert "waiting up to 36 s for the training worker's optimizer step" in line, line
    assert "under way for 12 s" in line and "averaging" in line and "95 s" in line and "second signal" in line


def test_no_wait_is_announced_for_a_worker_that_already_ended(caplog):
    worker = _Worker()
    worker.request_stop()
    worker.join(5)
    runtime = Runtime(task=None, model=None, optimizer=None, stats=WorkerStats(), averaging_log=None, worker=worker)
    with caplog.at_level(logging.INFO, logger="swarmd.daemon"):
        asyncio.run(runtime.stop_training(lambda: 60.0, final_save_needed=lambda: False))
    assert not [r for r in caplog.records if "waiting up to" in r.getMessage()]
