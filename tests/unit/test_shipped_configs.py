"""Every shipped config validates, and the full-size runs build their models, so none of them can rot."""

import os
from pathlib import Path

import pytest
import torch

from daemons import run_cli
from swarmd.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_the_configs_are_there():
    names = {path.name for path in CONFIGS}
    assert {"swin-micro.yaml", "swin-t-imagenet.yaml", "albert-micro.yaml", "albert-large-wikitext103.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_validates(path):
    result = run_cli("config", "validate", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{path}: ok")


def test_validating_imports_no_model_or_data_library(tmp_path):
    """Task modules stay light: `swarmd config validate` must not pay for torch, transformers or datasets."""
    blocked = tmp_path / "blocked"
    for name in ("torch", "hivemind", "timm", "transformers", "datasets", "tokenizers"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocked), str(CONFIGS[0].parents[1])])}
    for path in CONFIGS:
        result = run_cli("config", "validate", str(path), env=env)
        assert result.returncode == 0, result.stderr


def test_swin_t_builds_at_full_size():
    from swarmd.tasks.swin.model import build_swin

    settings = load_config(_config("swin-t-imagenet.yaml"), environ={}).task.settings
    with torch.device("meta"):
        model = build_swin(settings.model, num_classes=1000, device="cpu")
    assert model.patch_embed.img_size == (224, 224)
    assert 28.0e6 < _parameters(model) < 28.6e6  # Swin-T: 28.3M


def test_swin_t_schedule_is_the_papers_in_imagenet_passes():
    """warmup_epochs and total_epochs count global epochs (one per target_batch_size images), not passes."""
    config = load_config(_config("swin-t-imagenet.yaml"), environ={})
    optim = config.task.settings.optim
    global_epochs_per_pass = 1_281_167 / config.swarm.target_batch_size  # ImageNet-1k training images
    assert abs(optim.warmup_epochs / global_epochs_per_pass - 20) < 0.01  # Swin: 20 of 300 passes warm-up
    assert abs(optim.total_epochs / global_epochs_per_pass - 300) < 0.01


def test_albert_large_keeps_hiveminds_example_recipe():
    """examples/albert at hivemind 1.1.12; the deliberate differences are listed in docs/TASKS.md."""
    config = load_config(_config("albert-large-wikitext103.yaml"), environ={})
    optim, swarm = config.task.settings.optim, config.swarm
    assert (optim.name, optim.lr, optim.weight_decay, optim.eps, optim.always_adapt) == ("lamb", 0.00176, 0.01, 1e-6, True)
    assert (optim.schedule, optim.warmup_epochs, optim.total_epochs) == ("linear", 5000, 125000)
    # clipped per local step (HF Trainer's max_grad_norm), not after averaging
    assert (swarm.clip_local_grad_norm, optim.max_grad_norm) == (1.0, None)
    assert (swarm.target_batch_size, swarm.matchmaking_time, swarm.averaging_timeout) == (4096, 5.0, 60.0)
    assert (swarm.delay_grad_averaging, swarm.delay_optimizer_step, swarm.offload_optimizer) == (True, True, True)
    assert swarm.tracker_opts == {"max_refresh_period": 30.0, "metadata_expiration": 120.0}
    assert swarm.averager_opts == {"target_group_size": 256, "bandwidth": 100.0}
    assert "--dataset-config wikitext-103-v1 " in _config("albert-large-wikitext103.yaml").read_text()


def test_albert_large_builds_at_full_size():
    from swarmd.tasks.albert.model import build_albert

    settings = load_config(_config("albert-large-wikitext103.yaml"), environ={}).task.settings
    with torch.device("meta"):
        model = build_albert(settings.model, vocab_size=30000)  # albert-large-v2's own tokenizer
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (1024, 24, 16)
    assert (config.embedding_size, config.intermediate_size, config.max_position_embeddings) == (128, 4096, 512)
    assert config._attn_implementation == "sdpa"
    assert 17.5e6 < _parameters(model) < 18.2e6  # ALBERT-large: 18M, its layers shared across the 24


def test_micro_configs_build_small_models():
    from swarmd.tasks.albert.model import build_albert
    from swarmd.tasks.swin.model import build_swin

    swin = load_config(_config("swin-micro.yaml"), environ={}).task.settings
    albert = load_config(_config("albert-micro.yaml"), environ={}).task.settings
    assert _parameters(build_swin(swin.model, num_classes=10, device="cpu")) < 1e6
    assert _parameters(build_albert(albert.model, vocab_size=albert.data.generated.vocab_size)) < 2e5


def _config(name: str) -> Path:
    return next(path for path in CONFIGS if path.name == name)


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_embedded_default_is_swin_micro_run_id_included():
    """A peer started without --config and one with configs/swin-micro.yaml train together (one run, not two)."""
    default = load_config(None, environ={}).to_dict()
    shipped = load_config(_config("swin-micro.yaml"), environ={}).to_dict()
    assert default["run_id"] == shipped["run_id"] == "swin-micro"
    assert {**default, "state_dir": None} == {**shipped, "state_dir": None}
