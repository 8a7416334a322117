"""Where the core of a pinned sync peer goes: CPU and context switches of each of its processes, side by side.

Two peers of one swarm on cores 0 and 1 (as swarm_utilization.py), once per variant; over a window after warm-up,
peer A's samples/s, time in opt.step, the durations of its gradient rounds, and for each of its processes (the
daemon, the DHT process, the averagers, p2pd) the cores used and the context switches per second, read from
/proc/<pid>/task/*/{stat,status}. Variants differ in `swarm.averager_opts`: `paced` is swarmd's default,
`unpaced` hivemind 1.1.12's matchmaking and declarations (swarm/upstream/averager_pace.py).

    python benchmarks/pair_profile.py [--window 20] [--target-batch-size 2048] [--variants paced unpaced]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import SYNC_CHILDREN, child_roles, cpu_seconds, machine, pinned_pair, print_table
from swarm_utilization import STRATEGIES, config

VARIANTS = {"paced": "sync", "unpaced": "sync-unpaced", "scheduled": "sync-scheduled"}


def process_totals(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) of a process so far. /proc/PID/stat counts the CPU of all its threads, ended
    ones too; the switches are only counted per thread (/proc/PID/status has the main thread's)."""
    switches = 0
    for tid in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (tid / "status").read_text().splitlines():
                if "ctxt_switches:" in line:  # voluntary and involuntary
                    switches += int(line.split()[1])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return cpu_seconds(f"/proc/{pid}/stat"), switches


def role_names(peer) -> dict[int, str]:
    """pid -> daemon, p2pd, torch_shm_manager or the Python child's role."""
    return {peer.proc.pid: "daemon", **child_roles(peer, SYNC_CHILDREN)}


def profile(variant: str, root: Path, args) -> dict:
    cfg = config(str(root / "data"), STRATEGIES[VARIANTS[variant]], args)
    with pinned_pair(root, variant, cfg) as peers:
        for peer in peers:
            peer.wait_status(lambda s: s["state"] == "training" and s["steps_total"] > 0 and s["num_peers"] == 2,
                             300, "training together")
        time.sleep(args.warmup)
        first = peers[0]
        names = role_names(first)
        before = {pid: process_totals(pid) for pid in names}
        status0, started = first.status(), time.monotonic()
        time.sleep(args.window)
        after = {pid: process_totals(pid) for pid in names if Path(f"/proc/{pid}").exists()}
        status1, elapsed = first.status(), time.monotonic() - started
    rounds = [r["duration_seconds"] for r in status1.get("recent_averaging") or []
              if r["kind"] == "gradients" and r["outcome"] == "success"]
    usage = {}
    for pid, name in names.items():
        if pid in after:
            cpu = (after[pid][0] - before[pid][0]) / elapsed
            switches = (after[pid][1] - before[pid][1]) / elapsed
            usage[name] = (cpu, switches)
    return {
        "rate": (status1["samples_total"] - status0["samples_total"]) / elapsed,
        "wait": (status1["optimizer_seconds_total"] - status0["optimizer_seconds_total"]) / elapsed,
        "rounds": rounds,
        "usage": usage,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--target-batch-size", type=int, default=2048)
    parser.add_argument("--matchmaking-time", type=float, default=2.0)
    parser.add_argument("--variants", nargs="+", default=["paced", "unpaced"], choices=list(VARIANTS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {variant: profile(variant, Path(tmp), args) for variant in args.variants}
    names = sorted({name for r in results.values() for name in r["usage"]}, key=lambda n: (n != "daemon", n))
    rows = [["samples/s of peer A", *(f"{r['rate']:.1f}" for r in results.values())],
            ["time in opt.step (of wall time)", *(f"{r['wait']:.2f}" for r in results.values())],
            ["gradient round, s: median [min..max]",
             *(f"{statistics.median(r['rounds']):.2f} [{min(r['rounds']):.2f}..{max(r['rounds']):.2f}]"
               if r["rounds"] else "-" for r in results.values())]]
    for name in names:
        rows.append([f"{name}: cores, switches/s",
                     *(f"{r['usage'][name][0]:.3f}, {r['usage'][name][1]:.0f}" if name in r["usage"] else "-"
                       for r in results.values())])
    print_table(
        f"Pinned sync pair, peer A's processes: micro Swin, batch 32, 1 thread, target batch {args.target_batch_size}, "
        f"matchmaking {args.matchmaking_time:g} s; {args.window:g} s after {args.warmup:g} s\n{machine()}",
        ["", *results], rows,
    )


if __name__ == "__main__":
    main()
