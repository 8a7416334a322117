"""The training recipes, exactly: which parameters decay, the augmentations (mixup/cutmix, label smoothing, random
erasing) on tiny generated tensors, and the LR schedules of the shipped full-size configs at the recipes' own
numbers (Swin: microsoft/Swin-Transformer config.py; ALBERT: hivemind's examples/albert). docs/TASKS.md has the
tables these check."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from swarmd.config import load_config
from swarmd.tasks.albert import AlbertSettings, AlbertTask
from swarmd.tasks.base import TaskContext
from swarmd.tasks.registry import resolve_task
from swarmd.tasks.swin import SwinConfig, SwinTask

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONTEXT = TaskContext(Path("/nonexistent"), torch.device("cpu"), "fp32", 8, 0)


def _decayed(task, model) -> tuple[set[str], set[str]]:
    """(names with weight decay, names without) in the groups the task hands the optimizer."""
    names = {id(p): name for name, p in model.named_parameters()}
    decay, no_decay = set(), set()
    for group in task.parameter_groups(model):
        assert "weight_decay" in group  # every group says its own; none inherits the optimizer's by accident
        (decay if group["weight_decay"] > 0 else no_decay).update(names[id(p)] for p in group["params"])
    assert len(decay) + len(no_decay) == len(names)
    return decay, no_decay


def test_swin_decays_its_matrices_only_not_biases_norms_or_relative_position_tables():
    from swarmd.tasks.swin.model import build_swin

    task = SwinTask(SwinConfig(), CONTEXT)
    model = build_swin(task.settings.model, num_classes=10, device="cpu")
    decay, no_decay = _decayed(task, model)
    assert {name for name in no_decay if "relative_position_bias_table" in name} == {
        f"layers.{stage}.blocks.{block}.attn.relative_position_bias_table" for stage in (0, 1) for block in (0, 1)
    }  # model.no_weight_decay(), as Swin's set_weight_decay and timm skip them
    assert all(name.endswith(("weight", "relative_position_bias_table", "bias")) for name in no_decay)
    assert {name for name in no_decay if name.endswith("weight")} == {  # the norms' scales
        f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)
    }
    assert decay == {  # every linear layer's and the patch embedding's weight, nothing else
        f"{name}.weight" for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d))
    }
    weight_decay = {group["weight_decay"] for group in task.parameter_groups(model)}
    assert weight_decay == {0.0, task.settings.optim.weight_decay}


def test_albert_decays_matrices_and_embeddings_not_biases_or_any_layernorm():
    from swarmd.tasks.albert.model import build_albert

    task = AlbertTask(AlbertSettings(), CONTEXT)
    model = build_albert(task.settings.model, vocab_size=100)
    decay, no_decay = _decayed(task, model)
    layer_norms = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    # hivemind's example means LayerNorm and biases; its name list ("LayerNorm.weight") would miss this one
    assert "albert.encoder.albert_layer_groups.0.albert_layers.0.full_layer_layer_norm.weight" in layer_norms
    assert no_decay == layer_norms | {name for name in no_decay if name.endswith("bias")}
    assert all(name.endswith("bias") or name in layer_norms for name in no_decay)
    assert decay == {
        f"{name}.weight" for name, m in model.named_modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) and f"{name}.weight" in dict(model.named_parameters())
    }
    assert "albert.embeddings.word_embeddings.weight" in decay  # tied with the MLM decoder: decayed once


def _swin_task(**data) -> SwinTask:
    task = SwinTask(SwinConfig(data=data), CONTEXT)
    task.num_classes = 10  # what prepare() counts in the data
    return task


def _linear_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))


def _batch():
    images = torch.arange(8, dtype=torch.float32).view(8, 1, 1, 1).expand(8, 3, 8, 8).clone()  # image i is all i
    return images, torch.arange(8)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixup_and_cutmix_give_soft_targets_that_sum_to_one_and_the_loss_takes_them(kind):
    from timm.loss import SoftTargetCrossEntropy

    from swarmd.tasks.swin import data

    task = _swin_task(mixup=0.8 if kind == "mixup" else 0.0, cutmix=1.0 if kind == "cutmix" else 0.0,
                      label_smoothing=0.1)
    images, targets = _batch()
    np.random.seed(3)  # timm's Mixup draws lambda (and the box) from NumPy's generator
    mixed, soft = data._mixup(task)(images.clone(), targets)
    assert soft.shape == (8, 10)
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(8))
    off = 0.1 / 10  # label smoothing spreads 0.1 over the 10 classes
    lam = (soft[0, 0] - off) / (1 - 0.1)  # sample 0 is mixed with sample 7 (the batch flipped)
    assert 0 < lam < 1
    torch.testing.assert_close(soft[0, 7], (1 - lam) * (1 - 0.1) + off)
    if kind == "mixup":
        torch.testing.assert_close(mixed[0], torch.full((3, 8, 8), float(lam * 0 + (1 - lam) * 7)))
    else:  # a box of sample 7 pasted into sample 0, lambda corrected to the box's area
        from_other = (mixed[0] == 7).float().mean()
        assert set(mixed[0].unique().tolist()) == {0.0, 7.0}
        torch.testing.assert_close(from_other, 1 - lam)

    model = _linear_model()
    np.random.seed(3)
    output = data.training_step(task, model, (images.clone(), targets))
    torch.testing.assert_close(output.loss, SoftTargetCrossEntropy()(model(mixed), soft))
    output.loss.backward()
    assert output.batch_size == 8 and model[1].weight.grad is not None


def test_label_smoothing_mixes_the_true_class_with_a_uniform_target():
    from swarmd.tasks.swin import data

    model = _linear_model()
    images, targets = _batch()
    plain = data.training_step(_swin_task(), model, (images, targets)).loss
    smoothed = data.training_step(_swin_task(label_smoothing=0.1), model, (images, targets)).loss
    log_probs = F.log_softmax(model(images), dim=-1)
    nll = F.nll_loss(log_probs, targets)
    torch.testing.assert_close(plain, nll)
    torch.testing.assert_close(smoothed, 0.9 * nll + 0.1 * (-log_probs.mean(dim=-1)).mean())
    assert smoothed != plain


def test_random_erasing_fills_one_box_with_per_pixel_noise_and_leaves_the_rest():
    from timm.data.random_erasing import RandomErasing

    from swarmd.tasks.swin.data import train_transform

    erasing = [t for t in train_transform(_swin_task(random_erasing=1.0)).transforms if isinstance(t, RandomErasing)]
    assert len(erasing) == 1 and erasing[0].mode == "pixel" and erasing[0].max_count == 1  # the Swin recipe's
    image = torch.full((3, 32, 32), 0.5)
    torch.manual_seed(0)
    erased = erasing[0](image.clone())
    changed = (erased != 0.5).any(dim=0)
    rows, cols = changed.any(dim=1).nonzero().flatten(), changed.any(dim=0).nonzero().flatten()
    box = (slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
    assert changed[box].all() and changed.sum() == changed[box].numel()  # one whole box, nothing outside it
    assert 0 < changed.float().mean() < 1
    noise = erased[(slice(None), *box)]
    assert noise.std() > 0.5  # normal noise, each pixel and channel its own (`const` filled zeros)
    assert not torch.equal(noise[0], noise[1])


def _learning_rates(config_name: str, epochs: list[int]) -> list[float]:
    """The learning rate hivemind's scheduler sets at each global epoch, from the task the config names."""
    config = load_config(CONFIGS / config_name, environ={})
    task = resolve_task(config.task.name)(config.task.settings, CONTEXT)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.task.settings.optim.lr)
    scheduler = task.build_scheduler(optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(scheduler.lr_lambdas[0](0) * scheduler.base_lrs[0])
    return [scheduler.base_lrs[0] * scheduler.lr_lambdas[0](epoch) for epoch in epochs]


def test_swin_t_schedule_hits_the_recipes_numbers():
    # Swin (config.py): WARMUP_LR 5e-7 -> BASE_LR 5e-4 over 20 epochs, cosine to MIN_LR 5e-6 at 300 (timm's
    # CosineLRScheduler, warm-up as a prefix); here at LAMB's peak 0.004, in global epochs (78.2 per ImageNet pass)
    peak = 0.004
    epochs = [0, 1564, (1564 + 23459) // 2, 23459, 30000]
    start, warm, middle, end, after = _learning_rates("swin-t-imagenet.yaml", epochs)
    assert start == pytest.approx(peak * 5e-7 / 5e-4)
    assert warm == pytest.approx(peak)
    assert middle == pytest.approx(peak * (0.01 + 0.99 * 0.5), rel=1e-3)  # half-way down the cosine
    assert end == after == pytest.approx(peak * 5e-6 / 5e-4)


def test_albert_large_schedule_hits_the_recipes_numbers():
    # hivemind's example: transformers' get_linear_schedule_with_warmup(5000, 125000) at lr 0.00176
    peak = 0.00176
    start, first, warm, middle, end = _learning_rates("albert-large-wikitext103.yaml", [0, 1, 5000, 65000, 125000])
    assert start == 0.0
    assert first == pytest.approx(peak / 5000)
    assert warm == pytest.approx(peak)
    assert middle == pytest.approx(peak / 2)
    assert end == 0.0
