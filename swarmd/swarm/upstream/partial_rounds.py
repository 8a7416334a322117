"""Saying what an averaging round brought back: whether all of the average arrived, and when its phases ran.

hivemind keeps this peer's own values for the parts of the vector whose reducer failed or was too slow
(`next_chunk_timeout`), logs "Averaging: received 71.1% results" and reports the round a success: the peer would
use a mix of the average and its own values, apart from the rest of its group without anyone knowing (seen on busy
2-core machines). Every swarmd averager returns a round's gathered data as `GatheredRound`, a dict like upstream's
(hivemind's own readers of it, such as the state averager's epoch sync, see nothing new) that carries the share of
the vector that did not arrive, and when the all-reduce began and ended in the averager's process. The strategies
turn a missing share into the outcome `partial` (swarm/outcomes.py) and re-synchronise the group's models
(docs/FAULTS.md); the times go into the round's timeline (swarm/averaging_log.py), with the time the host asked.
"""

from __future__ import annotations

import time
from typing import Optional

from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.control import StepControl

__all__ = ["GatheredRound", "ReportsPartialRounds", "missing_share", "what_did_not_arrive"]


class GatheredRound(dict):
    """A round's gathered data (peer id -> what it gathered), and what the averager's process saw of the round:
    `missing`, the share of the averaged vector that did not arrive (0..1), and the unix times its all-reduce began
    (`grouped_at`: the group had formed and was triggered) and ended (`reduced_at`), for the round's timeline
    (swarm/averaging_log.py), with the bytes it sent and received (`sent_bytes`, `received_bytes`). Pickles with
    them, so they cross from the averager's process to the host's."""

    def __init__(self, gathered, missing: float = 0.0, grouped_at: Optional[float] = None,
                 reduced_at: Optional[float] = None, sent_bytes: Optional[int] = None,
                 received_bytes: Optional[int] = None):
        super().__init__(gathered)
        self.missing = missing
        self.grouped_at, self.reduced_at = grouped_at, reduced_at
        # what the all-reduce moved over the network (round_traffic.py); None from a runner that does not count
        self.sent_bytes, self.received_bytes = sent_bytes, received_bytes


def missing_share(gathered) -> float:
    """The share of the average that did not arrive in a round whose gathered data this is (0: all of it)."""
    return float(getattr(gathered, "missing", 0.0))


def what_did_not_arrive(missing: float) -> str:
    """A partial round's error, as the averaging log records it for every kind of round."""
    return f"{missing:.1%} of the average did not arrive"


class ReportsPartialRounds(DecentralizedAverager):
    def step(self, *args, **kwargs):
        """Host side: stamps a round's control with the time this peer asked for it (`asked_at`), the start of its
        timeline; a control passed in again (a pre-scheduled round, triggered) keeps its first stamp."""
        asked_at = time.time()  # before: the averager's process may begin matchmaking before step() returns
        control = super().step(*args, **kwargs)
        if isinstance(control, StepControl) and getattr(control, "asked_at", None) is None:
            control.asked_at = asked_at
        return control

    async def _aggregate_with_group(self, group_info, min_vector_size, **kwargs):
        grouped_at = time.time()
        gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        reduced_at = time.time()
        running = self._running_groups.get(group_info.group_id)  # holds the all-reduce runner until the round ends
        finished = running is not None and running.done() and not running.cancelled() and running.exception() is None
        runner = running.result() if finished else None
        parts = getattr(runner, "tensor_part_container", None)
        missing = parts.failed_size / max(1, parts.total_size) if parts is not None and parts.failed_size else 0.0
        return GatheredRound(gathered, missing, grouped_at, reduced_at,
                             getattr(runner, "sent_bytes", None), getattr(runner, "received_bytes", None))
