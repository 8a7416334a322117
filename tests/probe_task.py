"""A tiny task for the in-process swarm tests that build hivemind's optimizer (or the worker) on a real DHT and feed
it batches or gradients themselves: a few-parameter MLP, plain SGD, no data of its own."""

from __future__ import annotations

from pathlib import Path

import torch

from swarmd.config.schema import StrictModel
from swarmd.tasks.base import StepOutput, Task, TaskContext

__all__ = ["ProbeTask", "probe_model", "make_probe"]


def probe_model(widths: tuple[int, ...] = (16, 8, 1)) -> torch.nn.Sequential:
    """Linear layers between consecutive widths with Tanh between them, from seed 0: every peer builds the same."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for index, (inputs, outputs) in enumerate(zip(widths, widths[1:])):
        if index:
            layers.append(torch.nn.Tanh())
        layers.append(torch.nn.Linear(inputs, outputs))
    return torch.nn.Sequential(*layers)


class ProbeTask(Task):
    """Subclass it with a `name` of its own (the run's records carry the task name) and the `lr` or `widths` the
    test needs."""

    name = "probe"
    Config = StrictModel
    lr = 0.1
    widths: tuple[int, ...] = (16, 8, 1)

    def build_model(self):
        return probe_model(self.widths)

    def build_optimizer(self, param_groups):
        return torch.optim.SGD(param_groups, lr=self.lr)

    def train_batches(self, seed):
        raise NotImplementedError("the test feeds the batches (or the gradients) itself")

    def training_step(self, model, batch):
        x, y = batch
        return StepOutput(loss=torch.nn.functional.mse_loss(model(x).float(), y), batch_size=x.shape[0])


def make_probe(task_class: type[ProbeTask], state_dir: Path, batch_size: int, precision: str = "fp32") -> ProbeTask:
    return task_class(StrictModel(), TaskContext(state_dir, torch.device("cpu"), precision, batch_size, 0))
