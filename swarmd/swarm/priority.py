"""Run hivemind's processes (the DHT with its p2pd, the averagers) at a lower CPU priority than the training.

Why: on a CPU peer they share the cores the training step needs. Between rounds the DHT process, p2pd and the
averagers' loops take 0.18-0.25 of a core (docs/PERFORMANCE.md), and every time one of them runs on a core that
an OpenMP team of the training step is using, the whole step waits at the next barrier for that one thread. At a
lower priority the kernel runs the training first and gives them the gaps; during an averaging round the trainer
waits on the round anyway, so the round still gets the cores it needs.

  normal  the same priority as the training (hivemind's behaviour)
  nice    nice 10: still runs when it is due, but yields the core to the training at once. Two peers on a core
          each went from 0.67 to 0.73 of solo with no failed round; but where more peers than cores share a box
          (the test suite) DHT answers came late enough to miss an 18 s bound. Opt-in, not the default yet
          (docs/PERFORMANCE.md section 10).
  idle    SCHED_IDLE: runs only on a core that nothing else wants. On a CPU peer whose cores the training
          keeps busy the DHT starves: two such peers never saw each other in 300 s. For GPU peers only.

Linux keeps nice and the scheduling policy per thread, and fork and exec inherit both. A forked child has one
thread, so lowering that thread at fork time covers every thread and process it starts later (the DHT process
starts p2pd). Only the processes forked inside `background_priority(...)` are lowered: compute ranks and data
loader workers, forked later, keep the training's priority.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Literal

__all__ = ["BackgroundPriority", "BACKGROUND_PRIORITIES", "NICE_LEVEL", "background_priority", "lower_this_thread"]

BackgroundPriority = Literal["normal", "nice", "idle"]
BACKGROUND_PRIORITIES = ("normal", "nice", "idle")
NICE_LEVEL = 10

_for_children: str = "normal"  # what a process forked now gets; forked children inherit the value
_hook_installed = False


def lower_this_thread(priority: str) -> None:
    """Lower the calling thread (and so whatever it starts later) to `priority`; never raises it back."""
    if priority == "nice":
        current = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread
        os.setpriority(os.PRIO_PROCESS, 0, max(current, NICE_LEVEL))  # absolute: a grandchild does not stack it
    elif priority == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif priority != "normal":
        raise ValueError(f"unknown background priority {priority!r}; use one of {', '.join(BACKGROUND_PRIORITIES)}")


@contextlib.contextmanager
def background_priority(priority: str) -> Iterator[None]:
    """Every process forked (by any thread) while inside runs at `priority`."""
    global _for_children, _hook_installed
    if priority not in BACKGROUND_PRIORITIES:
        raise ValueError(f"unknown background priority {priority!r}; use one of {', '.join(BACKGROUND_PRIORITIES)}")
    if not _hook_installed:
        os.register_at_fork(after_in_child=_lower_forked_child)
        _hook_installed = True
    previous, _for_children = _for_children, priority
    try:
        yield
    finally:
        _for_children = previous


def _lower_forked_child() -> None:
    try:
        lower_this_thread(_for_children)
    except OSError:  # a container may forbid SCHED_IDLE; the child then runs at the training's priority
        pass
