"""Claims checked (issue 34 item 3): what other peers say of their progress is capped to what is plausible.

Each peer publishes its epoch, its samples towards it and its samples/s (hivemind's LocalTrainingProgress), and
every tracker sums them to decide when the swarm's epoch ends: a peer that claims 100x the samples it computed ends
the epochs early (fewer real samples per step), and a high samples/s makes everyone's estimate of the epoch's end
(which extrapolates each record by its rate) come early too. Nobody can measure another peer's throughput, so the
swarm is the reference, with two caps (this peer's own record is never capped):

- samples/s: at most `rate_ratio` x the median of the positive rates of every record (this peer's own included;
  of an even number, the upper one). A liar cannot move it without a majority; of two peers neither can be told the
  liar (the larger rate is the median), as with robust aggregation's two senders. And a peer's own rate starts
  low (hivemind's average counts its start-up), which must not make an honest partner look like a liar. An
  honest swarm of very different machines (a GPU beside 2-core CPUs) needs a larger ratio.
- samples towards the current epoch: at most SAMPLE_SLACK x (its capped rate, or the median rate if that is
  higher: a peer's rate is an average that starts low) x the seconds since this peer saw the epoch begin, plus
  `grace` seconds (a peer's record may predate this peer's first view of the epoch by a fetch interval, and one
  step may add a whole batch). And a record's time is taken as no earlier than that beginning (nor later than
  now): upstream adds (now - time) x rate to each record, so a record dated in the past would be extrapolated
  without bound.

A peer whose samples were capped counts as claiming too much (the evidence swarm/exclusion.py excludes on); a rate
capped alone does not: a peer that trained alone reports its solo rate for a few steps after others join, and the
newcomers' rates start low (hivemind's average counts their start-up), which caps an honest rate for an epoch or
two. A capped rate changes only the estimate of the epoch's end; samples change its count. Without a trusted
measurement these caps are wide by design: they bound a liar to about rate_ratio x what the swarm's median peer
does, rather than tell honest peers of different speeds apart.

No torch or hivemind import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Hashable, Sequence

__all__ = ["Claim", "SAMPLE_SLACK", "median_rate", "plausible_claims"]

SAMPLE_SLACK = 2.0


@dataclass(frozen=True)
class Claim:
    """One peer's progress record, as the tracker reads it."""

    peer: Hashable
    epoch: int
    samples: int
    rate: float  # samples/s
    time: float  # when it was published (the publisher's clock)
    client_mode: bool = False


def median_rate(claims: Sequence[Claim]) -> float:
    """The (upper) median of the positive, finite rates; inf with fewer than two (nothing to compare with)."""
    rates = sorted(c.rate for c in claims if c.rate > 0 and math.isfinite(c.rate))
    return rates[len(rates) // 2] if len(rates) >= 2 else math.inf


def plausible_claims(
    claims: Sequence[Claim], own, *, rate_ratio: float, epoch: int, epoch_began: float, now: float, grace: float,
) -> list[tuple[Claim, bool]]:
    """Each claim capped (see the module's docstring), with whether it claimed too many samples: (claim, over).
    `own`: this peer's id (its claim is kept as it is); `epoch`: the swarm's current epoch, which this peer saw begin
    at `epoch_began`."""
    if rate_ratio <= 0:
        return [(claim, False) for claim in claims]
    median = median_rate(claims)
    cap = rate_ratio * median
    checked = []
    for claim in claims:
        if claim.peer == own:
            checked.append((claim, False))
            continue
        rate = min(claim.rate, cap) if math.isfinite(claim.rate) else cap if math.isfinite(cap) else 0.0
        samples, when = claim.samples, claim.time
        if claim.epoch == epoch:
            elapsed = max(0.0, now - epoch_began) + grace
            if math.isfinite(cap):
                samples = min(samples, math.ceil(SAMPLE_SLACK * max(rate, median) * elapsed))
            when = min(max(when, epoch_began), now) if math.isfinite(when) else now
        checked.append((dataclasses.replace(claim, rate=float(rate), samples=int(samples), time=float(when)),
                        samples < claim.samples))
    return checked
