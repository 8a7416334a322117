"""A start-up that stands logs where its threads stand (swarmd/daemon/startup_watch.py); one in time logs nothing."""

import logging
import threading
import time

from swarmd.daemon.join_phases import JoinPhases
from swarmd.daemon.startup_watch import StartupWatch, thread_stacks


def _standing_in_an_import_of_its_own(seconds: float) -> None:
    time.sleep(seconds)


def test_a_start_up_that_stands_logs_each_threads_innermost_frames_with_the_phases_done(caplog):
    phases = JoinPhases(started=time.time())
    phases.add("imports", 1.25)
    caplog.set_level(logging.INFO, logger="swarmd.daemon")
    with StartupWatch(lambda: f"phases done: {phases.so_far()}", first=0.1) as watch:
        _standing_in_an_import_of_its_own(0.5)
    lines = [r.getMessage() for r in caplog.records if "Start-up has taken" in r.getMessage()]
    # at 0.1, 0.2 and 0.4 s (each threshold twice the last), none after the body ended at 0.5 s
    assert len(lines) == watch.reports == 3, lines
    assert lines[0].startswith("Start-up has taken 0.1 s so far")
    assert "phases done: imports 1.2 s" in lines[0]
    assert "MainThread:" in lines[0]
    assert "test_startup_watch.py" in lines[0] and "_standing_in_an_import_of_its_own" in lines[0]
    assert "swarmd-startup-watch" not in lines[0]  # the watch does not report itself


def test_a_start_up_in_time_logs_nothing_and_leaves_no_thread(caplog):
    caplog.set_level(logging.INFO, logger="swarmd.daemon")
    with StartupWatch(lambda: "", first=5.0) as watch:
        pass
    assert watch.reports == 0 and not [r for r in caplog.records if "Start-up" in r.getMessage()]
    assert not [t for t in threading.enumerate() if t.name == "swarmd-startup-watch"]


def test_thread_stacks_name_each_thread_and_shorten_library_paths():
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, name="a-helper", daemon=True)
    helper.start()
    try:
        lines = thread_stacks()
    finally:
        stop.set()
        helper.join()
    helper_line = next(line for line in lines if line.startswith("a-helper: "))
    assert "threading.py" in helper_line and " wait" in helper_line
    assert not any("/site-packages/" in line for line in lines)
