"""Digests of tensors' bytes and of a model's parameters: equal for equal values, and only then.

The model's architecture fingerprint (swarm/compatibility.py), the values a peer started from
(swarm/initial_state.py) and a DiLoCo peer's outer state at the first outer step (swarm/upstream/outer_round.py).
"""

from __future__ import annotations

import hashlib

__all__ = ["parameter_digest", "update_with_bytes"]


def parameter_digest(model, *, values: bool = False):
    """sha256 over each parameter's name, shape and dtype, and with `values` its bytes too (read on the host):
    the model's architecture, or the very values it holds (swarm/initial_state.py start_values)."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(f"{name}:{tuple(parameter.shape)}:{parameter.dtype}\n".encode())
        if values:
            update_with_bytes(digest, parameter)
    return digest


def update_with_bytes(digest, tensor) -> None:
    """Feed a tensor's bytes (read on the host, in its logical order) to a hashlib digest."""
    import torch  # for the bytes only: this module otherwise needs no torch (the model is passed in)

    flat = tensor.detach().to("cpu").reshape(-1)  # flat and contiguous: a 0-d tensor has no byte view
    digest.update(flat.view(torch.uint8).numpy())
