"""The main loop of a compute rank (rank >= 1): build the task and model, then step when rank 0 says so.

A compute rank has no DHT, no p2pd, no hivemind at all: it never imports hivemind. It builds the task and the
model from the same validated config and init seed as rank 0, joins the process group, and then, until rank 0
says stop: receive the control (and the parameters when rank 0's changed), compute forward and backward on its
own shard of the data (seed: swarmd.ranks.layout.rank_data_seed), average the gradients with the other ranks.

Spawned by the daemon (swarmd.ranks.group.RankGroup) as `python -m swarmd.ranks.compute_rank SPEC RANK`. It
ignores SIGINT and SIGTERM: rank 0 stops it in order, and it gets SIGKILL if rank 0 dies (PR_SET_PDEATHSIG).
Exit codes: 0 stopped by rank 0, 1 failed (one line naming the rank and device first), 2 configuration error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarmd.errors import ConfigError, ExitCode

__all__ = ["main", "load_rank_config", "run_compute_rank", "run_torchrun_rank"]

logger = logging.getLogger("swarmd.ranks")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m swarmd.ranks.compute_rank SPEC_JSON RANK (started by the swarmd daemon)", file=sys.stderr)
        return int(ExitCode.USAGE)
    # Before anything slow: rank 0 orders the stop, so the signals systemd or a terminal send to all are ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    rank = int(argv[1])
    device = spec["devices"][rank]

    from swarmd.logs import configure_logging

    try:
        config = load_rank_config(spec["config_path"])
    except ConfigError as e:
        print(f"swarmd: rank {rank} ({device}): {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    configure_logging(config.logging.level, config.logging.format)

    def join_group() -> None:
        from datetime import timedelta

        import torch.distributed as dist

        from swarmd.ranks.group import ready_key

        store = dist.FileStore(spec["store"], len(spec["devices"]))
        store.set(ready_key(rank), "1")
        dist.init_process_group(
            spec["backend"],
            store=store,
            rank=rank,
            world_size=len(spec["devices"]),
            timeout=timedelta(seconds=spec["timeout"]),
        )
        dist.barrier()

    return run_compute_rank(
        config,
        rank=rank,
        world_size=len(spec["devices"]),
        device=device,
        join_group=join_group,
        init_seed=spec["init_seed"],
        threads=spec["threads"],
    )


def load_rank_config(path: str):
    """The daemon's effective config (SwarmdConfig.to_dict() as JSON), validated again in this process. Not through
    the YAML reader: YAML 1.1 reads JSON's 1e-08 as a string."""
    from swarmd.config.loader import load_config
    from swarmd.config.task_resolver import use_task_resolver
    from swarmd.tasks.registry import resolve_task

    use_task_resolver(resolve_task)  # this process's own: the config layer does not import the tasks
    data = json.loads(Path(path).read_text())
    return load_config(None, environ={}, flags=data)  # top-level keys as the highest layer: exactly this config


def run_torchrun_rank(config, place, environ) -> int:
    """A rank >= 1 that torchrun started (`swarmd join` dispatches here when RANK is not 0): the same loop, joined
    through torchrun's rendezvous. It keeps torchrun's signals: torchrun's agent stops it."""
    from datetime import timedelta

    import torch

    from swarmd.logs import configure_logging
    from swarmd.ranks.group import rank_timeouts
    from swarmd.ranks.layout import torchrun_device, torchrun_init_method
    from swarmd.seeds import init_seed

    configure_logging(config.logging.level, config.logging.format)
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = torchrun_device(config.training, place, cuda_count=cuda_count)
    init_method = torchrun_init_method(environ)

    def join_group() -> None:
        import torch.distributed as dist

        dist.init_process_group(
            "nccl" if device.startswith("cuda") else "gloo",
            init_method=init_method,
            rank=place.rank,
            world_size=place.world_size,
            timeout=timedelta(seconds=rank_timeouts(config)[1]),
        )
        dist.barrier()

    return run_compute_rank(
        config,
        rank=place.rank,
        world_size=place.world_size,
        device=device,
        join_group=join_group,
        init_seed=init_seed(config.training.seed, config.run_id),
        threads=config.training.threads,
    )


