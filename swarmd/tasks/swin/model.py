"""Build a timm Swin model from the task's model settings."""

from __future__ import annotations

from pathlib import Path

from swarmd.errors import ConfigError

__all__ = ["build_swin", "weight_decay_groups", "export_for_timm"]


def build_swin(settings, num_classes: int, device):
    import timm
    import timm.layers
    import torch

    if settings.fused_attention:
        # timm keeps SDPA for Swin behind its "experimental" switch; it is the same maths, faster and leaner.
        timm.layers.set_fused_attn(True, experimental=True)
    if not timm.is_model(settings.name):
        raise ConfigError(f"task.model.name: {settings.name!r} is not a timm model; see timm.list_models('swin*')")
    kwargs = dict(num_classes=num_classes, drop_path_rate=settings.drop_path_rate, **settings.overrides())
    if settings.pretrained_file:
        path = Path(settings.pretrained_file).expanduser()
        if not path.is_file():
            raise ConfigError(f"task.model.pretrained_file: {path} does not exist")
        # timm adapts the classifier head when num_classes differs from the checkpoint's.
        model = timm.create_model(settings.name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs)
    else:
        model = timm.create_model(settings.name, pretrained=False, **kwargs)
    if settings.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if settings.channels_last and torch.device(device).type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def weight_decay_groups(model, weight_decay: float) -> list[dict]:
    """The Swin recipe's groups (microsoft/Swin-Transformer `set_weight_decay`, timm's optimizer factory): no weight
    decay on biases, norms and what the model names in `no_weight_decay()` (the relative position bias tables, an
    absolute position embedding; SwinV2 adds its logit scales and position MLP), weight decay on the rest.
    timm's helper, with timm's group order (no decay first)."""
    from timm.optim import param_groups_weight_decay

    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)


def export_for_timm(model, directory: Path, model_args: dict, data_config: dict) -> dict:
    """model.safetensors + config.json as timm writes them for the hub; loadable by name and arguments too.

    `data_config`: the run's own preprocessing (input_size, interpolation, crop_pct, crop_mode, mean, std), which
    config.json's pretrained_cfg carries instead of the architecture's ImageNet checkpoint's (tag ms_in1k,
    crop_pct 0.9, its license): timm.data.resolve_data_config then gives a user the transform the run evaluated with.
    """
    import json

    from timm.models import save_for_hf

    own = model.pretrained_cfg
    model.pretrained_cfg = {  # what timm reads of it: the architecture's facts, then the run's data
        **{key: own[key] for key in ("architecture", "first_conv", "classifier") if key in own},
        **data_config,
        "num_classes": model.num_classes,
    }
    try:
        save_for_hf(model, str(directory), model_args=model_args, safe_serialization=True, data_config=data_config)
    finally:
        model.pretrained_cfg = own
    config = json.loads((directory / "config.json").read_text())
    return {
        "format": "timm",
        "architecture": config["architecture"],
        "model_args": config.get("model_args", {}),
        "load": 'timm.create_model("local-dir:" + DIR, pretrained=True)',
        "load_by_name": (
            "timm.create_model(architecture, **model_args), then "
            "model.load_state_dict(safetensors.torch.load_file(DIR + '/model.safetensors'))"
        ),
    }
