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

import asyncio
import logging
from collections import Counter
from typing import Any, Iterable, Mapping, Optional

from swarmd.errors import ConfigError
from swarmd.swarm.digests import parameter_digest
from swarmd.swarm.strategies import STRATEGIES, strategy_of

__all__ = [
    "PROTOCOL_VERSION",
    "FIELDS",
    "model_fingerprint",
    "compatibility_of",
    "compatibility_of_record",
    "check_against_swarm",
    "difference",
    "swarm_reference",
]

logger = logging.getLogger("swarmd.daemon")

# what to do about a difference, whether the run's first peer was started with a config file or with none: the
# `To join:` line it prints carries its --config, or none for the embedded default
_USE_THE_RUNS_CONFIG = ("use the run's config: the --config of the `To join:` line its peers print, or no --config "
                       "(the embedded default) if that line has none")

# Bumped when peers of two swarmd versions cannot train together (the record format, the averaging protocol).
# 2: Swin's parameters are grouped by weight decay as timm groups them (issue 31): the tensors that peers average
# come in another order, which the model fingerprint (names, shapes, dtypes) does not see.
PROTOCOL_VERSION = 2
FIELDS = ("protocol", "task", "parameters", "model_fingerprint", "target_batch_size", "strategy", "inner_steps")


def model_fingerprint(model) -> tuple[str, int]:
    """(a hash over the parameters' names, shapes and dtypes, the parameter count) of a torch module."""
    count = sum(parameter.numel() for parameter in model.parameters())
    return parameter_digest(model).hexdigest()[:32], count


def compatibility_of(config, model) -> dict[str, Any]:
    """This peer's compatibility fields, from its config and the model its task built."""
    fingerprint, count = model_fingerprint(model)
    strategy = strategy_of(config)
    return {
        "protocol": PROTOCOL_VERSION,
        "task": config.task.name,
        "parameters": count,
        "model_fingerprint": fingerprint,
        "strategy": strategy.name,
        **strategy.compatibility(config.swarm),  # the settings of its own that peers must share
    }


def compatibility_of_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The compatibility fields of a peer record (swarm/peer_records.py PeerRecord)."""
    fields = {key: record.get(key) for key in FIELDS}
    strategy = STRATEGIES.get(fields["strategy"])  # another swarmd's unknown strategy: differs by its name anyway
    return strategy.of_record(fields) if strategy is not None else fields


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
        return f"the swarm trains task {swarm['task']}, this config's task is {ours['task']}: {_USE_THE_RUNS_CONFIG}"
    if swarm["parameters"] != ours["parameters"]:
        return (f"the swarm trains {_count(swarm['parameters'])} parameters, this config builds "
                f"{_count(ours['parameters'])}: {_USE_THE_RUNS_CONFIG}")
    if swarm["model_fingerprint"] != ours["model_fingerprint"]:
        return (f"the swarm's model has other parameter names, shapes or dtypes than this config's (both "
                f"{_count(ours['parameters'])} parameters): {_USE_THE_RUNS_CONFIG}")
    # the strategy first: it decides which of the other two means anything
    for key, setting in (("strategy", "swarm.strategy"), ("target_batch_size", "swarm.target_batch_size"),
                         ("inner_steps", "swarm.diloco.inner_steps")):
        if swarm[key] != ours[key]:
            return f"the swarm's {key} is {swarm[key]}, this config's is {ours[key]}: set {setting}: {swarm[key]} " \
                   f"or {_USE_THE_RUNS_CONFIG}"
    return ""


async def check_against_swarm(dht, run_id: str, own_peer_id: str, ours: Mapping[str, Any], *, retry: bool) -> None:
    """Raise ConfigError with the one line naming the difference when this peer's compatibility (`ours`) differs
    from the swarm's, as the other peers' records say. Peers without a record (plain hivemind, or none yet) do not
    count; `retry`: read once more after a second when no record came yet (a peer that has just joined the DHT
    through initial peers: records are stored every few seconds)."""
    from swarmd.swarm.peer_records import PeerRecords  # hivemind's schemas: only when asked

    records = PeerRecords(run_id)
    for attempt in range(2 if retry else 1):
        try:
            found = await asyncio.wait_for(records.fetch(dht), 10.0)
        except Exception as e:  # noqa: BLE001 - the DHT is up; an unanswered read is no reason to stop
            logger.warning("Could not read the swarm's peer records to compare configs (%r); going on", e)
            return
        others = [peer for peer in records.parse(found)[0] if peer["peer_id"] != own_peer_id]
        reference = swarm_reference(others)
        if reference is not None:
            break
        if attempt == 0 and retry:
            await asyncio.sleep(1.0)
    else:
        return
    why = difference(reference, ours)
    if why:
        raise ConfigError(why)
    logger.info("This peer's model and settings match the swarm's (%d peer record(s))", len(others))


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
