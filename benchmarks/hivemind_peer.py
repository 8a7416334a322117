"""A plain hivemind.Optimizer peer on a swarmd task: the library swarmd stands on, for side-by-side table rows.

It reads the same YAML config as `swarmd join` and trains the same task (model, data, training step, optimizer,
schedule) with the same batch, thread count and seed, but through hivemind.Optimizer directly: no swarmd
worker, no gradient guard, no throttled progress, no skipping of matchmaking while alone, no checkpoints.
`--profile defaults` keeps hivemind's own defaults for everything the config's swarm section would set
(matchmaking_time 15, averaging_timeout 60, no compression, parameters averaged every epoch); `--profile tuned`
passes what swarmd passes for the same config (matchmaking_time, averaging_timeout, fp16 gradients, parameter
averaging every `average_state_every` epochs, the averagers' request_timeout).

It reports through DIR/status.json (rewritten every second; a subset of `swarmd status --json`'s keys), so a
benchmark reads it like a daemon's status:

    python benchmarks/hivemind_peer.py --config peer.yaml --state-dir DIR [--initial-peers ADDR] [--profile tuned]

The identity (and so the peer id) comes from DIR/identity.key, as with swarmd; it is generated when missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # swarmd, when started as a script

STATUS_FILE = "status.json"
PROFILES = ("defaults", "tuned")
_RECENT_ROUNDS = 10


def optimizer_options(config, profile: str) -> dict:
    """hivemind.Optimizer keyword arguments beyond the task's: none for `defaults`, swarmd's for `tuned`."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, not {profile!r}")
    if profile == "defaults":
        return {}
    from swarmd.swarm.compression import make_compression

    swarm = config.swarm
    return {
        "matchmaking_time": swarm.matchmaking_time,
        "averaging_timeout": swarm.averaging_timeout,
        "next_chunk_timeout": swarm.next_chunk_timeout,
        "grad_compression": make_compression(swarm.grad_compression, "swarm.grad_compression"),
        "state_averaging_compression": make_compression(swarm.state_averaging_compression, "swarm.state_averaging_compression"),
        "average_state_every": swarm.average_state_every,
        "use_local_updates": swarm.use_local_updates,
        "delay_grad_averaging": swarm.delay_grad_averaging,
        "delay_optimizer_step": swarm.delay_optimizer_step,
        "averager_opts": {"request_timeout": min(3.0, swarm.matchmaking_time / 2)},
    }


class _Report:
    """What the peer has done so far, written atomically as JSON for the benchmark to read."""

    def __init__(self, path: Path):
        self.path = path
        self.data = {
            "state": "starting", "samples_total": 0, "steps_total": 0, "optimizer_seconds_total": 0.0,
            "local_epoch": None, "num_peers": None, "loss": None, "recent_averaging": [], "averaging": {"gradients": {"success": 0, "failed": 0, "skipped": 0}},
            "evaluation": None, "visible_maddrs": [],
        }
        self._written = 0.0

    def record_round(self, outcome: str, duration: float, epoch: int) -> None:
        counts = self.data["averaging"]["gradients"]
        counts[outcome] += 1
        rounds = self.data["recent_averaging"]
        rounds.append({"kind": "gradients", "outcome": outcome, "duration_seconds": round(duration, 4), "epoch": epoch})
        del rounds[:-_RECENT_ROUNDS]

    def write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < 1.0:
            return
        self._written = now
        aside = self.path.with_suffix(".tmp")
        aside.write_text(json.dumps(self.data))
        os.replace(aside, self.path)


def _time_gradient_rounds(optimizer, report: _Report) -> None:
    """Record each gradient round's outcome and duration (what swarmd's averaging log records), by wrapping the
    one method where hivemind waits for a round; it changes nothing about the round itself."""
    original = optimizer._average_gradients_and_load_into_optimizer

    def timed(control):
        started = time.perf_counter()
        original(control)
        duration = time.perf_counter() - started
        if control is None:
            outcome = "skipped"
        else:
            outcome = "success" if control.done() and not control.cancelled() and control.exception() is None else "failed"
        report.record_round(outcome, duration, optimizer.local_epoch)

    optimizer._average_gradients_and_load_into_optimizer = timed


