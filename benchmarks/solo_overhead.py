"""Solo overhead: samples/s of a one-peer swarmd run against a plain PyTorch loop on the same model and data.

Both run the micro Swin task's own code (model, data loader, training step, AdamW) with the same batch size and
the same torch thread count; the plain loop steps its optimizer every batch, swarmd accumulates to the target
batch and steps hivemind.Optimizer (gradient accumulation, progress reports to the DHT, the DHT and averager
processes, the status socket). Repetitions are interleaved. Goal: ratio >= 0.97.

    python benchmarks/solo_overhead.py [--repeats 3] [--seconds 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, DaemonProcess, interleave, machine, measure_rate, peer_config, print_table, summary

TASK = {
    "name": "swin",
    "eval_every_epochs": 0,
    "data": {"source": "generated", "num_workers": 0},
}


def plain_loop(data_path: str, threads: int, batch_size: int, seconds: float, warmup: float) -> float:
    import torch

    from swarmd.config import load_config
    from swarmd.config.task_resolver import use_task_resolver
    from swarmd.tasks.base import TaskContext
    from swarmd.tasks.registry import resolve_task

    use_task_resolver(resolve_task)
    torch.set_num_threads(threads)
    config = load_config(environ={}, assignments=[f"task.data.path={data_path}", "task.eval_every_epochs=0"])
    task = resolve_task("swin")(
        config.task.settings,
        TaskContext(state_dir=Path(data_path), device=torch.device("cpu"), precision="fp32", batch_size=batch_size, seed=0),
    )
    task.prepare()
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = task.build_optimizer(task.parameter_groups(model))
    batches = iter(task.train_batches(0))
    samples, started, counting = 0, time.monotonic(), False
    while True:
        output = task.training_step(model, next(batches))
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        now = time.monotonic()
        if not counting and now - started >= warmup:
            counting, samples, started = True, 0, now
        elif counting:
            samples += output.batch_size
            if now - started >= seconds:
                return samples / (now - started)


def run_plain(args, data_path: str) -> float:
    result = subprocess.run(
        [sys.executable, __file__, "--plain-child", "--threads", str(args.threads), "--seconds", str(args.seconds),
         "--batch-size", str(args.batch_size), "--data", data_path],
        capture_output=True, text=True, check=True, cwd=REPO,
    )
    return float(json.loads(result.stdout.strip().splitlines()[-1])["samples_per_second"])


def run_swarmd(args, data_path: str, root: Path, index: list[int]) -> float:
    index[0] += 1
    config = peer_config(
        task={**TASK, "data": {**TASK["data"], "path": data_path}},
        swarm={"target_batch_size": args.target_batch_size},
        training={"batch_size": args.batch_size, "threads": args.threads, "seed": 0},
        checkpoint={"enabled": False},
        metrics={"enabled": False},
    )
    daemon = DaemonProcess(root / f"swarmd-{index[0]}", config, name="swarmd").start()
    try:
        return measure_rate(daemon, warmup=5.0, duration=args.seconds)
    finally:
        daemon.terminate(timeout=60) if daemon.proc.poll() is None else None
        daemon.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--target-batch-size", type=int, default=1024)
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        rate = plain_loop(args.data, args.threads, args.batch_size, args.seconds, warmup=5.0)
        print(json.dumps({"samples_per_second": rate}))
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = str(root / "data")
        counter = [0]
        results = interleave(
            {"plain": lambda: run_plain(args, data), "swarmd": lambda: run_swarmd(args, data, root, counter)},
            args.repeats,
        )
    ratio = [s / p for s, p in zip(results["swarmd"], results["plain"])]
    print_table(
        f"Solo overhead, micro Swin (0.54M params), batch {args.batch_size}, {args.threads} threads, "
        f"target batch {args.target_batch_size}, {args.repeats} interleaved repeats of {args.seconds:.0f} s\n{machine()}",
        ["run", "samples/s median [min..max]"],
        [["plain PyTorch loop", summary(results["plain"])], ["swarmd, one peer", summary(results["swarmd"])],
         ["ratio swarmd/plain (per pair)", summary(ratio)]],
    )
    print(f"\nratio of medians: {statistics.median(results['swarmd']) / statistics.median(results['plain']):.3f} (goal >= 0.97)")


if __name__ == "__main__":
    main()
