"""Swarm utilization: two peers, each pinned to its own core, against one solo peer pinned to one core.

For each collaboration strategy the table shows per-peer samples/s over the solo peer's samples/s (goal >= 0.90
with the best strategy), the fraction of wall time a step spends inside hivemind.Optimizer.step (accumulating,
waiting on averaging, updating), global epochs per minute, and bytes sent per global epoch per peer (p2pd's TCP
counters). Strategies and solo runs are interleaved; medians over the repeats.

    python benchmarks/swarm_utilization.py [--repeats 2] [--window 25] [--strategies sync dpu local5]

The hivemind-defaults and hivemind-tuned rows are plain hivemind.Optimizer peers on the same task and data
(benchmarks/hivemind_peer.py), with hivemind's defaults or with what swarmd passes for the sync row.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

from common import HIVEMIND_PROFILES, DaemonProcess, HivemindPeer, interleave, machine, p2pd_bytes, peer_config, pinned, pinned_pair, print_table, summary

MODEL_BYTES = 0.54e6 * 4

STRATEGIES = {
    # synchronous gradient averaging every global epoch (pre-scheduled matchmaking); parameters are identical
    # after identical updates, so they are only re-averaged now and then to repair drift
    "sync": {"average_state_every": 10},
    "sync-state1": {"average_state_every": 1},
    # the same without pre-scheduling: matchmaking starts only when the epoch's samples are in
    "sync-nopre": {"average_state_every": 10, "prescheduled_averaging": False},
    # delayed parameter updates: averaging and the optimizer step run in the background, one epoch stale
    "dpu": {"delay_grad_averaging": True, "delay_optimizer_step": True, "average_state_every": 10},
    # local updates every step, parameters averaged every k global epochs
    "local1": {"use_local_updates": True, "average_state_every": 1},
    "local5": {"use_local_updates": True, "average_state_every": 5},
    # sync with hivemind 1.1.12's matchmaking (swarm/upstream/averager_pace.py): groups assembled at the scheduled time only,
    # then also with its back-to-back reads and per-tensor declarations
    "sync-scheduled": {"average_state_every": 10, "averager_opts": {"assemble_when_triggered": False}},
    "sync-unpaced": {"average_state_every": 10, "averager_opts": {
        "matchmaking_poll_interval": 0, "declare_interval": 0, "assemble_when_triggered": False}},
    # plain hivemind.Optimizer peers (benchmarks/hivemind_peer.py): its defaults, and tuned as swarmd's sync
    "hivemind-defaults": {"average_state_every": 10},
    "hivemind-tuned": {"average_state_every": 10},
    # sync with hivemind's processes (DHT, p2pd, averagers) below the training's CPU priority (issue 16)
    "sync-nice": {"average_state_every": 10, "daemon": {"background_priority": "nice"}},
    "sync-idle": {"average_state_every": 10, "daemon": {"background_priority": "idle"}},
    "local5-nice": {"use_local_updates": True, "average_state_every": 5, "daemon": {"background_priority": "nice"}},
}


def config(data: str, strategy: dict, args) -> dict:
    swarm = {key: value for key, value in strategy.items() if key != "daemon"}
    return peer_config(
        task={"name": "swin", "eval_every_epochs": 0, "data": {"path": data}},
        swarm={
            "target_batch_size": args.target_batch_size,
            "matchmaking_time": args.matchmaking_time,
            "averaging_timeout": 30.0,
            **swarm,
        },
        training={"batch_size": 32, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
        daemon={"shutdown_timeout": 30.0, "tick_interval": 1.0, **strategy.get("daemon", {})},
    )


def measure(peers: list[DaemonProcess], args) -> dict:
    for peer in peers:
        peer.wait_status(
            lambda s: s["state"] == "training" and s["steps_total"] > 0 and s["num_peers"] == len(peers), 300, "training"
        )
    time.sleep(args.warmup)
    first = [p.status() for p in peers]
    sent0 = [p2pd_bytes(p)[0] for p in peers]
    started = time.monotonic()
    time.sleep(args.window)
    elapsed = time.monotonic() - started
    last = [p.status() for p in peers]
    sent1 = [p2pd_bytes(p)[0] for p in peers]
    rates = [(b["samples_total"] - a["samples_total"]) / elapsed for a, b in zip(first, last)]
    waits = [(b["optimizer_seconds_total"] - a["optimizer_seconds_total"]) / elapsed for a, b in zip(first, last)]
    epochs = max(b["local_epoch"] - a["local_epoch"] for a, b in zip(first, last))
    averaged = [b["averaging"].get("gradients", {}).get("success", 0) + b["averaging"].get("state", {}).get("success", 0) for b in last]
    failed = [_failed_rounds(b) - _failed_rounds(a) for a, b in zip(first, last)]
    return {
        "rate": statistics.mean(rates),
        "wait": statistics.mean(waits),
        "epochs_per_min": epochs / elapsed * 60,
        "bytes_per_epoch": statistics.mean(s1 - s0 for s0, s1 in zip(sent0, sent1)) / max(epochs, 1),
        "averaged_rounds": min(averaged),
        "failed_rounds": max(failed),
    }


def _failed_rounds(status: dict) -> int:
    """Rounds of any kind that failed or were rejected (swarmd/swarm/outcomes.py FAILED_OUTCOMES)."""
    return sum(counts.get(outcome, 0) for counts in status["averaging"].values() for outcome in ("failed", "rejected"))


def run_solo(data: str, root: Path, args, counter: list[int]) -> dict:
    counter[0] += 1
    peer = pinned(DaemonProcess(root / f"solo-{counter[0]}", config(data, STRATEGIES["sync"], args), name="solo"), 0)
    try:
        return measure([peer], args)
    finally:
        peer.close()


def run_pair(name: str, data: str, root: Path, args, counter: list[int]) -> dict:
    counter[0] += 1
    make_peer = DaemonProcess
    if name in HIVEMIND_PROFILES:
        make_peer = functools.partial(HivemindPeer, profile=HIVEMIND_PROFILES[name])
    with pinned_pair(root, f"{name}-{counter[0]}", config(data, STRATEGIES[name], args), make_peer) as peers:
        return measure(peers, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=25.0)
    parser.add_argument("--target-batch-size", type=int, default=2048)
    parser.add_argument("--matchmaking-time", type=float, default=2.0)
    parser.add_argument("--strategies", nargs="+", default=["sync", "dpu", "local5"], choices=list(STRATEGIES))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root, data, counter = Path(tmp), str(Path(tmp) / "data"), [0]
        variants = {"solo": lambda: run_solo(data, root, args, counter)}
        for name in args.strategies:
            variants[name] = lambda name=name: run_pair(name, data, root, args, counter)
        results = interleave(variants, args.repeats)
    solo = statistics.median(r["rate"] for r in results["solo"])
    rows = []
    for name, runs in results.items():
        rates = [r["rate"] for r in runs]
        # each repeat against the solo run next to it: the machine's speed drifts between repeats
        per_repeat = [r["rate"] / s["rate"] for r, s in zip(runs, results["solo"])]
        rows.append([
            name,
            summary(rates),
            f"{statistics.median(rates) / solo:.2f}",
            summary(per_repeat) if name != "solo" else "-",
            f"{statistics.median(r['wait'] for r in runs):.2f}",
            f"{statistics.median(r['epochs_per_min'] for r in runs):.1f}",
            f"{statistics.median(r['bytes_per_epoch'] for r in runs) / 1e6:.2f}" if name != "solo" else "-",
            f"{min(r['averaged_rounds'] for r in runs)}",
            f"{max(r['failed_rounds'] for r in runs)}",
        ])
    print_table(
        f"Swarm utilization: micro Swin (0.54M params, {MODEL_BYTES / 1e6:.1f} MB fp32), batch 32, 1 thread per peer, "
        f"target batch {args.target_batch_size}, matchmaking {args.matchmaking_time:g} s; window {args.window:g} s "
        f"after {args.warmup:g} s warm-up, {args.repeats} repeats\n{machine()}",
        ["strategy", "samples/s per peer median [min..max]", "vs solo", "vs solo per repeat", "time in opt.step", "epochs/min",
         "MB sent/epoch/peer", "rounds averaged (min)", "failed in window (max)"],
        rows,
    )
    print(f"fp32 gradient all-reduce per epoch per peer, 2(N-1)/N x model bytes: {MODEL_BYTES / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
