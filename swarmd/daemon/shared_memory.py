"""Shared memory that a killed peer left behind, removed at the next start of the same state dir.

hivemind shares tensors between the daemon and its averager processes with torch's `file_system` strategy: files
`/dev/shm/torch_<pid>_<n>_<n>` named after the process that made them, which torch's manager process
(`torch_shm_manager`) removes once every process it serves has gone. A clean stop leaves none. A kill of the whole
process tree at once - systemd's final SIGKILL of the unit, the OOM killer on the group, `kill -9` of a process
group - kills the manager too, and its files stay: a day of such endings filled 331 MB with 10,884 files.

So each start writes this peer's process ids to the state dir (PROCESSES_FILE: the daemon's, then hivemind's
children once they run), and the next start of the same state dir - the lock says no other daemon uses it -
removes the files of those processes that are gone. Files of live processes, and of processes this state dir never
recorded, are never touched.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

__all__ = ["PROCESSES_FILE", "record_processes", "remove_leftovers"]

logger = logging.getLogger("swarmd.daemon")

PROCESSES_FILE = "processes.pids"
SHM_DIR = Path("/dev/shm")


def record_processes(state_dir: Path, pids: Iterable[int]) -> None:
    """Write the ids of this peer's processes (all of them so far), aside then renamed into place."""
    path = Path(state_dir) / PROCESSES_FILE
    aside = path.with_name(path.name + ".tmp")
    aside.write_text("".join(f"{pid}\n" for pid in sorted(set(pids))), encoding="ascii")
    os.replace(aside, path)


def remove_leftovers(state_dir: Path, shm_dir: Path = SHM_DIR) -> tuple[int, int]:
    """Remove torch's shared-memory files of the processes the previous start recorded that are gone; returns
    (files, bytes) removed. Call with the state dir's lock held."""
    pids = _recorded(Path(state_dir) / PROCESSES_FILE)
    files = removed_bytes = 0
    for pid in sorted(pid for pid in pids if not _alive(pid)):
        for path in shm_dir.glob(f"torch_{pid}_*"):
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                continue  # gone meanwhile, or not ours to remove
            files += 1
            removed_bytes += size
    if files:
        logger.info("Removed %d shared-memory file(s) (%.1f MB) left in %s by this peer's previous processes "
                    "(a kill of its whole process tree)", files, removed_bytes / 1e6, shm_dir)
    return files, removed_bytes


def _recorded(path: Path) -> set[int]:
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return set()
    return {int(line) for line in text.split() if line.isdigit() and int(line) > 1}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped by its new parent, maps no memory: gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process now holds the id: not ours to judge
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]  # the state follows the command's closing parenthesis
