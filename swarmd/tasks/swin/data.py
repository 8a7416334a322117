"""Swin data: timm's ImageNet transforms over an image folder, mixup/cutmix, the loss and evaluation."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from timm.data import Mixup, create_transform
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torchvision.datasets import ImageFolder

from swarmd.tasks.base import StepOutput
from swarmd.tasks.loader import endless_batches

__all__ = ["train_batches", "train_transform", "training_step", "evaluate"]


def _img_size(task) -> int:
    return task.settings.model.img_size or 224


def train_batches(task, seed: int, skip: int = 0):
    data = task.settings.data
    if data.source == "synthetic":
        import itertools

        return itertools.islice(_synthetic_batches(task, seed), skip, None)  # cheap to draw: no skip needed
    dataset = ImageFolder(str(task.image_root / "train"), transform=train_transform(task))
    return endless_batches(
        dataset,
        batch_size=task.context.batch_size,
        seed=seed,
        skip=skip,
        num_workers=data.num_workers,
        pin_memory=task.context.device.type == "cuda",
    )


def train_transform(task):
    """timm's ImageNet training transform with the Swin recipe's arguments (microsoft/Swin-Transformer
    data/build.py): random resized crop and flip, RandAugment, bicubic, ImageNet mean/std, and random erasing in
    `pixel` mode (per-pixel normal noise; timm's default `const` fills zeros), one box per image."""
    data = task.settings.data
    return create_transform(
        _img_size(task),
        is_training=True,
        auto_augment=data.randaugment,
        re_prob=data.random_erasing,
        re_mode="pixel",
        re_count=1,
        interpolation="bicubic",
    )


def _synthetic_batches(task, seed: int):
    """Random images and labels made on the device: measures the training path without any decoding."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    size, batch = _img_size(task), task.context.batch_size
    images = torch.randn(batch, 3, size, size, generator=generator)
    while True:
        labels = torch.randint(0, task.num_classes, (batch,), generator=generator)
        yield images, labels


def _mixup(task):
    if not hasattr(task, "_mixup_fn"):
        data = task.settings.data
        active = data.mixup > 0 or data.cutmix > 0
        task._mixup_fn = (
            Mixup(
                mixup_alpha=data.mixup,
                cutmix_alpha=data.cutmix,
                label_smoothing=data.label_smoothing,
                num_classes=task.num_classes,
            )
            if active
            else None
        )
    return task._mixup_fn


def training_step(task, model, batch) -> StepOutput:
    images, targets = batch
    device = task.context.device
    images = images.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    if device.type == "cuda" and task.settings.model.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    mixup = _mixup(task)
    if mixup is not None and images.shape[0] % 2 == 0:
        images, soft_targets = mixup(images, targets)
        loss = SoftTargetCrossEntropy()(model(images), soft_targets)
        return StepOutput(loss=loss, batch_size=images.shape[0])
    logits = model(images)
    if task.settings.data.label_smoothing > 0:
        loss = LabelSmoothingCrossEntropy(task.settings.data.label_smoothing)(logits, targets)
    else:
        loss = F.cross_entropy(logits, targets)
    accuracy = (logits.argmax(dim=-1) == targets).float().mean().item()
    return StepOutput(loss=loss, batch_size=images.shape[0], metrics={"train_accuracy": accuracy})


@torch.no_grad()
def evaluate(task, model) -> dict[str, float]:
    settings = task.settings
    if not hasattr(task, "_val_loader"):
        transform = create_transform(
            _img_size(task), is_training=False, crop_pct=settings.data.crop_pct, interpolation="bicubic"
        )
        dataset = ImageFolder(str(task.image_root / "val"), transform=transform)
        task._val_loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=task.context.batch_size,
            shuffle=False,
            num_workers=settings.data.num_workers,
            pin_memory=task.context.device.type == "cuda",
        )
    device = task.context.device
    was_training = model.training
    model.eval()
    correct1 = correct5 = seen = 0
    loss_sum = 0.0
    try:
        for images, targets in itertools.islice(task._val_loader, settings.eval_max_batches):
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            logits = model(images).float()
            loss_sum += F.cross_entropy(logits, targets, reduction="sum").item()
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            correct1 += (top[:, 0] == targets).sum().item()
            correct5 += (top == targets[:, None]).any(dim=-1).sum().item()
            seen += targets.shape[0]
    finally:
        model.train(was_training)
    if seen == 0:
        return {}
    return {"top1": correct1 / seen, "top5": correct5 / seen, "val_loss": loss_sum / seen, "val_samples": float(seen)}
