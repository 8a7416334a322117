"""The slow-link lab of benchmarks/wan.py: namespaces on a bridge, tbf both ways, nothing left behind.

Needs root (network namespaces, veth, tc); skipped otherwise.
"""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import netlab  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="needs root and iproute2 (ip, tc) to make network namespaces",
)

RATE_MBIT = 8
PAYLOAD = 1_500_000  # 1.5 s at 8 Mbit/s: long enough that the 64 KiB burst is a small part of it


def _transfer(lab: netlab.Lab, source: int, target: int, port: int) -> float:
    """Send PAYLOAD bytes from peer `source` to peer `target` over TCP; Mbit/s as the receiver saw them."""
    ready, result = threading.Event(), {}

    def receive():
        with socket.socket() as server:
            server.settimeout(20)
            server.bind((lab.address(target), port))
            server.listen(1)
            ready.set()
            connection, _ = server.accept()
            with connection:
                connection.settimeout(20)
                received, first = 0, None
                while received < PAYLOAD:
                    chunk = connection.recv(1 << 16)
                    if not chunk:
                        break
                    first = first or time.monotonic()
                    received += len(chunk)
                result["mbit"] = received * 8 / (time.monotonic() - first) / 1e6
                result["bytes"] = received

    receiver = threading.Thread(target=lambda: netlab.in_namespace(lab.namespace(target), receive), daemon=True)
    receiver.start()
    assert ready.wait(10), "the receiver did not start"

    def send():
        with socket.create_connection((lab.address(target), port), timeout=10) as connection:
            connection.sendall(b"\0" * PAYLOAD)

    netlab.in_namespace(lab.namespace(source), send)
    receiver.join(30)
    assert result.get("bytes") == PAYLOAD, result
    return result["mbit"]


def test_a_tbf_link_holds_its_rate_both_ways_and_leaves_nothing_behind():
    lab = netlab.Lab(2, RATE_MBIT)
    try:
        lab.start()
        shaped = lab.qdiscs()
        assert len(shaped) == 4 and all(f"rate {RATE_MBIT}Mbit" in line for line in shaped), shaped
        upload = _transfer(lab, 0, 1, 41001)
        download = _transfer(lab, 1, 0, 41002)
        for rate in (upload, download):
            assert 0.5 * RATE_MBIT <= rate <= 1.3 * RATE_MBIT, f"measured {rate:.2f} Mbit/s on an {RATE_MBIT} Mbit/s link"
    finally:
        lab.close()
    assert netlab.leftovers(lab.prefix) == []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert lab.prefix not in namespaces and lab.prefix not in links


def test_leftovers_of_a_run_that_died_are_removed_and_a_live_runs_are_kept():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"{netlab.NAME_PREFIX}{dead.pid}-0", f"{netlab.NAME_PREFIX}{os.getpid()}-9"
    try:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "add", name], check=True)
        removed = netlab.cleanup_leftovers()
        assert f"netns {stale}" in removed
        remaining = netlab.leftovers()
        assert f"netns {stale}" not in remaining and f"netns {live}" in remaining
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert not [item for item in netlab.leftovers() if stale in item or live in item]
