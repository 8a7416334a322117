"""torch's shared-memory files that a killed peer left behind are removed at the next start of its state dir
(daemon/shared_memory.py): those of its own recorded processes that are gone, never a live process's nor
another's."""

import os
import subprocess

from swarmd.daemon.shared_memory import PROCESSES_FILE, record_processes, remove_leftovers


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_the_files_of_this_peers_dead_processes_are_removed_and_nothing_else(tmp_path):
    shm, state = tmp_path / "shm", tmp_path / "state"
    shm.mkdir()
    state.mkdir()
    dead, other_dead, live = _dead_pid(), _dead_pid(), os.getpid()
    record_processes(state, [dead, live])
    names = [f"torch_{dead}_1_2", f"torch_{dead}_3_4", f"torch_{live}_1_2", f"torch_{other_dead}_1_2",
             f"torch_{dead}0_1_2", "someone-elses-file"]
    for name in names:
        (shm / name).write_bytes(b"x" * 1000)

    assert remove_leftovers(state, shm) == (2, 2000)
    assert sorted(path.name for path in shm.iterdir()) == sorted(names[2:])
    assert remove_leftovers(state, shm) == (0, 0)  # nothing left to remove


def test_no_record_or_a_garbled_one_removes_nothing(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / f"torch_{_dead_pid()}_1_2").write_bytes(b"x")
    assert remove_leftovers(tmp_path, shm) == (0, 0)  # a first start: no record
    (tmp_path / PROCESSES_FILE).write_text("1\nnot a pid\n-5\n")
    assert remove_leftovers(tmp_path, shm) == (0, 0)
    assert len(list(shm.iterdir())) == 1


def test_a_killed_process_not_yet_reaped_counts_as_gone(tmp_path):
    """Killed with its parent, a child waits as a zombie until its new parent reaps it (never, under an init that
    does not): it maps no memory any more."""
    import time

    zombie = subprocess.Popen(["true"])  # not waited for: a zombie once it exits
    deadline = time.monotonic() + 10
    while open(f"/proc/{zombie.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / f"torch_{zombie.pid}_1_2").write_bytes(b"x")
    record_processes(tmp_path, [zombie.pid])
    try:
        assert remove_leftovers(tmp_path, shm) == (1, 1)
    finally:
        zombie.wait()
