"""The swarm's progress from hivemind's own records (`{run_id}_progress`), for a reader that trains nothing.

A daemon's progress tracker computes this itself; an observer (`swarmd status --initial-peers`) reads the
records each peer's tracker publishes and computes it the same way. Imports hivemind.
"""

from __future__ import annotations

from typing import Any, Optional

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import SchemaValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.utils import get_dht_time
from pydantic.v1 import ValidationError

from swarmd.swarm.peer_records import entries

__all__ = ["progress_validators", "swarm_progress"]


def progress_validators(run_id: str, signature: RSASignatureValidator) -> list:
    """What a reader of hivemind's own progress records (`{run_id}_progress`) must register."""
    return [SchemaValidator(TrainingProgressSchema, prefix=run_id), signature]


def swarm_progress(found, target_batch_size: Optional[int], now: Optional[float] = None) -> dict[str, Any]:
    """The swarm's epoch and progress from hivemind's `{run_id}_progress` records, as a peer's tracker computes it.

    For an observer that trains nothing: the global epoch is the highest epoch of a non-client peer, samples are
    those reported for it plus what each peer's rate adds since it reported.
    """
    now = get_dht_time() if now is None else now
    reports = []
    for _subkey, value in entries(found):
        if value is None:
            continue
        try:
            reports.append(LocalTrainingProgress.parse_obj(value))
        except (ValidationError, ValueError, TypeError):
            continue
    result: dict[str, Any] = {
        "global_epoch": None,
        "num_peers": len(reports),
        "num_clients": sum(entry.client_mode for entry in reports),
        "samples_accumulated": None,
        "target_batch_size": target_batch_size,
        "eta_seconds": None,
        "samples_per_second": round(sum(entry.samples_per_second for entry in reports), 3),
    }
    trainers = [entry for entry in reports if not entry.client_mode] or reports
    if not trainers:
        return result
    epoch = max(entry.epoch for entry in trainers)
    current = [entry for entry in reports if entry.epoch == epoch]
    result["global_epoch"] = epoch
    result["samples_accumulated"] = sum(entry.samples_accumulated for entry in current)
    if target_batch_size:
        estimated = sum(e.samples_accumulated + max(0.0, now - e.time) * e.samples_per_second for e in current)
        rate = sum(entry.samples_per_second for entry in reports)
        if rate > 0:
            result["eta_seconds"] = round(max(0.0, target_batch_size - estimated) / rate, 3)
    return result
