"""The names of averaging rounds: what kinds there are, how each can end, and a round's bytes in words.

The one source for every surface that shows rounds (status JSON and view, /metrics, peer records, the progress
line, README's metrics table). Standard library only: the status view and the metrics read it.
"""

from __future__ import annotations

__all__ = ["KINDS", "OUTCOMES", "OUTCOME_MEANING", "FAILED_OUTCOMES", "outcome_help", "traffic_words"]

KINDS = ("gradients", "state", "outer")  # outer: a DiLoCo round of pseudo-gradients (swarm/strategies/diloco_optimizer.py)

# outcome -> what it means for this peer's step
OUTCOME_MEANING = {
    "success": "averaged with the group; the average was used",
    "failed": "an error or a timeout; this peer's own values were used",
    "skipped": "no partners (alone, or no round was scheduled); own values used",
    "rejected": "averaged, but the result was implausible (non-finite or far too large); own values used",
    "local": "DiLoCo's outer step on this peer's own pseudo-gradient (alone, or the round failed: see its error)",
    "partial": "part of the average did not arrive (a reducer failed or was late, or returned an average this peer "
    "refused as implausible); this peer's own values were used and the group averages its state again "
    "(docs/FAULTS.md)",
}
OUTCOMES = tuple(OUTCOME_MEANING)

# Outcomes where a round ran (or was due) and its average was not used: what a peer record counts as failed.
FAILED_OUTCOMES = frozenset({"failed", "rejected", "partial"})


def outcome_help() -> str:
    """One sentence listing every outcome, for help texts."""
    return "; ".join(f"{name}: {meaning}" for name, meaning in OUTCOME_MEANING.items())


def traffic_words(sent_bytes, received_bytes) -> str:
    """A round's network bytes in words: "sent 1.20 MB · received 1.19 MB"; "" when they were not counted (numbers
    only: a timeline read back from JSON, or from another peer, may hold anything)."""
    counted = [(word, value) for word, value in (("sent", sent_bytes), ("received", received_bytes))
               if isinstance(value, int) and not isinstance(value, bool) and value >= 0]
    return " · ".join(f"{word} {_size(value)}" for word, value in counted)


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"
