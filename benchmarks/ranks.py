"""Ranks: samples/s of one peer computing with 2 CPU ranks (1 thread each) against 1 rank (1 thread).

The micro Swin task (configs/swin-micro.yaml, 0.54M parameters), the same per-rank batch, the swarmd.ranks
components driven directly (no daemon, no hivemind): this process is rank 0, pinned to core 0; its compute rank
(`python -m swarmd.ranks.compute_rank`) is pinned to core 1. One rank: forward + backward. Two ranks: the
protocol's control broadcast, forward + backward on each rank, the stats all_gather and the bucketed gradient
all_reduce (parameters unchanged between steps, as between global steps with gradient averaging). Neither runs
an optimizer step (hivemind's happens once per global epoch). Repetitions are interleaved. Goal: ratio >= 1.8.
Also measured: the CPU seconds the ranks got (a busy machine shows it as a share below 1 core per rank) and the
samples per CPU-second, which says what the ranks cost in work whatever else runs on the machine. And the 1-rank
loop again while an independent copy of it trains on core 1 (nothing shared with it): 2 ranks over twice that is
what the protocol costs, apart from what the machine's cores cost each other when both compute.

And torch's own DistributedDataParallel (gloo, the same 2 ranks pinned the same way, its default 25 MB buckets
all-reduced from backward hooks, overlapped with the rest of backward): the library's ceiling for 2 CPU ranks on
this machine, beside the protocol's.

And in the same interleaved run, a whole solo swarmd peer (`swarmd join`, hivemind's DHT, averagers and p2pd, an
optimizer step per 1024 samples) with `training.devices: [cpu, cpu]` and with `[cpu]`, 1 thread per rank, on all
the cores: its 2 ranks against the bare protocol's are what rank 0 pays for hosting hivemind beside its compute.

    python benchmarks/ranks.py [--repeats 3] [--seconds 8] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    DaemonProcess, cpu_seconds, interleave, machine, measure_rate, peer_config, pinned, print_table, summary,
)
from solo_overhead import TASK as SOLO_TASK  # the micro Swin on generated images, loaded in the training thread

WARMUP_SECONDS = 2.0


def micro_swin(state_dir: str, batch_size: int):
    """(config, task) of the micro Swin with 2 CPU ranks of 1 thread, its data under `state_dir`, prepared."""
    import torch

    from swarmd.config import load_config
    from swarmd.config.task_resolver import use_task_resolver
    from swarmd.tasks.base import TaskContext
    from swarmd.tasks.registry import resolve_task

    use_task_resolver(resolve_task)
    config = load_config(
        environ={},
        flags={
            "state_dir": state_dir,
            "task.eval_every_epochs": 0,
            "task.data.path": str(Path(state_dir) / "data"),
            "training.batch_size": batch_size,
            "training.devices": ["cpu", "cpu"],
            "training.threads": 1,
        },
    )
    task = resolve_task("swin")(
        config.task.settings,
        TaskContext(state_dir=config.state_path, device=torch.device("cpu"), precision="fp32",
                    batch_size=batch_size, seed=0),
    )
    task.prepare()  # draws the image folder once, before the compute rank looks for it
    return config, task


def neighbour_loop(state_dir: str, batch_size: int) -> None:
    """`--neighbour`: the 1-rank loop alone in its own process, until killed; says "ready" once warm."""
    import torch

    torch.set_num_threads(1)
    _, task = micro_swin(state_dir, batch_size)
    torch.manual_seed(0)
    model = task.build_model()
    for step, batch in enumerate(task.train_batches(7)):
        task.training_step(model, batch).loss.backward()
        model.zero_grad(set_to_none=True)
        if step == 5:
            print("ready", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--neighbour", metavar="STATE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ddp-store", help=argparse.SUPPRESS)
    parser.add_argument("--ddp-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.neighbour:
        neighbour_loop(args.neighbour, args.batch_size)
        return
    if args.ddp_rank is not None:
        ddp_rank(args.ddp_rank, args.ddp_store, args.ddp_dir, args.batch_size, args.seconds)
        return

    import torch

    from swarmd.ranks.group import RankGroup
    from swarmd.ranks.layout import rank_data_seed
    from swarmd.ranks.step_sync import StepSync

    cores = sorted(os.sched_getaffinity(0))
    # (cores used, samples per CPU-second) of this process's ranks
    cpu: dict[str, list[tuple[float, float]]] = {"1 rank": [], "2 ranks": [], "1 rank, neighbour": []}
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        config, task = micro_swin(tmp, args.batch_size)
        torch.manual_seed(0)
        model = task.build_model()
        batches = iter(task.train_batches(rank_data_seed(1, 0)))
        if len(cores) >= 2:
            os.sched_setaffinity(0, {cores[0]})
        group = RankGroup(devices=["cpu", "cpu"], config_data=config.to_dict(), workdir=config.state_path,
                          init_seed=0, data_seed=1, threads=1)
        group.start()
        try:
            if len(cores) >= 2:
                for pid in group.pids:
                    os.sched_setaffinity(pid, {cores[1]})
            started = time.monotonic()
            group.connect(300)
            print(f"compute rank ready after {time.monotonic() - started:.1f} s", flush=True)
            sync = StepSync(model, rank=0, world_size=2, device=torch.device("cpu"), describe_failure=group.dead_rank)

            def one_rank_step() -> int:
                output = task.training_step(model, next(batches))
                output.loss.backward()
                model.zero_grad(set_to_none=True)
                return output.batch_size

            def one_rank() -> float:
                return rate(one_rank_step, args.seconds, [os.getpid()], cpu["1 rank"])

            def one_rank_beside_a_neighbour() -> float:
                # the same loop with core 1 as busy as rank 1 makes it, but nothing shared: what the machine's
                # cores cost each other, apart from what the protocol costs
                neighbour = subprocess.Popen(
                    ["taskset", "-c", str(cores[-1]), sys.executable, __file__, "--neighbour", tmp,
                     "--batch-size", str(args.batch_size)],
                    stdout=subprocess.PIPE, text=True,
                )
                try:
                    if neighbour.stdout.readline().strip() != "ready":
                        raise RuntimeError(f"the neighbour loop ended with {neighbour.wait()} before it was ready")
                    return rate(one_rank_step, args.seconds, [os.getpid()], cpu["1 rank, neighbour"])
                finally:
                    neighbour.kill()
                    neighbour.wait()

            def two_ranks() -> float:
                def step() -> int:
                    sync.lead(params_version=0)
                    output = task.training_step(model, next(batches))
                    output.loss.backward()
                    totals = sync.average_gradients(samples=output.batch_size, loss=float(output.loss.detach()))
                    model.zero_grad(set_to_none=True)
                    return totals.samples

                return rate(step, args.seconds, [os.getpid(), *group.pids], cpu["2 ranks"])

            stores = iter(range(1000))

            def torch_ddp() -> float:
                return run_torch_ddp(Path(tmp), Path(tmp) / f"ddp-store-{next(stores)}", cores, args)

            peers = iter(range(1000))

            def swarmd_peer(devices: list[str]) -> float:
                return run_swarmd_peer(Path(tmp) / f"peer-{next(peers)}", str(Path(tmp) / "data"), devices,
                                       cores, args)

            results = interleave({
                "1 rank": one_rank, "2 ranks": two_ranks, "1 rank, neighbour": one_rank_beside_a_neighbour,
                "torch DDP 2 ranks": torch_ddp,
                "swarmd 1 rank": lambda: swarmd_peer(["cpu"]), "swarmd 2 ranks": lambda: swarmd_peer(["cpu", "cpu"]),
            }, args.repeats)
            sync.lead_stop()
        finally:
            group.close(10)

    ratios = [two / one for one, two in zip(results["1 rank"], results["2 ranks"])]
    peer_ratios = [two / one for one, two in zip(results["swarmd 1 rank"], results["swarmd 2 ranks"])]
    hosting = [peer / bare for bare, peer in zip(results["2 ranks"], results["swarmd 2 ranks"])]
    protocol = [two / (2 * alone) for alone, two in zip(results["1 rank, neighbour"], results["2 ranks"])]
    ddp_ratios = [ddp / one for one, ddp in zip(results["1 rank"], results["torch DDP 2 ranks"])]
    print_table(
        f"Ranks inside one peer, micro Swin (0.54M params), batch {args.batch_size} per rank, 1 thread per rank, "
        f"{args.repeats} interleaved repeats of {args.seconds:.0f} s\n{machine()}",
        ["run", "samples/s median [min..max]"],
        [["1 rank (core 0)", summary(results["1 rank"])], ["2 ranks (cores 0, 1)", summary(results["2 ranks"])],
         ["ratio 2/1 (per pair)", summary(ratios)],
         ["cores used, 1 rank", summary([c for c, _ in cpu["1 rank"]])],
         ["cores used, 2 ranks", summary([c for c, _ in cpu["2 ranks"]])],
         ["samples per CPU-second, 1 rank", summary([e for _, e in cpu["1 rank"]])],
         ["samples per CPU-second, 2 ranks", summary([e for _, e in cpu["2 ranks"]])],
         ["1 rank, an independent loop on core 1", summary(results["1 rank, neighbour"])],
         ["2 ranks / (2 x that): the protocol", summary(protocol)],
         ["torch DDP, 2 ranks (cores 0, 1)", summary(results["torch DDP 2 ranks"])],
         ["torch DDP ratio 2/1 (per pair)", summary(ddp_ratios)],
         ["swarmd peer, 1 rank (all cores)", summary(results["swarmd 1 rank"])],
         ["swarmd peer, 2 ranks (all cores)", summary(results["swarmd 2 ranks"])],
         ["swarmd peer ratio 2/1 (per pair)", summary(peer_ratios)],
         ["swarmd peer 2 ranks / bare 2 ranks", summary(hosting)]],
    )
    ratio = statistics.median(results["2 ranks"]) / statistics.median(results["1 rank"])
    ddp = statistics.median(results["torch DDP 2 ranks"]) / statistics.median(results["1 rank"])
    print(f"\nratio of medians: {ratio:.3f} (goal >= 1.8); torch DDP's: {ddp:.3f}")


def run_swarmd_peer(state_dir: Path, data: str, devices: list[str], cores: list[int], args) -> float:
    """Samples/s of a solo `swarmd join` training the same task on `devices` (1 thread per rank), on all `cores`."""
    config = peer_config(
        task={**SOLO_TASK, "data": {**SOLO_TASK["data"], "path": data}},
        swarm={"target_batch_size": 1024},
        training={"batch_size": args.batch_size, "devices": devices, "threads": 1, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )
    daemon = pinned(DaemonProcess(state_dir, config, name="swarmd"), *cores)  # not this process's core 0 alone
    try:
        return measure_rate(daemon, warmup=5.0, duration=args.seconds)
    finally:
        if daemon.proc.poll() is None:
            daemon.terminate(timeout=60)
        daemon.close()


def run_torch_ddp(workdir: Path, store: Path, cores: list[int], args) -> float:
    """Samples/s of torch DDP with 2 gloo ranks, each its own process pinned to its own core (rank r to core r, as
    the protocol's ranks are); they rendezvous on a file store, so no port is taken."""
    ranks = [
        subprocess.Popen(
            ["taskset", "-c", str(cores[rank % len(cores)]), sys.executable, __file__, "--ddp-rank", str(rank),
             "--ddp-store", str(store), "--ddp-dir", str(workdir), "--batch-size", str(args.batch_size),
             "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE, text=True,
        )
        for rank in range(2)
    ]
    try:
        outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    if any(rank.returncode != 0 for rank in ranks):
        raise RuntimeError(f"a torch DDP rank failed: exit codes {[rank.returncode for rank in ranks]}")
    return float(outputs[0].split()[-1])


def ddp_rank(rank: int, store: str, workdir: str, batch_size: int, seconds: float) -> None:
    """`--ddp-rank R`: one rank of the torch DDP reference; rank 0 prints the pair's samples/s."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        _, task = micro_swin(workdir, batch_size)  # the images are the parent's, drawn before
        torch.manual_seed(0)
        model = task.build_model()
        replica = torch.nn.parallel.DistributedDataParallel(model)
        batches = iter(task.train_batches(rank + 1))

        def steps(count: int) -> int:
            for _ in range(count):
                task.training_step(replica, next(batches)).loss.backward()
                model.zero_grad(set_to_none=True)
            return count

        def go_on(value: bool) -> bool:  # rank 0 decides, every 10 steps, for both (they must take the same steps)
            flag = torch.tensor([int(value)])
            dist.broadcast(flag, 0)
            return bool(flag.item())

        started = time.monotonic()
        while go_on(time.monotonic() - started < WARMUP_SECONDS):
            steps(10)
        done, started = 0, time.monotonic()
        while go_on(time.monotonic() - started < seconds):
            done += steps(10)
        if rank == 0:
            print(f"{2 * batch_size * done / (time.monotonic() - started):.2f}", flush=True)
    finally:
        dist.destroy_process_group()


def rate(step, seconds: float, pids: list[int], cpu: list) -> float:
    """Samples per second of `step` (which returns its samples) over `seconds`, after a warm-up; appends the
    cores the processes `pids` used meanwhile and the samples per CPU-second to `cpu`."""
    started = time.monotonic()
    while time.monotonic() - started < WARMUP_SECONDS:
        step()
    cpu_before = sum(cpu_seconds(f"/proc/{pid}/stat") for pid in pids)
    samples, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        samples += step()
    elapsed = time.monotonic() - started
    used = sum(cpu_seconds(f"/proc/{pid}/stat") for pid in pids) - cpu_before
    cpu.append((used / elapsed, samples / used if used else float("nan")))
    return samples / elapsed


if __name__ == "__main__":
    main()
