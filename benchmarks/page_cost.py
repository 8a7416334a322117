"""What serving the web pages costs training (issue 36): two peers train the micro Swin task, each serving its own
page on its metrics port, and `swarmd monitor` serves the swarm's page; windows with nobody looking alternate with
windows where `--viewers` browser tabs look at every page (each tab, as swarmd-page.js does, fetches
`/api/status` every 3 s, and the whole page every 30 s).

Reported per window kind: the swarm's samples/s (both peers, from their status counters), its ratio to the quiet
windows, the requests served and their median latency. Windows are interleaved, so that drifts in the machine's load
hit both kinds alike.

    python benchmarks/page_cost.py [--repeats 4] [--window 30] [--viewers 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import REPO, DaemonProcess, interleave, machine, peer_config, print_table, summary

POLL_SECONDS = 3.0  # swarmd-page.js POLL_MS
PAGE_EVERY = 10  # a tab loads the whole page again every 10th poll (30 s): a reload, a new tab


class Viewers:
    """`count` simulated browser tabs per address, each a thread polling as swarmd-page.js does, while started."""

    def __init__(self, addresses: list[str], count: int):
        self.addresses, self.count = addresses, count
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "Viewers":
        for address in self.addresses:
            for tab in range(self.count):
                thread = threading.Thread(target=self._tab, args=(address, tab), daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _tab(self, address: str, tab: int) -> None:
        # tabs spread over the poll interval, as tabs opened at different times are
        if self._stop.wait(POLL_SECONDS * tab / self.count):
            return
        polls = 0
        while not self._stop.is_set():
            path = "/" if polls % PAGE_EVERY == 0 else "/api/status"
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
                    response.read()
                self.latencies.append(time.perf_counter() - started)
            except OSError:
                self.errors += 1
            polls += 1
            self._stop.wait(POLL_SECONDS)


def swarm_rate(peers: list[DaemonProcess], seconds: float) -> float:
    """Samples/s of all `peers` together over `seconds` (two reads of each one's status counter)."""
    first = [peer.status()["samples_total"] for peer in peers]
    began = time.monotonic()
    time.sleep(seconds)
    last = [peer.status()["samples_total"] for peer in peers]
    return (sum(last) - sum(first)) / (time.monotonic() - began)


def start_monitor(first: DaemonProcess, root: Path) -> tuple[subprocess.Popen, str]:
    """`swarmd monitor` of the swarm, serving its page; (the process, the page's address)."""
    log_path = root / "monitor.log"
    command = [sys.executable, "-m", "swarmd", "monitor", "--config", str(first.config_path), "--state-dir",
               str(root / "monitor"), "--interval", "2", "--keep-every", "0", "--metrics-addr", "127.0.0.1:0",
               *first.joining_args()]
    monitor = subprocess.Popen(command, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, cwd=REPO,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    address = first.wait_for(
        lambda: next((line.split("http://")[1].split("/")[0] for line in log_path.read_text().splitlines()
                      if "the swarm's page at http://" in line), None), 180, "the monitor's page")
    return monitor, address


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of each measured window")
    parser.add_argument("--viewers", type=int, default=10, help="browser tabs on each page while looking")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = peer_config(
            task={"name": "swin", "eval_every_epochs": 0, "data": {"path": str(root / "data")}},
            swarm={"target_batch_size": 256},
            training={"batch_size": 16, "threads": 1, "seed": 0},
            checkpoint={"enabled": False},
        )
        peers, monitor = [], None
        try:
            first = DaemonProcess(root / "a", config, name="a").start()
            peers.append(first)
            peers.append(DaemonProcess(root / "b", config, extra_args=first.joining_args(), name="b").start())
            for peer in peers:
                peer.wait_status(lambda s: s["state"] == "training" and s["samples_total"] > 0 and s["num_peers"] == 2,
                                 300, "two peers training")
            monitor, monitor_address = start_monitor(first, root)
            addresses = [peer.status()["metrics_address"] for peer in peers] + [monitor_address]
            time.sleep(10)  # past the first epoch's downloads and the monitor's start
            served = {"latencies": [], "errors": 0}  # of every looking window

            def quiet() -> float:
                return swarm_rate(peers, args.window)

            def looking() -> float:
                with Viewers(addresses, args.viewers) as viewers:
                    time.sleep(POLL_SECONDS)  # every tab has begun polling
                    rate = swarm_rate(peers, args.window)
                served["latencies"] += viewers.latencies
                served["errors"] += viewers.errors
                return rate

            print(f"{machine()}\n{len(peers)} peers (micro Swin, 1 thread each) + swarmd monitor; pages at "
                  f"{', '.join(addresses)}; {args.viewers} tabs per page while looking")
            rates = interleave({"nobody looking": quiet, "looking": looking}, args.repeats)
        finally:
            for peer in peers:
                peer.close()
            if monitor is not None and monitor.poll() is None:
                os.killpg(monitor.pid, signal.SIGTERM)
                try:
                    monitor.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(monitor.pid, signal.SIGKILL)

    base = statistics.median(rates["nobody looking"])
    rows = []
    for name, values in rates.items():
        ratio = statistics.median(values) / base if base else float("nan")
        if name == "looking" and served["latencies"]:
            requests = f"{len(served['latencies'])} ({served['errors']} failed)"
            latency = f"{1000 * statistics.median(served['latencies']):.1f} ms"
        else:
            requests, latency = "0", "—"
        rows.append([name, summary(values), f"{ratio:.3f}", requests, latency])
    print_table(f"Training throughput while the pages are served, {args.repeats} windows of {args.window:.0f} s each",
                ["windows", "swarm samples/s median [min..max]", "ratio", "requests served", "median latency"], rows)


if __name__ == "__main__":
    main()
