"""Shared pieces of the benchmarks: interleaved repetitions, medians with spread, tables, daemons."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from daemons import DaemonProcess, peer_config  # noqa: E402,F401 - re-exported for the benchmarks

from swarmd.swarm.children import process_name  # noqa: E402,F401 - re-exported: "p2pd", "python", ... by /proc comm

__all__ = [
    "REPO", "DaemonProcess", "peer_config", "interleave", "summary", "print_table", "machine", "measure_rate",
    "install_testtasks", "p2pd_bytes", "pinned", "pinned_pair", "cpu_seconds", "process_name", "HivemindPeer",
    "HIVEMIND_PROFILES", "child_roles", "SYNC_CHILDREN", "DILOCO_CHILDREN",
]

T = TypeVar("T")


def raise_exit(signum, _frame):
    """A signal handler: SIGTERM (and the like) unwinds as SystemExit, so a benchmark's finally clauses stop its
    peers and tear its lab down as on Ctrl-C (Python's default SIGTERM ends the process without running them)."""
    raise SystemExit(128 + signum)


def interleave(variants: dict[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """Run A, B, ..., A, B, ... so that drifts in machine load hit every variant alike."""
    results: dict[str, list[T]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name, run in variants.items():
            value = run()
            results[name].append(value)
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"  [{repeat + 1}/{repeats}] {name}: {shown}", flush=True)
    return results


def pinned(daemon: DaemonProcess, *cores: int) -> DaemonProcess:
    """Start the daemon (and so every process it forks) on these CPU cores."""
    daemon.args = ["taskset", "-c", ",".join(map(str, cores)), *daemon.args]
    return daemon.start()


# benchmark rows of plain hivemind.Optimizer peers (benchmarks/hivemind_peer.py): row name -> its --profile
HIVEMIND_PROFILES = {"hivemind-defaults": "defaults", "hivemind-tuned": "tuned"}


class HivemindPeer(DaemonProcess):
    """benchmarks/hivemind_peer.py in place of `swarmd join`; its status is the JSON file it rewrites."""

    def __init__(self, state_dir: Path, config: dict, *, profile: str, extra_args=(), name="peer"):
        super().__init__(state_dir, config, extra_args=extra_args, name=name)
        self.args = [sys.executable, str(REPO / "benchmarks" / "hivemind_peer.py"), "--config", str(self.config_path),
                     "--state-dir", str(self.state_dir), "--profile", profile, *extra_args]

    def status(self) -> dict:
        import json

        from hivemind_peer import STATUS_FILE

        return json.loads((self.state_dir / STATUS_FILE).read_text())


@contextlib.contextmanager
def pinned_pair(root: Path, prefix: str, config: dict, make_peer=DaemonProcess) -> Iterator[list[DaemonProcess]]:
    """Two peers of one swarm on cores 0 and 1, the second joining the first; both closed afterwards.
    `make_peer(state_dir, config, extra_args=..., name=...)` builds each (default: a `swarmd join`)."""
    peers = []
    try:
        first = pinned(make_peer(root / f"{prefix}-a", config, name="a"), 0)
        peers.append(first)
        peers.append(pinned(make_peer(root / f"{prefix}-b", config, extra_args=first.joining_args(), name="b"), 1))
        yield peers
    finally:
        for peer in peers:
            peer.close()


def summary(values: list[float]) -> str:
    """median [min..max]"""
    return f"{statistics.median(values):.4g} [{min(values):.4g}..{max(values):.4g}]"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"


def measure_rate(daemon: DaemonProcess, *, warmup: float, duration: float, key: str = "samples_total") -> float:
    """Samples per second of a running daemon, from two status reads `duration` apart after `warmup`."""
    daemon.wait_status(lambda s: s["state"] == "training" and s[key] > 0, 300, "training to start")
    time.sleep(warmup)
    first = daemon.status()
    t0 = time.monotonic()
    time.sleep(duration)
    second = daemon.status()
    return (second[key] - first[key]) / (time.monotonic() - t0)


def install_testtasks(work: Path) -> dict:
    """The test-only task plug-ins (tests/plugins), installed as tests/conftest.py does; an env that finds them."""
    import shutil

    source, target = work / "source", work / "site"
    shutil.copytree(REPO / "tests" / "plugins" / "swarmd-test-tasks", source)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
         str(source)],
        check=True,
    )
    return {"PYTHONPATH": f"{target}:{REPO}"}


def p2pd_bytes(daemon: DaemonProcess) -> tuple[int, int]:
    """(sent, received) TCP payload bytes of the daemon's p2pd so far: the same kernel counters (sock_diag)
    that the daemon exports as swarmd_network_{sent,received}_bytes_total."""
    from swarmd.metrics.netstat import P2pdProcesses, TcpTraffic

    traffic = TcpTraffic(P2pdProcesses(daemon.proc.pid))
    return traffic.read() or (0, 0)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# the Python processes a peer forks, in order: hivemind's DHT process, then its optimizer's averagers
SYNC_CHILDREN = ("DHT process", "state averager", "gradient averager")  # a local-updates peer has no gradient one
DILOCO_CHILDREN = ("DHT process", "state averager", "outer averager")


def child_roles(peer: DaemonProcess, python_roles: tuple[str, ...] = SYNC_CHILDREN) -> dict[int, str]:
    """pid -> name of each of the peer's descendants: p2pd, torch_shm_manager, ... by their command, each Python
    child by its place in fork order (`python_roles`; "child N" past them)."""
    names, children = {}, 0
    for pid in sorted(peer.descendants()):
        name = process_name(pid)
        if name == "python":
            name = python_roles[children] if children < len(python_roles) else f"child {children}"
            children += 1
        names[pid] = name
    return names


def cpu_seconds(stat_path: str) -> float:
    """User + system CPU seconds so far of the process or thread whose /proc .../stat this is."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

