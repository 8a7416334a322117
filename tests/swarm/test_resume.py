"""Reproducible and resumable: a seeded solo run of 2N steps and one stopped at N, checkpointed and resumed in a
fresh model, optimizer and worker reach the same parameters.

In-process (one DHT, SwarmOptimizer, the real TrainingWorker and Checkpointer), so it takes seconds. The task draws
from every global generator a task may use (torch's dropout, NumPy's and Python's noise), reads a seeded stream of
batches, and trains in fp16 with a loss scaler that grows every 2 steps (so it overflows and backs off during the
run): every part of the resume point (worker/resume.py) changes what the second half computes, and the test checks
that leaving any of them out does change the result, so it cannot pass by accident. The optimizer is AdamW with
weight decay, which also pins restore.reload_parameters: hivemind's set-up step on zero gradients used to decay the
resumed weights once more at every restart (a 1e-4 relative error here).

Why local updates and a target batch never reached: a solo peer's global epochs end when the tracker's view of its
own progress says so, which depends on timing; with local updates every step applies its own gradient at once, so
steps, not epochs, are the unit, and two runs do exactly the same arithmetic.
"""

import random
import shutil

import numpy as np
import torch

from swarmd.config.schema import StrictModel, SwarmdConfig
from swarmd.tasks.base import StepOutput, Task, TaskContext

N = 8  # steps per half
BATCH = 8
SEED = 5


class _NoisyTask(Task):
    name = "resume-probe"
    Config = StrictModel
    stop_after = None  # (worker, steps): ask the worker to stop once it has taken this many steps
    steps = 0

    def build_model(self):
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def build_optimizer(self, param_groups):
        return torch.optim.AdamW(param_groups, lr=0.01)

    def train_batches(self, seed):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(24, 16, generator=generator)  # 3 batches a pass: the run crosses passes
        y = torch.randn(24, 1, generator=generator)
        while True:
            order = torch.randperm(24, generator=generator)
            for start in range(0, 24, BATCH):
                rows = order[start : start + BATCH]
                yield x[rows], y[rows]

    def training_step(self, model, batch):
        x, y = batch
        x = x + float(np.random.normal()) * 0.1 + random.random() * 0.1  # augmentation-like draws
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        self.steps += 1
        worker, steps = self.stop_after
        if self.steps >= steps:
            worker.request_stop()
        return StepOutput(loss=loss, batch_size=x.shape[0])


def _config(run_id):
    return SwarmdConfig.model_validate({
        "run_id": run_id,
        "swarm": {
            "target_batch_size": 10**6, "use_local_updates": True, "matchmaking_time": 1.0,
            "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2},  # the first view comes sooner
        },
        "training": {"precision": "fp16", "batch_size": BATCH, "seed": SEED},
    })


def _train(dht, tmp_path, directory, steps, *, resume=False, leave_out=()):
    """One daemon's worth: seed, model, optional checkpoint, optimizer, worker; `steps` steps; a final save."""
    from swarmd.daemon.checkpointer import Checkpointer
    from swarmd.seeds import init_seed, peer_data_seed, seed_everything
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer
    from swarmd.worker.stats import WorkerStats
    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    config = _config(f"resume-{directory}")  # its own swarm: runs of the test do not see each other
    task = _NoisyTask(StrictModel(), TaskContext(tmp_path, torch.device("cpu"), "fp16", BATCH, SEED))
    seed_everything(init_seed(SEED, "resume"))
    model = task.build_model()
    # one run id for the whole test: a checkpoint of another run is (rightly) ignored
    checkpointer = Checkpointer(tmp_path / directory, run_id="resume", task=task.name, keep=2)
    checkpoint = checkpointer.load_into_model(model) if resume else None
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())
    try:
        point = None
        if checkpoint is not None:
            checkpointer.load_into_optimizer(optimizer, checkpoint, model)
            point = checkpointer.resume_point(checkpoint)
            for part in leave_out:  # the negative controls
                if part == "rng":
                    point.rng = {}
                else:
                    setattr(point, part, None)
        worker = TrainingWorker(
            task=task, model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config),
            stats=WorkerStats(), averaging_log=AveragingLog(), device=torch.device("cpu"),
            data_seed=peer_data_seed(SEED, "QmPeer"), resume=point,
        )
        if checkpoint is None:
            worker.precision.scaler._growth_interval = 2  # grows fast, overflows, backs off: state that matters
        task.stop_after = (worker, steps)
        worker.start()
        assert worker.join(60) and worker.failure is None, worker.failure
        checkpointer.save(model, optimizer, resume=worker.resume_point())
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, worker
    finally:
        optimizer.shutdown()


def _distance(a, b) -> float:
    return max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)


def test_a_run_stopped_and_resumed_reaches_the_parameters_of_one_that_was_not(dht, tmp_path):
    straight, straight_worker = _train(dht, tmp_path, "straight", 2 * N)
    first_half, _ = _train(dht, tmp_path, "resumed", N)
    first_half_dir = tmp_path / "copy"
    shutil.copytree(tmp_path / "resumed" / "checkpoints", first_half_dir)
    assert _distance(first_half, straight) > 1e-3  # the second half has work to do
    resumed, resumed_worker = _train(dht, tmp_path, "resumed", N, resume=True)

    assert _distance(resumed, straight) < 1e-6
    assert resumed_worker._batches_taken == straight_worker._batches_taken == 2 * N
    assert resumed_worker.precision.state_dict() == straight_worker.precision.state_dict()
    assert straight_worker.precision.loss_scale() < 65536.0 * 2 ** (2 * N // 2)  # it did overflow and back off

    # Each part of the resume point matters: resumed from the same first half without it, the run ends elsewhere.
    for part in ("rng", "loss_scaler", "data"):
        shutil.copytree(first_half_dir, tmp_path / f"without-{part}" / "checkpoints")
        other, _ = _train(dht, tmp_path, f"without-{part}", N, resume=True, leave_out=(part,))
        assert _distance(other, straight) > 1e-4, part


def test_a_resumed_peer_offers_its_state_at_its_epoch_at_once(dht, tmp_path):
    """hivemind offers a peer's state at its epoch only from its next global step; a peer resumed at epoch 3 that
    still offered 0 would look older than a fresh peer next to it (swarm/initial_state.py)."""
    from swarmd.checkpoints.store import Checkpoint
    from swarmd.checkpoints.restore import load_optimizer_state
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    task = _NoisyTask(StrictModel(), TaskContext(tmp_path, torch.device("cpu"), "fp32", BATCH, SEED))
    model = task.build_model()
    optimizer = build_swarm_optimizer(
        dht=dht, config=_config("resume-offer"), model=model, task=task, averaging_log=AveragingLog()
    )
    try:
        state = optimizer.state_dict()
        state["state"]["local_epoch"] = 3
        load_optimizer_state(optimizer, Checkpoint(tmp_path, 3, {}, model.state_dict(), state))
        assert optimizer.local_epoch == 3 and optimizer.state_averager.state_sharing_priority == 3
    finally:
        optimizer.shutdown()
