"""Swin / SwinV2 image classification on an ImageNet-style folder (timm).

The defaults are the micro config: a ~0.5M-parameter Swin on a generated folder of 32x32 shape images, which
trains on a CPU in seconds. configs/swin-t-imagenet.yaml is the real run (Swin-T, 224px, ImageNet, LAMB).
This module stays light; the model and data code is imported when the task is built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from swarmd.config.schema import StrictModel
from swarmd.errors import ConfigError
from swarmd.tasks.base import StepOutput, Task
from swarmd.tasks.optim import OptimConfig, build_optimizer, build_scheduler

__all__ = ["SwinTask", "SwinConfig"]


class SwinModelConfig(StrictModel):
    name: str = Field("swin_tiny_patch4_window7_224", description="Any timm Swin/SwinV2 architecture name.")
    img_size: Optional[int] = Field(32, ge=8, description="Input resolution; null: the architecture's own.")
    patch_size: Optional[int] = Field(4, ge=1, description="null: the architecture's own (same for the next keys).")
    embed_dim: Optional[int] = Field(64, ge=8)
    depths: Optional[list[int]] = Field([2, 2], min_length=1)
    num_heads: Optional[list[int]] = Field([2, 4], min_length=1)
    window_size: Optional[int] = Field(4, ge=1)
    drop_path_rate: float = Field(0.0, ge=0, lt=1)
    num_classes: Optional[int] = Field(
        None, ge=2, description="Classes of the head; null: counted from the data. Auxiliary peers do not read the "
        "data, so with a folder dataset they need it (1000 for ImageNet-1k).",
    )
    pretrained_file: Optional[str] = Field(None, description="Local .safetensors/.pth weights to start from.")
    fused_attention: bool = Field(True, description="Attention through torch's scaled_dot_product_attention.")
    grad_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    channels_last: bool = Field(True, description="channels_last memory format on CUDA.")

    @model_validator(mode="after")
    def _check_dims(self) -> "SwinModelConfig":
        if (self.depths is None) != (self.num_heads is None):
            raise ValueError("set depths and num_heads together")
        if self.depths is not None and len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths has {len(self.depths)} stages but num_heads has {len(self.num_heads)}")
        return self

    def overrides(self) -> dict[str, Any]:
        """The explicit dimensions, passed to timm.create_model on top of the architecture's defaults."""
        keys = ("img_size", "patch_size", "embed_dim", "depths", "num_heads", "window_size")
        values = {key: getattr(self, key) for key in keys if getattr(self, key) is not None}
        for key in ("depths", "num_heads"):
            if key in values:
                values[key] = tuple(values[key])
        return values


class GeneratedDataConfig(StrictModel):
    num_classes: int = Field(10, ge=2, le=10)
    train_per_class: int = Field(200, ge=1)
    val_per_class: int = Field(40, ge=1)


class SwinDataConfig(StrictModel):
    source: Literal["folder", "generated", "synthetic"] = Field(
        "generated",
        description="folder: an ImageNet-style root (train/<class>/*, val/<class>/*); generated: shape images "
        "swarmd draws into the state dir; synthetic: random tensors (throughput benchmarks, no decoding).",
    )
    path: Optional[str] = Field(
        None,
        description="Root of the image folder (source: folder); for source: generated, where to generate it "
        "(default: <state_dir>/data), so several local peers can share one copy.",
    )
    generated: GeneratedDataConfig = Field(default_factory=GeneratedDataConfig)
    synthetic_classes: int = Field(1000, ge=2, description="Classes of the synthetic source.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (8+ for ImageNet on a GPU box).")
    randaugment: Optional[str] = Field(None, description="timm RandAugment spec, e.g. rand-m9-mstd0.5-inc1.")
    random_erasing: float = Field(0.0, ge=0, le=1, description="Probability of random erasing.")
    mixup: float = Field(0.0, ge=0, description="Mixup alpha (0: off).")
    cutmix: float = Field(0.0, ge=0, description="CutMix alpha (0: off).")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    crop_pct: float = Field(0.875, gt=0, le=1, description="Eval center-crop fraction.")

    @model_validator(mode="after")
    def _check_source(self) -> "SwinDataConfig":
        if self.source == "folder" and not self.path:
            raise ValueError("data.source is folder but data.path is not set; point it at the ImageNet root")
        return self


class SwinConfig(StrictModel):
    model: SwinModelConfig = Field(default_factory=SwinModelConfig)
    data: SwinDataConfig = Field(default_factory=SwinDataConfig)
    optim: OptimConfig = Field(
        default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.05, warmup_epochs=2, total_epochs=200)
    )
    eval_every_epochs: int = Field(5, ge=0, description="Top-1/top-5 on the val split every N global epochs; 0: never.")
    eval_max_batches: int = Field(20, ge=1, description="Bound on the batches one evaluation reads.")


