"""Where a start-up that stands is standing: its threads' stacks in the log.

A warm start reaches the swarm's state in 6-12 s here (docs/PERFORMANCE.md section 5), but one join of the benchmark
stood 33 s between answering on its status socket and the end of its imports, with nothing in its log, and was not
seen again (issue 37). An operator whose peer stands at start-up has the same question: where is it? `StartupWatch`
runs beside the start-up (until the worker starts, the download excepted: that is the worker's and the network's)
and, each time it has run `first` seconds, then twice that, and so on, logs one line with the phases timed so far
and the innermost frames of every thread of this process (the loop's, the model's pool, the preload). At INFO, not
WARNING: a start-up can be slow and well (a large model built on a CPU, a dataset indexed, a bootstrap retried), and
the line is there to say where, not that something is wrong. Nothing is logged by a start-up that ends in time; the
watch never touches what it watches.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Callable, Optional

__all__ = ["StartupWatch", "thread_stacks"]

logger = logging.getLogger("swarmd.daemon")

FIRST_WARNING_SECONDS = 30.0  # a warm start-up here takes 5-9 s to the worker: several times that is a stand
FRAMES_PER_THREAD = 6


def thread_stacks(frames: int = FRAMES_PER_THREAD, skip: Optional[int] = None) -> list[str]:
    """One line per thread of this process (but the thread `skip`): its name and its innermost `frames` frames,
    innermost last, as "file:line function"."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        stack = traceback.extract_stack(frame)[-frames:]
        where = " <- ".join(f"{_short(entry.filename)}:{entry.lineno} {entry.name}" for entry in reversed(stack))
        lines.append(f"{names.get(ident, ident)}: {where}")
    return lines


def _short(path: str) -> str:
    """A frame's file from its package on (".../site-packages/torch/_dynamo/x.py" -> "torch/_dynamo/x.py")."""
    for marker in ("site-packages/", "swarmd/"):
        if marker in path:
            return (marker if marker == "swarmd/" else "") + path.rsplit(marker, 1)[1]
    return path


class StartupWatch:
    """`with StartupWatch(describe):` around the start-up; `describe()` says what is done so far (the join phases)."""

    def __init__(self, describe: Callable[[], str], first: float = FIRST_WARNING_SECONDS):
        self.describe = describe
        self.first = first
        self.reports = 0
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._began = 0.0

    def __enter__(self) -> "StartupWatch":
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="swarmd-startup-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        wait = self.first
        while not self._done.wait(max(0.0, self._began + wait - time.monotonic())):
            self.reports += 1
            stacks = "; ".join(thread_stacks(skip=threading.get_ident()))
            logger.info("Start-up has taken %.1f s so far (%s); where its threads are: %s",
                        time.monotonic() - self._began, self.describe(), stacks)
            wait *= 2
