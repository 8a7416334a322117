"""A run of steps with non-finite gradients (a model that diverged): bounded log lines, the last good parameters back."""

import logging

import pytest
import torch

from fake_task import CpuTask, FakeOptimizer
from swarmd.config.loader import load_config
from swarmd.tasks.base import StepOutput
from swarmd.worker.stats import WorkerStats
from swarmd.worker.trainer import _NONFINITE_RESTORE_AFTER, _NONFINITE_SAID_EVERY, TrainingWorker, WorkerSettings

STEPS = 2 * _NONFINITE_SAID_EVERY + 10


def test_a_run_of_non_finite_gradients_is_said_now_and_then_and_puts_the_last_good_parameters_back(caplog):
    model = torch.nn.Linear(2, 1)
    start = [p.detach().clone() for p in model.parameters()]
    model.weight.register_hook(lambda grad: grad * float("inf"))  # finite loss, infinite gradient: diverged
    restored, steps = [], []

    class Task(CpuTask):
        batch = torch.ones(4, 2)

        def training_step(self, model, batch):
            steps.append(1)
            with torch.no_grad():
                model.bias.add_(1.0)  # as a diverging model moves: the restore must undo it
            return StepOutput(loss=model(batch).sum(), batch_size=4)

    class Optimizer(FakeOptimizer):
        def step(self, batch_size=None, grad_scaler=None):
            raise AssertionError("a non-finite step was handed to the swarm")

        @torch.no_grad()
        def restore_parameters(self, saved):
            restored.append(len(steps))
            for value, param in zip(saved, self.state_averager.main_parameters):
                param.copy_(value)

    config = load_config(None, environ={}, assignments=[])
    stats = WorkerStats()
    worker = TrainingWorker(
        task=Task(), model=model, optimizer=Optimizer(model), settings=WorkerSettings.from_config(config), stats=stats,
        averaging_log=None, device=torch.device("cpu"), data_seed=0,
    )
    worker._take_backup()  # as the worker does once it has joined
    batches = Task().train_batches(0)
    with caplog.at_level(logging.WARNING, logger="swarmd.worker.trainer"):
        for _ in range(STEPS):
            worker._step(batches)

    assert len(steps) == STEPS and stats.nonfinite_steps_total == STEPS
    said = [r.getMessage() for r in caplog.records if "Non-finite loss or gradients" in r.getMessage()]
    assert len(said) == 3 and said[-1].endswith(f"({2 * _NONFINITE_SAID_EVERY} in a row)"), said
    every = _NONFINITE_RESTORE_AFTER
    assert restored == list(range(every, STEPS + 1, every)) and stats.restores_total == len(restored)
    # the last restore put back the parameters of the start; the steps after it moved the bias again
    assert torch.equal(model.weight.detach(), start[0])
    assert float(model.bias) == pytest.approx(float(start[1]) + STEPS - restored[-1])
