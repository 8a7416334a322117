"""Build transformers' AlbertForPreTraining from the task's model settings."""

from __future__ import annotations

import functools
from pathlib import Path

from swarmd.errors import ConfigError

__all__ = ["BUILTIN_CONFIGS", "albert_config", "build_albert", "weight_decay_groups", "enable_activation_checkpointing"]

_ALBERT_V2 = dict(
    embedding_size=128,
    num_hidden_groups=1,
    inner_group_num=1,
    hidden_act="gelu_new",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=512,
    type_vocab_size=2,
    vocab_size=30000,
    initializer_range=0.02,
    layer_norm_eps=1e-12,
)
# The config.json values of the released v2 models, so the real run needs no download to build its model.
BUILTIN_CONFIGS = {
    "albert-base-v2": dict(_ALBERT_V2, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "albert-large-v2": dict(_ALBERT_V2, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}

_OVERRIDES = (
    "embedding_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def albert_config(settings, vocab_size: int | None = None):
    """The transformers AlbertConfig: the named config, the explicit dimensions on top, the tokenizer's vocabulary."""
    from transformers import AlbertConfig

    values = {key: getattr(settings, key) for key in _OVERRIDES if getattr(settings, key) is not None}
    if settings.dropout is not None:
        values.update(hidden_dropout_prob=settings.dropout, attention_probs_dropout_prob=settings.dropout)
    if vocab_size is not None:
        values["vocab_size"] = vocab_size
    name = settings.name.removeprefix("albert/")
    if name in BUILTIN_CONFIGS:
        return AlbertConfig(**{**BUILTIN_CONFIGS[name], **values}, attn_implementation=settings.attention)
    try:
        # a local directory, or a hub name already in the local cache: never a download
        config = AlbertConfig.from_pretrained(settings.name, local_files_only=True, attn_implementation=settings.attention)
    except (OSError, ValueError) as e:
        where = "is not a directory with a config.json" if Path(settings.name).exists() else "is not in the local cache"
        raise ConfigError(
            f"task.model.name: {settings.name!r} {where} ({str(e).splitlines()[0]}); use one of "
            f"{', '.join(BUILTIN_CONFIGS)} or a directory holding an ALBERT config.json"
        ) from None
    if config.model_type != "albert":
        raise ConfigError(f"task.model.name: {settings.name!r} is a {config.model_type} config, not an ALBERT one")
    for key, value in values.items():
        setattr(config, key, value)
    return config


def build_albert(settings, vocab_size: int | None = None):
    from transformers import AlbertForPreTraining

    model = AlbertForPreTraining(albert_config(settings, vocab_size))
    if settings.activation_checkpointing:
        enable_activation_checkpointing(model)
    return model


def weight_decay_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on the matrices and embeddings; none on biases and LayerNorms, as hivemind's ALBERT example
    (`no_decay = ["bias", "LayerNorm.weight"]`) means it and as ALBERT's own code and transformers' Trainer do it:
    every LayerNorm by its type, which also takes in `full_layer_layer_norm` (the example's name list misses that
    one; docs/TASKS.md). transformers' helper; decayed parameters first, as the example orders its groups."""
    import torch
    from transformers.trainer_pt_utils import get_parameter_names

    decayed = {name for name in get_parameter_names(model, [torch.nn.LayerNorm]) if "bias" not in name}
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # tied weights once, under their first name
        if param.requires_grad:
            (decay if name in decayed else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def enable_activation_checkpointing(model) -> None:
    """Recompute each ALBERT layer group in backward.

    transformers' gradient_checkpointing_enable() refuses ALBERT (supports_gradient_checkpointing is False: its
    layers never got the checkpointing hooks), so the shared layer groups are wrapped here. The parameters and
    their names are untouched, so checkpoints and averaging stay compatible with peers that do not checkpoint.
    """
    from torch.utils.checkpoint import checkpoint

    def checkpointed(forward, hidden_states, *args, **kwargs):
        import torch

        if not torch.is_grad_enabled():
            return forward(hidden_states, *args, **kwargs)
        return checkpoint(forward, hidden_states, *args, use_reentrant=False, **kwargs)

    for group in model.albert.encoder.albert_layer_groups:
        group.forward = functools.partial(checkpointed, group.forward)
