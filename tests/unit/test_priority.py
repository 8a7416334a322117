"""hivemind's processes run at the background priority: forked children inside `background_priority`, the
threads they start and the programs they exec (as the DHT process execs p2pd); nothing forked outside it."""

import multiprocessing
import os
import subprocess
import threading

import pytest

from swarmd.swarm.priority import NICE_LEVEL, background_priority


def _nice_and_policy(stat: str) -> tuple[int, int]:
    """/proc/PID/stat -> (nice, scheduling policy): fields 19 and 41, counted after the command name."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[16]), int(fields[38])


def _report(queue) -> None:
    """In the forked child: its own priority, a new thread's, and an exec'd program's."""
    seen = {"main": (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))}

    def in_thread():
        seen["thread"] = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    stat = subprocess.run(["cat", "/proc/self/stat"], capture_output=True, text=True, check=True).stdout
    seen["exec"] = _nice_and_policy(stat)
    queue.put(seen)


def _forked_child_sees() -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_report, args=(queue,))
    child.start()
    seen = queue.get(timeout=60)
    child.join(30)
    return seen


@pytest.mark.parametrize(
    "priority, expected",
    [("normal", (0, os.SCHED_OTHER)), ("nice", (NICE_LEVEL, os.SCHED_OTHER)), ("idle", (0, os.SCHED_IDLE))],
)
def test_children_forked_inside_run_at_the_priority_and_pass_it_on(priority, expected):
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0, "the test process itself must run at nice 0"
    with background_priority(priority):
        seen = _forked_child_sees()
    assert seen == {"main": expected, "thread": expected, "exec": expected}
    # The parent keeps its priority, and a child forked afterwards (a compute rank, a data loader) the parent's.
    assert (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)) == (0, os.SCHED_OTHER)
    assert _forked_child_sees()["main"] == (0, os.SCHED_OTHER)


def test_a_grandchild_is_not_lowered_twice():
    def grandchild_nice(queue):
        with background_priority("nice"):  # the DHT process forks again inside hivemind
            queue.put(_forked_child_sees()["main"][0])

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with background_priority("nice"):
        child = context.Process(target=grandchild_nice, args=(queue,))
        child.start()
    assert queue.get(timeout=60) == NICE_LEVEL
    child.join(30)


def test_an_unknown_priority_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="normal, nice, idle"):
        with background_priority("low"):
            pass
