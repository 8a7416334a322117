"""ALBERT data: prepared sentence-order pairs, masked per batch by transformers' MLM collator; the loss; evaluation."""

from __future__ import annotations

import itertools

import torch
from transformers import DataCollatorForLanguageModeling

from swarmd.tasks.base import StepOutput
from swarmd.tasks.loader import endless_batches

__all__ = ["train_batches", "training_step", "evaluate"]


def _collator(task, seed: int) -> DataCollatorForLanguageModeling:
    data = task.settings.data
    if not hasattr(task, "_tokenizer"):
        task._tokenizer = task.prepared.tokenizer()
    return DataCollatorForLanguageModeling(
        tokenizer=task._tokenizer,
        mlm_probability=data.mlm_probability,
        pad_to_multiple_of=data.pad_to_multiple_of,
        seed=seed,  # the masks are this peer's own too (DataLoader workers add their id)
    )


def train_batches(task, seed: int, skip: int = 0):
    data = task.settings.data
    return endless_batches(
        task.prepared.split("train"),
        batch_size=task.context.batch_size,
        seed=seed,
        skip=skip,
        num_workers=data.num_workers,
        pin_memory=task.context.device.type == "cuda",
        collate_fn=_collator(task, seed),
    )


def training_step(model, batch) -> StepOutput:
    outputs = model(**batch)
    with torch.no_grad():
        labels = batch["labels"]
        masked = labels != -100
        mlm_accuracy = (outputs.prediction_logits[masked].argmax(dim=-1) == labels[masked]).float().mean()
        sop_accuracy = (outputs.sop_logits.argmax(dim=-1) == batch["sentence_order_label"]).float().mean()
    return StepOutput(
        loss=outputs.loss,
        batch_size=labels.shape[0],
        metrics={"mlm_accuracy": mlm_accuracy.item(), "sop_accuracy": sop_accuracy.item()},
    )


@torch.no_grad()
def evaluate(task, model) -> dict[str, float]:
    """MLM loss/accuracy and SOP accuracy on the validation split, masked with a fixed seed (comparable runs)."""
    if "validation" not in task.prepared.splits:
        return {}
    if not hasattr(task, "_val_split"):
        task._val_split = task.prepared.split("validation")
    # a fresh collator each time: the same masks at every evaluation
    loader = torch.utils.data.DataLoader(
        task._val_split, batch_size=task.context.batch_size, shuffle=False, collate_fn=_collator(task, seed=0)
    )
    device = task.context.device
    was_training = model.training
    model.eval()
    loss_sum = mlm_correct = mlm_total = sop_correct = seen = 0.0
    try:
        for batch in itertools.islice(loader, task.settings.eval_max_batches):
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            outputs = model(**batch)
            labels, masked = batch["labels"], batch["labels"] != -100
            size = labels.shape[0]
            loss_sum += outputs.loss.float().item() * size
            mlm_correct += (outputs.prediction_logits[masked].argmax(dim=-1) == labels[masked]).sum().item()
            mlm_total += masked.sum().item()
            sop_correct += (outputs.sop_logits.argmax(dim=-1) == batch["sentence_order_label"]).sum().item()
            seen += size
    finally:
        model.train(was_training)
    if seen == 0:
        return {}
    return {
        "val_loss": loss_sum / seen,
        "mlm_accuracy": mlm_correct / max(1.0, mlm_total),
        "sop_accuracy": sop_correct / seen,
        "val_samples": seen,
    }
