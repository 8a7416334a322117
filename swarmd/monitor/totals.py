"""The swarm as a whole, from every peer's signed record between two reads: what `swarmd monitor` logs.

The loss is averaged over the samples each peer trained since the previous read, not a mean of the peers' means:
a peer that trained twice as much counts twice. A peer seen for the first time (no previous count) is weighted by
its samples/s. Pure functions of the records, no torch, no DHT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

__all__ = ["SwarmTotals", "swarm_totals"]


@dataclass(frozen=True)
class SwarmTotals:
    alive_peers: int  # peers with a live record (trainers, auxiliary and client peers)
    trainers: int  # of them, those that train (not auxiliary)
    samples_per_second: float  # the trainers' samples/s, summed
    global_epoch: Optional[int]
    loss: Optional[float]  # averaged over the samples trained since the previous read
    # averaging reports since the previous read, summed over peers: each peer of a round reports it, so one round of
    # two peers counts 2 here. How many rounds that was is not in the records; at least the most one peer reported.
    rounds_succeeded: int
    rounds_failed: int
    rounds_at_least: int

    def scalars(self) -> dict[str, float]:
        """The numbers, for the tracking backends (None left out)."""
        return {f"swarm/{name}": float(value) for name, value in asdict(self).items() if value is not None}


def swarm_totals(
    records: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Mapping[str, Any]],
    global_epoch: Optional[int],
) -> SwarmTotals:
    """`records`: the peers' records now (swarm/peer_records.py); `previous`: peer id -> its record at the last read."""
    trainers = [r for r in records if not r.get("auxiliary")]
    weighted = total_weight = 0.0
    succeeded = failed = at_least = 0
    for record in records:
        before = previous.get(record["peer_id"])
        ok, not_ok = _since(record, before, "averaging_success"), _since(record, before, "averaging_failed")
        succeeded, failed, at_least = succeeded + ok, failed + not_ok, max(at_least, ok + not_ok)
        if record.get("loss") is None or record.get("auxiliary"):
            continue
        weight = _since(record, before, "samples_total") if before is not None else record["samples_per_second"]
        weighted += weight * record["loss"]
        total_weight += weight
    return SwarmTotals(
        alive_peers=len(records),
        trainers=len(trainers),
        samples_per_second=round(sum(r["samples_per_second"] for r in trainers), 3),
        global_epoch=global_epoch,
        loss=weighted / total_weight if total_weight > 0 else None,
        rounds_succeeded=succeeded,
        rounds_failed=failed,
        rounds_at_least=at_least,
    )


def _since(record: Mapping[str, Any], before: Optional[Mapping[str, Any]], key: str) -> int:
    """How much a counter grew since the previous read (a restarted peer's counter starts again from 0)."""
    now = record.get(key) or 0
    if before is None:
        return 0
    then = before.get(key) or 0
    return now - then if now >= then else now