def start_dht(config, initial_peers: list[str], state_dir: Path):
    """hivemind.DHT, retrying the bootstrap as swarmd does (network.bootstrap_attempts): peers that start together
    may try to reach the first one before its p2pd listens, and hivemind gives up at the first failure."""
    import hivemind

    network = config.network
    delay = network.bootstrap_retry_delay
    for attempt in range(1, network.bootstrap_attempts + 1):
        try:
            return hivemind.DHT(
                start=True,
                host_maddrs=network.host_maddrs,
                initial_peers=initial_peers,
                identity_path=str(state_dir / "identity.key"),
            )
        except Exception as e:  # noqa: BLE001 - hivemind raises RuntimeError or P2PDaemonError here
            if attempt == network.bootstrap_attempts:
                raise
            print(f"DHT bootstrap attempt {attempt} failed ({e!r}); retrying in {delay:g} s", flush=True)
            time.sleep(delay)
            delay *= 2


def run(args) -> None:
    import hivemind
    import torch

    from swarmd.config import load_config
    from swarmd.config.task_resolver import use_task_resolver
    from swarmd.tasks.base import TaskContext
    from swarmd.tasks.registry import resolve_task

    use_task_resolver(resolve_task)
    config = load_config(args.config, environ={})
    state_dir = Path(args.state_dir)
    report = _Report(state_dir / STATUS_FILE)
    report.write(force=True)
    torch.set_num_threads(max(config.training.threads, 1))
    seed = config.training.seed or 0
    task = resolve_task(config.task.name)(
        config.task.settings,
        TaskContext(state_dir=state_dir, device=torch.device("cpu"), precision="fp32",
                    batch_size=config.training.batch_size, seed=seed),
    )
    task.prepare()
    torch.manual_seed(seed)
    model = task.build_model()

    dht = start_dht(config, args.initial_peers, state_dir)
    report.data["visible_maddrs"] = [str(addr) for addr in dht.get_visible_maddrs()]
    print(f"To join: swarmd join --initial-peers {report.data['visible_maddrs'][0]}", flush=True)
    optimizer = hivemind.Optimizer(
        dht=dht,
        run_id=config.run_id,
        target_batch_size=config.swarm.target_batch_size,
        batch_size_per_step=config.training.batch_size,
        optimizer=task.build_optimizer,
        params=task.parameter_groups(model),
        scheduler=task.build_scheduler,
        # hivemind 1.1.12 inverts this flag (optimizer.py l.205): without it a round never starts correctly
        client_mode=dht.client_mode,
        verbose=True,
        **optimizer_options(config, args.profile),
    )
    _time_gradient_rounds(optimizer, report)

    # a different data order per peer, as swarmd derives one from the peer id
    batches = iter(task.train_batches(seed + int.from_bytes(dht.peer_id.to_bytes()[-4:], "little")))
    every = task.eval_every_epochs
    epoch, epoch_losses = optimizer.local_epoch, []
    report.data["state"] = "training"
    while True:
        output = task.training_step(model, next(batches))
        output.loss.backward()
        step_started = time.perf_counter()
        optimizer.step()
        step_seconds = time.perf_counter() - step_started
        optimizer.zero_grad()
        epoch_losses.append(float(output.loss.detach()))
        data = report.data
        data["optimizer_seconds_total"] += step_seconds
        data["samples_total"] += output.batch_size
        data["steps_total"] += 1
        data["local_epoch"] = optimizer.local_epoch
        data["num_peers"] = optimizer.tracker.global_progress.num_peers
        if optimizer.local_epoch != epoch:
            data["loss"] = sum(epoch_losses) / len(epoch_losses)
            epoch, epoch_losses = optimizer.local_epoch, []
            task.set_epoch(epoch)
            if every and epoch % every == 0:
                data["evaluation"] = {"epoch": epoch, "metrics": task.evaluate(model)}
                model.train()
            report.write(force=True)
            if config.training.max_epochs and epoch >= config.training.max_epochs:
                break
        report.write()
    optimizer.shutdown()
    dht.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--initial-peers", action="append", default=[])
    parser.add_argument("--profile", choices=PROFILES, default="defaults")
    run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
