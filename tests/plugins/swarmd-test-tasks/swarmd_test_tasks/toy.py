"""toy-regression: a small MLP learns a fixed random teacher network from 16 inputs.

Data: `samples` inputs drawn once from a fixed seed, targets from the teacher plus noise. Two ways to read it:
- default: each peer shuffles with its own seed (what swarmd passes to train_batches), like any real task;
- `shard`: exact data-parallel shards. The swarm's batch of global epoch e (told by set_epoch) is slice e of one
  permutation (seeded by `shard.data_seed`), `shard.count` x batch_size rows long, and peer `shard.index` takes its
  part of it. Peers with batch b and count 2 thus see, together, exactly the rows one process with batch 2b and
  count 1 sees; so do ranks: a peer of 2 ranks with batch b reads, together, what one rank with batch 2b reads.
For exact equivalence runs the LR can be held at 0 ("frozen", steps paced by `frozen_step_seconds`) until the
swarm has formed: for `frozen_epochs` global epochs, or until `unfreeze_file` exists and names the first epoch to
train at. `start_file` holds the first batch back until it exists; `trace_path` records epoch and loss per step;
`dataset_file` stands for a dataset that prepare() requires (auxiliary peers skip prepare()).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from pydantic import Field

from swarmd.config.schema import StrictModel
from swarmd.errors import ConfigError
from swarmd.tasks.base import StepOutput, Task

__all__ = ["ToyRegressionTask", "ToySettings"]


class ShardConfig(StrictModel):
    index: int = Field(0, ge=0)
    count: int = Field(1, ge=1)
    data_seed: int = 0


class ToySettings(StrictModel):
    inputs: int = Field(16, ge=1)
    hidden: int = Field(32, ge=1)
    samples: int = Field(8192, ge=16)
    noise: float = Field(0.05, ge=0)
    lr: float = Field(0.2, gt=0, description="SGD learning rate (no momentum, no weight decay).")
    lr_decay: float = Field(0.1, ge=0, description="LR at global epoch e: lr / (1 + lr_decay * (e - frozen_epochs)).")
    frozen_epochs: int = Field(0, ge=0, description="Global epochs at LR 0 before the schedule starts.")
    unfreeze_file: Optional[str] = Field(
        None, description="Frozen until this file exists; it holds the first global epoch to train at."
    )
    frozen_step_seconds: float = Field(0.5, ge=0, description="Pause per step while frozen.")
    step_seconds: float = Field(0.0, ge=0, description="Pause per step once it trains (pacing: peers on few cores).")
    shard: Optional[ShardConfig] = None
    start_file: Optional[str] = Field(None, description="Wait for this file to exist before the first batch.")
    dataset_file: Optional[str] = Field(
        None, description="Stands for a dataset: prepare() fails (a ConfigError) when this file does not exist."
    )
    trace_path: Optional[str] = Field(None, description="Append '<epoch> <loss>' per step to this file.")


class ToyRegressionTask(Task):
    name = "toy-regression"
    description = "a small MLP regressing a random teacher network (plug-in example)"
    Config = ToySettings
    settings: ToySettings
    epoch = 0  # the swarm's global epoch (set_epoch); prepare() resets it

    def prepare(self) -> None:
        dataset = self.settings.dataset_file
        if dataset is not None and not Path(dataset).exists():
            raise ConfigError(f"task.dataset_file: {dataset} does not exist")
        shard = self.settings.shard
        if shard is not None and shard.index >= shard.count:
            raise ConfigError(f"task.shard.index: {shard.index} is not below task.shard.count {shard.count}")
        if shard is not None and self.context.batch_size * shard.count > self.settings.samples:
            raise ConfigError("task.samples: fewer samples than one global batch (batch_size x shard.count)")
        self.epoch = 0

    def _data(self):
        import torch

        s = self.settings
        generator = torch.Generator().manual_seed(1234)
        x = torch.randn(s.samples, s.inputs, generator=generator)
        w1 = torch.randn(s.inputs, s.hidden, generator=generator) / s.inputs**0.5
        w2 = torch.randn(s.hidden, 1, generator=generator) / s.hidden**0.5
        y = torch.tanh(x @ w1) @ w2 + s.noise * torch.randn(s.samples, 1, generator=generator)
        return x, y

    def build_model(self):
        import torch

        s = self.settings
        return torch.nn.Sequential(torch.nn.Linear(s.inputs, s.hidden), torch.nn.Tanh(), torch.nn.Linear(s.hidden, 1))

    def build_optimizer(self, param_groups):
        import torch

        return torch.optim.SGD(param_groups, lr=self.settings.lr)

    def build_scheduler(self, optimizer):
        from torch.optim.lr_scheduler import LambdaLR

        return LambdaLR(optimizer, self.lr_multiplier)

    def first_trained_epoch(self) -> float:
        if self.settings.unfreeze_file is None:
            return self.settings.frozen_epochs
        path = Path(self.settings.unfreeze_file)
        return int(path.read_text()) if path.exists() else float("inf")

    def lr_multiplier(self, epoch: int) -> float:
        start = self.first_trained_epoch()
        return 0.0 if epoch < start else 1.0 / (1.0 + self.settings.lr_decay * (epoch - start))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def train_batches(self, seed: int):
        import torch

        x, y = self._data()
        size = self.context.batch_size
        if self.settings.start_file:
            self._wait_for(Path(self.settings.start_file))
        shard = self.settings.shard
        if shard is None:
            generator = torch.Generator().manual_seed(seed)
            while True:
                order = torch.randperm(len(x), generator=generator)
                for start in range(0, len(x) - size + 1, size):
                    rows = order[start : start + size]
                    yield x[rows], y[rows]
        # a peer of several ranks (training.devices) splits its part further: rank r of R reads slot r of R
        count, index = shard.count * self.context.ranks, shard.index * self.context.ranks + self.context.rank
        per_epoch = size * count  # rows of the swarm's batch in one global epoch
        batches_per_pass = len(x) // per_epoch
        orders = {}
        while True:
            data_pass, slot = divmod(self.epoch, batches_per_pass)
            if data_pass not in orders:
                generator = torch.Generator().manual_seed(shard.data_seed + data_pass)
                orders = {data_pass: torch.randperm(len(x), generator=generator)}
            start = slot * per_epoch + index * size
            rows = orders[data_pass][start : start + size]
            yield x[rows], y[rows]

    def training_step(self, model, batch) -> StepOutput:
        import torch

        frozen = self.epoch < self.first_trained_epoch()
        pause = self.settings.frozen_step_seconds if frozen else self.settings.step_seconds
        if pause:
            time.sleep(pause)
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        if self.settings.trace_path:
            with open(self.settings.trace_path, "a") as f:
                f.write(f"{self.epoch} {loss.item():.9e}\n")
        return StepOutput(loss=loss, batch_size=x.shape[0])

    @staticmethod
    def _wait_for(path: Path, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
            time.sleep(0.05)