class SwinTask(Task):
    name = "swin"
    description = "Swin/SwinV2 image classification on an ImageNet-style folder (timm)"
    Config = SwinConfig
    settings: SwinConfig

    def prepare(self) -> None:
        data = self.settings.data
        if data.source == "generated":
            from swarmd.tasks.swin.generated import ensure_generated_folder

            generated = data.generated
            self._root = ensure_generated_folder(
                Path(data.path).expanduser() if data.path else self.context.data_dir,
                num_classes=generated.num_classes,
                train_per_class=generated.train_per_class,
                val_per_class=generated.val_per_class,
                image_size=self.settings.model.img_size or 224,
            )
        elif data.source == "folder":
            self._root = Path(data.path).expanduser()
            for split in ("train", "val"):
                _check_split(self._root / split, required=(split == "train"))
        else:
            self._root = None
        self.num_classes = self._count_classes()
        configured = self.settings.model.num_classes
        if configured is not None and configured != self.num_classes:
            raise ConfigError(
                f"task.model.num_classes: {configured}, but the data has {self.num_classes} classes; "
                "leave it unset or make them agree"
            )
        self._check_one_batch_fits()

    def prepare_auxiliary(self) -> None:
        self._root = None  # never read: an auxiliary peer neither trains nor evaluates
        data = self.settings.data
        if self.settings.model.num_classes is not None:
            self.num_classes = self.settings.model.num_classes
        elif data.source == "synthetic":
            self.num_classes = data.synthetic_classes
        elif data.source == "generated":
            self.num_classes = data.generated.num_classes
        else:
            raise ConfigError(
                "task.model.num_classes: an auxiliary peer does not read the data, so it cannot count the classes "
                f"of {data.path}; set it to the trainers' class count (1000 for ImageNet-1k)"
            )

    def _check_one_batch_fits(self) -> None:
        """Training draws whole batches only: a folder with fewer images than one batch can never train."""
        if self._root is None:
            return
        batch = self.context.batch_size
        found = _count_images(self._root / "train", stop_at=batch)
        if found < batch:
            raise ConfigError(
                f"training.batch_size: {batch} is more than the {found} training images in {self._root / 'train'}; "
                "lower the batch size or add images"
            )

    def _count_classes(self) -> int:
        if self._root is None:
            return self.settings.data.synthetic_classes
        return sum(1 for p in (self._root / "train").iterdir() if p.is_dir())

    def build_model(self):
        from swarmd.tasks.swin.model import build_swin

        return build_swin(self.settings.model, self.num_classes, self.context.device)

    def parameter_groups(self, model):
        from swarmd.tasks.swin.model import weight_decay_groups

        return weight_decay_groups(model, self.settings.optim.weight_decay)

    def build_optimizer(self, param_groups):
        return build_optimizer(self.settings.optim, param_groups)

    def build_scheduler(self, optimizer):
        return build_scheduler(self.settings.optim, optimizer)

    def train_batches(self, seed: int):
        from swarmd.tasks.swin import data

        return data.train_batches(self, seed)

    def resume_batches(self, seed: int, consumed: int):
        from swarmd.tasks.swin import data

        return data.train_batches(self, seed, skip=consumed)

    def training_step(self, model, batch) -> StepOutput:
        from swarmd.tasks.swin import data

        return data.training_step(self, model, batch)

    def evaluate(self, model) -> dict[str, float]:
        if self._root is None or not (self._root / "val").is_dir():
            return {}
        from swarmd.tasks.swin import data

        return data.evaluate(self, model)

    def export_model(self, model, directory: Path) -> dict:
        """timm's own layout (save_for_hf): model.safetensors and a config.json holding the architecture name and
        the arguments that rebuild it, so `timm.create_model("local-dir:DIR", pretrained=True)` loads it."""
        from swarmd.tasks.swin.model import export_for_timm

        # explicit, so the architecture arguments are recorded whatever this timm records by itself
        model_args = {key: list(v) if isinstance(v, tuple) else v for key, v in self.settings.model.overrides().items()}
        return export_for_timm(
            model, directory, model_args={**model_args, "num_classes": self.num_classes},
            data_config=self.data_config(),
        )

    def data_config(self) -> dict:
        """The preprocessing this run evaluates with (swin/data.py), in timm's pretrained_cfg keys."""
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        size = self.settings.model.img_size or 224
        return {
            "input_size": (3, size, size), "interpolation": "bicubic", "crop_pct": self.settings.data.crop_pct,
            "crop_mode": "center", "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        }

    @property
    def image_root(self) -> Optional[Path]:
        return self._root


def _check_split(path: Path, *, required: bool) -> None:
    if not path.is_dir():
        if required:
            raise ConfigError(
                f"task.data.path: {path} does not exist; the image folder needs train/<class>/*.JPEG "
                "(and val/<class>/*.JPEG for evaluation)"
            )
        return
    classes = [p for p in path.iterdir() if p.is_dir()]
    if not classes:
        raise ConfigError(f"task.data.path: {path} has no class folders; expected {path}/<class>/<image files>")
    if not any(f.is_file() for c in classes for f in c.iterdir()):
        raise ConfigError(f"task.data.path: the class folders in {path} hold no images")


def _count_images(path: Path, *, stop_at: int) -> int:
    """Image files under path/<class>/, counted up to `stop_at` (an ImageNet folder need not be walked whole)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    count = 0
    for folder in sorted(p for p in path.iterdir() if p.is_dir()):
        for entry in os.scandir(folder):
            if entry.is_file() and entry.name.lower().endswith(IMG_EXTENSIONS):
                count += 1
                if count >= stop_at:
                    return count
    return count
