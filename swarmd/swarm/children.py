"""Make every process hivemind starts die with the daemon, even when the daemon is SIGKILLed.

hivemind forks a DHT process (which spawns p2pd) and one process per averager. If the daemon is killed hard,
they are orphaned and keep the port, the identity and a CPU core busy. Linux can deliver a signal to a child
when its parent dies (prctl PR_SET_PDEATHSIG); we set it in every forked child through an at-fork hook, and in
p2pd through the subprocess call that starts it (an exec'd binary does not run Python at-fork hooks).

Forked children also move to their own process group, so a Ctrl-C in the terminal reaches only the daemon,
which then shuts them down in order (otherwise p2pd would die first and the goodbye to peers would fail).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import signal
import sys

__all__ = [
    "tie_children_to_this_process", "die_with_parent", "descendant_pids", "kill_descendants", "kill_leftovers",
    "process_name", "SHM_MANAGER",
]

_PR_SET_PDEATHSIG = 1
_installed = False
_forking_pid = os.getpid()  # set again just before each fork; a forked child reads its parent's value


def _set_parent_death_signal(expected_parent: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """In a child (e.g. a subprocess's preexec_fn): get SIGKILL when `parent_pid` dies, exit now if it already did.

    Linux sends the signal when the parent THREAD that forked ends: fork from a thread that lives as long as the
    process (the main thread), not from a pool thread."""
    _set_parent_death_signal(parent_pid)


def _after_fork_in_child(parent_pid: int) -> None:
    _set_parent_death_signal(parent_pid)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    # The daemon's event loop handles SIGTERM through a wakeup fd that a fork shares: a signal to a child
    # would be read by the daemon as its own. Children get the default SIGTERM and no wakeup fd.
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread of the child: nothing was inherited there
        pass


def tie_children_to_this_process() -> None:
    """Install the hooks (idempotent). Call once in the daemon, before the DHT and averagers start."""
    global _installed
    if _installed:
        return
    _installed = True
    os.register_at_fork(before=_remember_forking_pid, after_in_child=lambda: _after_fork_in_child(_forking_pid))
    _patch_p2pd_spawn()


def _remember_forking_pid() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _patch_p2pd_spawn() -> None:
    """hivemind starts p2pd with asyncio.create_subprocess_exec; add a preexec_fn that ties it to its parent."""
    original = asyncio.subprocess.create_subprocess_exec
    if getattr(original, "_swarmd_ties_children", False):
        return

    @functools.wraps(original)
    async def create_subprocess_exec(program, *args, **kwargs):
        if os.path.basename(str(program)) == "p2pd" and "preexec_fn" not in kwargs:
            kwargs["preexec_fn"] = functools.partial(_set_parent_death_signal, os.getpid())
        return await original(program, *args, **kwargs)

    create_subprocess_exec._swarmd_ties_children = True
    asyncio.subprocess.create_subprocess_exec = create_subprocess_exec


def descendant_pids(root: int | None = None) -> list[int]:
    """PIDs of all live descendants of `root` (default: this process), read from /proc."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


# torch's shared-memory manager (hivemind shares tensors with torch's "file_system" strategy: files in /dev/shm).
# It unlinks those files once every process it serves has gone, and then exits; killed, it leaves them behind:
# one graceful stop of a 20M-parameter peer left ~300 files, and a day of them filled the 24 GiB box's /dev/shm
# until the OOM killer struck (docs/FAULTS.md). So it is the one child left to end on its own.
SHM_MANAGER = "torch_shm_manag"  # /proc/PID/comm keeps 15 characters of "torch_shm_manager"


def kill_descendants(sig: int = signal.SIGKILL) -> int:
    """Signal every descendant of this process but torch's shared-memory manager; return how many were signalled."""
    count = 0
    for pid in descendant_pids():
        if process_name(pid) == SHM_MANAGER:
            continue
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            pass
    return count


def kill_leftovers() -> None:
    """At the end of a shutdown: kill (and name, in the log) whatever child process is still alive (but torch's
    shared-memory manager, which cleans up and exits after this process)."""
    leftovers = [pid for pid in descendant_pids() if process_name(pid) != SHM_MANAGER]
    if leftovers:
        logging.getLogger("swarmd.daemon").info(
            "Killing %d leftover child process(es): %s", len(leftovers), _describe_pids(leftovers)
        )
        kill_descendants()


def process_name(pid: int) -> str:
    """The process's name (/proc/PID/comm, 15 characters at most), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _describe_pids(pids: list[int]) -> str:
    names = [(process_name(pid), pid) for pid in pids]  # each read once: a process may end between two reads
    return ", ".join(f"{name}[{pid}]" if name else str(pid) for name, pid in names)
