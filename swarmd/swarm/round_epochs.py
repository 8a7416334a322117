"""The epochs a gradient round's members averaged, from what each sent with the round.

hivemind's group keys carry no epoch: a peer one epoch behind the swarm (a state download that ended as the others
stepped) is matched with the swarm's next round, both sides count one epoch on, and it stays one behind, each
round, until hivemind's once-an-epoch check of the exact epoch happens to see it and sends it to download the
whole state again (docs/PERFORMANCE.md section 5, "the chase"). So every swarmd gradient round sends the epoch its
peer averages (hivemind's `gather`), and a peer whose group averaged a later epoch knows at once that the swarm
has moved on without it.

What other peers send is a claim: an epoch that is not a plain non-negative int is ignored (a plain hivemind peer
sends None), and one member cannot move this peer: only where most of the members that sent an epoch are ahead.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["MAX_ROUND_EPOCH", "gathered_epoch", "epoch_the_others_averaged", "behind_as_told", "round_epoch"]

# far beyond any run's epochs; a larger claim is malformed
MAX_ROUND_EPOCH = 2**40


def gathered_epoch(value) -> Optional[int]:
    """The epoch a member sent with the round, or None where it sent none (plain hivemind) or nothing plausible."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ROUND_EPOCH:
        return None
    return value


def epoch_the_others_averaged(gathered: dict, own_key) -> Optional[int]:
    """The epoch the round's other members averaged where it is later than this peer's (its own entry, `own_key`),
    or None: the members agree with it, most sent no epoch, or most are not ahead. Of the members ahead, their lower
    median: a minority's larger claims cannot raise it."""
    own = gathered_epoch(gathered.get(own_key))
    if own is None:
        return None
    others = [epoch for key, value in gathered.items() if key != own_key
              for epoch in (gathered_epoch(value),) if epoch is not None]
    ahead = sorted(epoch for epoch in others if epoch > own)
    if 2 * len(ahead) <= len(others):
        return None
    return ahead[(len(ahead) - 1) // 2]


def round_epoch(epochs) -> Optional[int]:
    """The epoch most of a round's members averaged: the upper median of the plausible epochs they sent (a minority's
    claims cannot move it); None where none sent one."""
    plausible = sorted(epoch for epoch in map(gathered_epoch, epochs) if epoch is not None)
    return plausible[len(plausible) // 2] if plausible else None


def behind_as_told(told: Optional[int], local_epoch: int, records_epoch: int) -> bool:
    """Whether this peer is behind the swarm's epoch that its last round `told` (None: it told nothing), with the
    progress records' epoch agreeing. A group's claim alone moves nothing: a liar in a round of two would otherwise
    have this peer take the parameters again every round; with records of its own ahead it moves upstream's exact
    check of the epoch as well, so the round's word adds nothing to what a liar can do."""
    return told is not None and local_epoch < told and local_epoch < records_epoch
