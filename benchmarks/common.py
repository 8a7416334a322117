"""Shared pieces of the benchmarks: interleaved repetitions, medians with spread, tables, daemons."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from daemons import DaemonProcess, peer_config  # noqa: E402,F401 - re-exported for the benchmarks

__all__ = [
    "REPO", "DaemonProcess", "peer_config", "interleave", "summary", "print_table", "machine", "measure_rate",
    "install_testtasks", "p2pd_bytes",
]


def interleave(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run A, B, ..., A, B, ... so that drifts in machine load hit every variant alike."""
    results: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name, run in variants.items():
            value = run()
            results[name].append(value)
            print(f"  [{repeat + 1}/{repeats}] {name}: {value:.4g}", flush=True)
    return results


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
