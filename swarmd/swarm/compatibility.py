"""What peers of one run must agree on, and the one line that says where two disagree.

Every peer's signed record (swarm/peer_records.py) carries its compatibility: the swarmd protocol version, the task,
a fingerprint of the model (a hash over parameter names, shapes and dtypes, plus the parameter count) and the
settings that must agree (target batch size, strategy, DiLoCo's H). A peer with another architecture fails every
round; one with another target batch or strategy silently skews the swarm. So a joining peer compares itself with
the swarm before it averages anything and stops with exit code 2 on a difference (daemon/lifecycle.py), and a
running peer leaves out the records of peers that disagree (swarm/announcer.py). Plain hivemind peers publish no
record, so they are neither checked nor refused here.

No torch or hivemind import (the model is passed in).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Iterable, Mapping, Optional

__all__ = [
    "PROTOCOL_VERSION",
    "FIELDS",
    "model_fingerprint",
    "update_with_bytes",
    "parameter_digest",
    "compatibility_of",
    "compatibility_of_record",
    "difference",
    "swarm_reference",
]

# Bumped when peers of two swarmd versions cannot train together (the record format, the averaging protocol).
PROTOCOL_VERSION = 1
FIELDS = ("protocol", "task", "parameters", "model_fingerprint", "target_batch_size", "strategy", "inner_steps")


def model_fingerprint(model) -> tuple[str, int]:
    """(a hash over the parameters' names, shapes and dtypes, the parameter count) of a torch module."""
    count = sum(parameter.numel() for parameter in model.parameters())
    return parameter_digest(model).hexdigest()[:32], count


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


def compatibility_of(config, model) -> dict[str, Any]:
    """This peer's compatibility fields, from its config and the model its task built."""
    fingerprint, count = model_fingerprint(model)
    swarm = config.swarm
    return {
        "protocol": PROTOCOL_VERSION,
        "task": config.task.name,
        "parameters": count,
        "model_fingerprint": fingerprint,
        # DiLoCo ends a round after H steps of each peer (its tracker's target is H x this peer's batch): H must agree
        "target_batch_size": swarm.target_batch_size if swarm.strategy == "sync" else 0,
        "strategy": swarm.strategy,
        "inner_steps": swarm.diloco.inner_steps if swarm.strategy == "diloco" else 0,
    }


def compatibility_of_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The compatibility fields of a peer record (swarm/peer_records.py PeerRecord)."""
    fields = {key: record.get(key) for key in FIELDS}
    if fields["strategy"] != "sync":
        fields["target_batch_size"] = 0
    return fields


def difference(swarm: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """The first difference that keeps this peer out of `swarm`, as one line for the operator; "" if none.

    A record that does not say (a peer still starting, an older record) is not a difference.
    """
    if not _known(swarm) or not _known(ours):
        return ""
    if swarm["protocol"] != ours["protocol"]:
        return (f"the swarm speaks swarmd protocol {swarm['protocol']}, this swarmd speaks {ours['protocol']}: "
                "install the swarmd version the run uses")
    if swarm["task"] != ours["task"]:
        return f"the swarm trains task {swarm['task']}, this config's task is {ours['task']}: use the run's config"
    if swarm["parameters"] != ours["parameters"]:
        return (f"the swarm trains {_count(swarm['parameters'])} parameters, this config builds "
                f"{_count(ours['parameters'])}: use the run's config")
    if swarm["model_fingerprint"] != ours["model_fingerprint"]:
        return (f"the swarm's model has other parameter names, shapes or dtypes than this config's (both "
                f"{_count(ours['parameters'])} parameters): use the run's config")
    # the strategy first: it decides which of the other two means anything
    for key, setting in (("strategy", "swarm.strategy"), ("target_batch_size", "swarm.target_batch_size"),
                         ("inner_steps", "swarm.diloco.inner_steps")):
        if swarm[key] != ours[key]:
            return f"the swarm's {key} is {swarm[key]}, this config's is {ours[key]}: set {setting}: {swarm[key]} " \
                   "or use the run's config"
    return ""


def swarm_reference(records: Iterable[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The compatibility most of the other peers' records agree on (None: no peer says)."""
    known = [tuple(fields[key] for key in FIELDS) for fields in map(compatibility_of_record, records) if _known(fields)]
    if not known:
        return None
    return dict(zip(FIELDS, Counter(known).most_common(1)[0][0]))


def _known(record: Mapping[str, Any]) -> bool:
    return all(record.get(key) is not None for key in FIELDS) and bool(record["parameters"]) and bool(
        record["model_fingerprint"])


def _count(parameters: int) -> str:
    """28.3M, 0.54M, 1,104 (the small models of tests read better whole)."""
    if parameters < 10_000:
        return f"{parameters:,}"
    return f"{parameters / 1e6:.3g}M"
