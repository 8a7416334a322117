"""The task plug-in interface: what a training task gives the daemon.

A task owns everything model- and data-specific: its settings (a pydantic `Config`), the model, the parameter
groups and inner optimizer, the LR schedule, the data, one training step and evaluation. The daemon owns
everything collaborative: the DHT, hivemind.Optimizer (which wraps the task's optimizer and steps its scheduler
once per GLOBAL epoch), precision, checkpoints and status.

Write one (see docs/TASKS.md):

    class MyTask(Task):
        name = "my-task"
        description = "what it trains"
        Config = MyConfig                      # a swarmd.config.StrictModel

        def build_model(self): ...
        def build_optimizer(self, param_groups): ...
        def train_batches(self, seed): ...     # an iterator of batches, shuffled by `seed`
        def training_step(self, model, batch): ...

and register it in your package's pyproject.toml:

    [project.entry-points."swarmd.tasks"]
    my-task = "my_package.module:MyTask"

Keep the module that defines the class light (import torch and friends inside methods or from a sub-module) so
`swarmd config validate` and `swarmd tasks` stay fast.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from swarmd.config.schema import StrictModel

if TYPE_CHECKING:  # pragma: no cover - typing only; torch is imported lazily
    import torch

__all__ = ["Task", "TaskContext", "StepOutput"]


@dataclass(frozen=True)
class TaskContext:
    """What the daemon tells a task about where and how it runs."""

    state_dir: Path  # a task may keep generated data and caches under state_dir / "data"
    device: "torch.device"
    precision: str  # fp32 | bf16 | fp16 (the worker handles autocast and loss scaling)
    batch_size: int  # samples per local step
    seed: int  # reproducible initialisation; the data order seed is passed to train_batches
    rank: int = 0  # this process's data-parallel rank inside the peer (training.devices), for exact sharding
    ranks: int = 1  # the peer's ranks; each draws its own batches (train_batches gets a per-rank seed)

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"


@dataclass
class StepOutput:
    loss: "torch.Tensor"  # scalar, with grad; the worker calls backward on it
    batch_size: int  # samples this step contributes toward the global target batch
    metrics: Optional[dict[str, float]] = None  # optional extras shown in status (e.g. accuracy)


class Task(ABC):
    """Base class of every training task. Instances are built once per daemon (and once per worker restart)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Config: ClassVar[type[StrictModel]]

    def __init__(self, settings: StrictModel, context: TaskContext):
        self.settings = settings
        self.context = context

    def prepare(self) -> None:
        """Check inputs (raise swarmd.errors.ConfigError with a clear line) and generate data if needed.

        Called once before anything is built, so a missing dataset is a config error, not a crash in a worker.
        """

    def prepare_auxiliary(self) -> None:
        """What an auxiliary peer runs instead of `prepare()`: it only helps average, never reads data, so it must
        start without the dataset. Set here whatever `build_model()` needs (e.g. a class count or vocabulary size
        the data would have told) from the settings, or raise ConfigError naming the setting that gives it.
        Default: nothing (a model whose shape the settings alone decide)."""

    @abstractmethod
    def build_model(self) -> "torch.nn.Module":
        """A freshly initialised model on the CPU (the worker moves it to the device)."""

    def parameter_groups(self, model: "torch.nn.Module") -> list[dict[str, Any]]:
        """Parameter groups for the optimizer. Default: weight decay on matrices only (not biases or norms)."""
        decay, no_decay = [], []
        for param in model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]

    @abstractmethod
    def build_optimizer(self, param_groups: list[dict[str, Any]]) -> "torch.optim.Optimizer":
        """The inner (local) optimizer; hivemind.Optimizer wraps it."""

    def build_scheduler(self, optimizer: "torch.optim.Optimizer") -> Optional["torch.optim.lr_scheduler.LRScheduler"]:
        """An LR schedule whose step is one GLOBAL epoch (hivemind steps it); warm-up/total in global epochs."""
        return None

    @abstractmethod
    def train_batches(self, seed: int) -> Iterator[Any]:
        """An endless iterator of training batches; `seed` makes the order this peer's own."""

    def resume_batches(self, seed: int, consumed: int) -> Iterator[Any]:
        """`train_batches(seed)` without its first `consumed` batches: where a peer resumed from a checkpoint
        continues its data. Default: draws and drops them, exact for any task whose batches depend only on `seed`
        but as slow as reading them; a task whose batches are expensive overrides it to skip without loading
        (`endless_batches(skip=...)` does)."""
        import itertools

        return itertools.islice(self.train_batches(seed), consumed, None)

    def set_epoch(self, epoch: int) -> None:
        """The global epoch this peer is now in (like DistributedSampler.set_epoch); called before the first batch
        and after every epoch change. Data that must follow the swarm's epochs (e.g. exact data-parallel shards)
        reads it; the default ignores it."""

    @abstractmethod
    def training_step(self, model: "torch.nn.Module", batch: Any) -> StepOutput:
        """Forward one batch (already on the device) and return its loss; the worker runs backward."""

    def evaluate(self, model: "torch.nn.Module") -> dict[str, float]:
        """Held-out metrics (e.g. top1/top5); {} when the task has none."""
        return {}

    @property
    def eval_every_epochs(self) -> int:
        """Evaluate every this many global epochs; 0 never."""
        return int(getattr(self.settings, "eval_every_epochs", 0) or 0)

    def extra_tensors(self, model: "torch.nn.Module") -> list["torch.Tensor"]:
        """Buffers to average and share with the parameters (e.g. BatchNorm running stats)."""
        return []

    def export_model(self, model: "torch.nn.Module", directory: Path) -> dict[str, Any]:
        """Write the trained `model` into `directory` in the form people load it with outside swarmd.

        `swarmd export` calls it after `prepare()` and `build_model()`, with the checkpoint's weights loaded, the
        model on the CPU in eval mode, and `directory` empty. It then adds swarmd-config.yaml and
        swarmd-export.json (names a task must not use). Return what goes under "model" in swarmd-export.json:
        at least "format" and "load", a Python expression that loads the result, with DIR for the directory.

        Default: the weights as model.safetensors (tied tensors stored once; safetensors.torch.load_model puts
        them back). Override it to write a library's own layout (ALBERT: save_pretrained; Swin: timm's).
        """
        from safetensors.torch import save_model

        save_model(model, str(directory / "model.safetensors"))
        return {
            "format": "safetensors",
            "files": ["model.safetensors"],
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "load": "safetensors.torch.load_model(model, DIR + '/model.safetensors')  # model: built as the task does",
        }
