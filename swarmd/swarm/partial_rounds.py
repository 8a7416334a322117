"""Saying when an averaging round returned only part of the average.

hivemind keeps this peer's own values for the parts of the vector whose reducer failed or was too slow
(`next_chunk_timeout`), logs "Averaging: received 71.1% results" and reports the round a success: the peer would
use a mix of the average and its own values, apart from the rest of its group without anyone knowing (seen on busy
2-core machines). Every swarmd averager returns such a round's gathered data as `PartialGathered`, a dict like
upstream's (hivemind's own readers of it, such as the state averager's epoch sync, see nothing new) that carries
the share of the vector that did not arrive. The strategies turn it into the outcome `partial` (swarm/outcomes.py)
and re-synchronise the group's models (docs/FAULTS.md).
"""

from __future__ import annotations

from hivemind.averaging import DecentralizedAverager

__all__ = ["PartialGathered", "ReportsPartialRounds", "missing_share", "what_did_not_arrive"]


class PartialGathered(dict):
    """A round's gathered data (peer id -> what it gathered), and `missing`: the share of the averaged vector that
    did not arrive (0..1). Pickles with its share, so it crosses from the averager's process to the host's."""

    def __init__(self, gathered, missing: float):
        super().__init__(gathered)
        self.missing = missing


def missing_share(gathered) -> float:
    """The share of the average that did not arrive in a round whose gathered data this is (0: all of it)."""
    return float(getattr(gathered, "missing", 0.0))


def what_did_not_arrive(missing: float) -> str:
    """A partial round's error, as the averaging log records it for every kind of round."""
    return f"{missing:.1%} of the average did not arrive"


class ReportsPartialRounds(DecentralizedAverager):
    async def _aggregate_with_group(self, group_info, min_vector_size, **kwargs):
        gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        running = self._running_groups.get(group_info.group_id)  # holds the all-reduce runner until the round ends
        finished = running is not None and running.done() and not running.cancelled() and running.exception() is None
        runner = running.result() if finished else None
        parts = getattr(runner, "tensor_part_container", None)
        if parts is not None and parts.failed_size:
            return PartialGathered(gathered, parts.failed_size / max(1, parts.total_size))
        return gathered