def run_compute_rank(
    config,
    *,
    rank: int,
    world_size: int,
    device: str,
    join_group: Callable[[], None],
    init_seed: int,
    threads: int = 0,
) -> int:
    """Build, join, step until stopped. `join_group` initialises torch.distributed (a FileStore when the daemon
    spawned this rank, env:// under torchrun). Returns the exit code."""
    where = f"rank {rank} ({device})"
    try:
        import torch.distributed as dist

        task, model, precision = _build_replica(
            config, rank=rank, world_size=world_size, device=device, init_seed=init_seed, threads=threads
        )
        join_group()
        steps = _step_with_rank_0(task, model, precision, rank=rank, world_size=world_size, where=where)
        logger.info("%s stopped after %d steps", where, steps)
        dist.destroy_process_group()
        return int(ExitCode.OK)
    except ConfigError as e:
        logger.error("%s: %s", where, e)
        return int(ExitCode.USAGE)
    except Exception as e:  # noqa: BLE001 - one line for rank 0's log, the traceback for the report
        logger.exception("%s failed: %s", where, e)
        return int(ExitCode.FAILURE)


def _build_replica(config, *, rank: int, world_size: int, device: str, init_seed: int, threads: int):
    """(task, model, precision) of this rank: the task and model from the same config and init seed as rank 0's."""
    import torch

    from swarmd.ranks.precision import make_precision
    from swarmd.tasks.registry import build_task

    if threads:
        torch.set_num_threads(threads)
    torch_device = torch.device(device)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    training = config.training
    task = build_task(config, device=torch_device, seed=init_seed, rank=rank, ranks=world_size)
    task.prepare()
    torch.manual_seed(init_seed)
    model = task.build_model().to(torch_device)
    model.train()
    # autocast only: the loss scale comes from rank 0 with every step (reuse_grad_buffers=False keeps
    # hivemind's GradScaler, and so hivemind, out of this process)
    precision = make_precision(training.precision, model=model, device=torch_device, reuse_grad_buffers=False)
    return task, model, precision


def _step_with_rank_0(task, model, precision, *, rank: int, world_size: int, where: str) -> int:
    """In the process group: step whenever rank 0 says so, until it says stop; returns the steps taken."""
    from swarmd.ranks.batches import move_to_device
    from swarmd.ranks.layout import rank_data_seed
    from swarmd.ranks.step_sync import StepSync, share_data_seed
    from swarmd.seeds import seed_own_generators

    device = task.context.device
    data_seed = share_data_seed(None, rank=rank, device=device)
    sync = StepSync(model, rank=rank, world_size=world_size, device=device)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("%s ready: %d parameters, batch %d", where, parameters, task.context.batch_size)

    own_seed = rank_data_seed(data_seed, rank)
    seed_own_generators(own_seed)  # this rank's drop-path masks and augmentations, not rank 0's (seeds.py)
    batches = iter(task.train_batches(own_seed))
    epoch = None
    while True:
        control = sync.follow()
        if control is None:
            return sync.steps_total
        if control.epoch != epoch:
            epoch = control.epoch
            task.set_epoch(epoch)
        batch = move_to_device(next(batches), device)
        with precision.autocast():
            output = task.training_step(model, batch)
        loss = output.loss
        (loss * control.loss_scale if control.loss_scale != 1.0 else loss).backward()
        sync.average_gradients(samples=output.batch_size, loss=float(loss.detach().float().item()))


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: unloading torch took 4-10 s on a loaded 2-core box, time rank 0's
    bounded stop would spend waiting; the process group is already left and nothing else needs cleaning up."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
