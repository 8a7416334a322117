"""Command latency and the daemon's own cost, against one running daemon training the micro Swin task.

- wall time of `swarmd --help`, `swarmd status --json` and `swarmd status --once` (goal <= 0.3 s each),
  interleaved repetitions;
- resident memory of the daemon and of each hivemind child (DHT, p2pd, averagers), beside the model's size;
- CPU used over a window by the event-loop thread (the daemon's own loop: status, ticks), by the rest of the
  daemon process (the training worker, hivemind's tracker thread...), and by hivemind's child processes.

    python benchmarks/daemon_cost.py [--repeats 10] [--window 20]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, DaemonProcess, cpu_seconds, interleave, machine, peer_config, print_table, process_name, summary

from swarmd.swarm.children import descendant_pids


def timed(args: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "swarmd", *args], check=True, capture_output=True, env=env, cwd=REPO)
    return time.perf_counter() - started


def memory_mb(pid: int) -> tuple[float, float, float]:
    """RSS, PSS (shared pages split between the processes that share them) and USS (private) in MB.

    hivemind's children are forked from the daemon after torch is imported, so most of their RSS is shared
    copy-on-write pages: PSS is the honest share of each, USS what killing it would free.
    """
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                values[key] = int(rest.split()[0]) / 1e3
    return values["Rss"], values["Pss"], values["Private_Clean"] + values["Private_Dirty"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        config = peer_config(
            task={"name": "swin", "eval_every_epochs": 0, "data": {"path": str(Path(tmp) / "data")}},
            swarm={"target_batch_size": 1024},
            training={"batch_size": 32, "threads": 2, "seed": 0},
        )
        daemon = DaemonProcess(Path(tmp) / "peer", config, name="peer").start()
        try:
            daemon.wait_status(lambda s: s["state"] == "training" and s["steps_total"] > 10, 300, "training")
            env = {**os.environ, "SWARMD_STATE_DIR": str(daemon.state_dir)}
            latency = interleave(
                {
                    "swarmd --help": lambda: timed(["--help"], env),
                    "swarmd status --json": lambda: timed(["status", "--json"], env),
                    "swarmd status --once": lambda: timed(["status", "--once"], env),
                },
                args.repeats,
            )

            pid = daemon.proc.pid
            children = descendant_pids(pid)
            loop_stat, process_stat = f"/proc/{pid}/task/{pid}/stat", f"/proc/{pid}/stat"
            before = {
                "loop": cpu_seconds(loop_stat),
                "process": cpu_seconds(process_stat),
                "children": {c: cpu_seconds(f"/proc/{c}/stat") for c in children},
            }
            samples_before = daemon.status()["samples_total"]
            started = time.monotonic()
            time.sleep(args.window)
            elapsed = time.monotonic() - started
            status = daemon.status()
            loop = (cpu_seconds(loop_stat) - before["loop"]) / elapsed
            process = (cpu_seconds(process_stat) - before["process"]) / elapsed
            per_child = {c: (cpu_seconds(f"/proc/{c}/stat") - t) / elapsed for c, t in before["children"].items()}
            memory = [(f"daemon (pid {pid})", memory_mb(pid))] + [(f"{process_name(c)} (pid {c})", memory_mb(c)) for c in children]
            child_cpu = [(f"{process_name(c)} (pid {c})", per_child[c]) for c in children]
            samples_per_second = (status["samples_total"] - samples_before) / elapsed
        finally:
            daemon.terminate(timeout=60)
            daemon.close()

    print_table(
        f"Command latency against a running daemon, {args.repeats} interleaved repeats (goal <= 0.3 s)\n{machine()}",
        ["command", "wall s median [min..max]"],
        [[command, summary(values)] for command, values in latency.items()],
    )
    params_mb = 0.54e6 * 4 / 1e6
    print_table(
        f"Resident memory (model: 0.54M fp32 parameters = {params_mb:.1f} MB)",
        ["process", "RSS MB", "PSS MB", "USS MB"],
        [[label, *(f"{mb:.0f}" for mb in values)] for label, values in memory]
        + [["total", *(f"{sum(values[i] for _, values in memory):.0f}" for i in range(3))]],
    )
    print_table(
        f"CPU over {elapsed:.0f} s of training ({samples_per_second:.0f} samples/s); 1.0 = one core",
        ["where", "cores"],
        [["event loop thread (status, ticks, signals)", f"{loop:.3f}"],
         ["rest of the daemon process (training worker, tracker)", f"{process - loop:.3f}"]]
        + [[label, f"{cores:.3f}"] for label, cores in child_cpu],
    )


if __name__ == "__main__":
    main()
