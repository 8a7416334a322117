"""The test harness's own reporting (tests/daemons.py): what a failing swarm test shows of a peer's log."""

import subprocess
import sys

from daemons import DaemonProcess

# A process with several threads that crashes natively, as `swarmd join` would (it enables faulthandler): the dump
# lists the crashing thread first, then every other one, and the log's tail would show only the others.
CRASH = """
import ctypes, faulthandler, threading, time
faulthandler.enable()
for n in range(30):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("Joined run 'x'", flush=True)
def crash_here():
    ctypes.string_at(0)
crash_here()
"""


def test_after_a_native_crash_the_tail_shows_the_crashing_threads_stack(tmp_path):
    log_path = tmp_path / "a.log"
    with open(log_path, "wb") as log:
        code = subprocess.run([sys.executable, "-c", CRASH], stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode
    assert code == -11
    peer = DaemonProcess.__new__(DaemonProcess)  # only its log
    peer.log_path = log_path
    tail = peer.tail(lines=20)
    assert "Fatal Python error: Segmentation fault" in tail and "Joined run 'x'" in tail
    assert "in crash_here" in tail, tail
    assert len(peer.log.splitlines()) > 60  # so the plain last lines would not have held it


def test_without_a_crash_the_tail_is_the_last_lines(tmp_path):
    peer = DaemonProcess.__new__(DaemonProcess)
    peer.log_path = tmp_path / "a.log"
    peer.log_path.write_text("".join(f"line {n}\n" for n in range(100)))
    assert peer.tail(lines=3) == "line 97\nline 98\nline 99"
