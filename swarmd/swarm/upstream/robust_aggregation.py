"""Robust aggregation where the data meets: the peer that reduces a part of the vector clips what each sender sent.

hivemind 1.1.12's all-reduce gives each peer of a group a share of the vector to reduce, and its `TensorPartReducer`
(averaging/partition.py) returns the plain weighted mean of what the senders sent for that share: one sender whose
gradients are x -1e6 sets everyone's update, and a sign flip at honest scale pulls the mean towards it unnoticed.
With `swarm.aggregation.method: centered_clip`, every swarmd averager (gradients, parameters, DiLoCo's
pseudo-gradients: they share the averager base of swarm/upstream/averager_gate.py) reduces its share with CenteredClip
(Karimireddy et al. 2021; "Secure Distributed Training at Scale", Gorbunov et al. 2022):

    v <- coordinate-wise median of the senders' parts
    repeat `iterations` times:  v <- v + sum_i w_i * clip(x_i - v, tau) / sum_i w_i,   clip(z, t) = z * min(1, t/|z|)

upstream's reducer already waits for every sender's part (or bans a sender that is later than `sender_timeout`), so
the parts are buffered until all that will come have come, then aggregated once. `tau` here is relative: the clip
radius is `tau` x the (lower) median of the senders' distances from the coordinate-wise median, so one setting fits
any model, part and learning stage. Two senders get their weighted mean (neither can be told the liar); senders
within the radius get their mean (with uneven weights, within tau's effect); a sender far from the others moves the
result by at most w_i/sum(w) x radius per iteration. A part with a NaN/Inf, or of the wrong size, is left out (weight
0). What arrives is decompressed first (hivemind's deserialization), so compression changes nothing here. The
protocol is upstream's: plain hivemind peers stay in the group, but the shares they reduce are plain means
(docs/FAULTS.md). The weights (the samples a sender claims) are capped at `max_weight_ratio` x their median
(`capped_weights`), and the evidence is judged as if every sender weighed alike.

How it plugs in: `AggregatesRobustly._run_allreduce_inplace_` is upstream's (averager.py l.537-558) with the runner
swapped for `RobustAllReduceRunner`, whose reducer keeps upstream's bookkeeping (when a part is complete, banned
senders, deadlines) and replaces only the accumulator: `_Contributions` records what `accumulator.add_` is given and
aggregates in `div_`, the two calls upstream's reducer makes on it.
"""

from __future__ import annotations

import bisect
import logging
import math
import multiprocessing as mp
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AveragingMode
from hivemind.averaging.partition import TensorPartReducer
from hivemind.utils import get_dht_time
from hivemind.utils.asyncio import as_aiter, azip

from swarmd.swarm.round_epochs import gathered_epoch, round_epoch
from swarmd.swarm.upstream.round_traffic import CountsRoundBytes

__all__ = [
    "Aggregation", "AggregatesRobustly", "CenteredClipReducer", "RobustAllReduceRunner", "centered_clip",
    "implausible_return", "capped_weights",
]

logger = logging.getLogger(__name__)

METHODS = ("mean", "centered_clip")
OUTLIER_RADII = 2.0  # a sender further than this many clip radii from the result is an outlier in that part
# ...and a sender that was an outlier in more than this share of the values it sent counts as clipped in the round
# (the evidence). A tiny part (a bias of a few values) can put the liar in the middle and an honest sender outside;
# a liar's whole share is outside.
OUTLIER_SHARE = 0.5
# Parameters (state rounds) are judged over this peer's whole share instead: a sender is an outlier there when its
# distance from the results, over all the share's parts, is more than this many times the parts' clip radii (both
# the square roots of the sums of squares). Under local updates each peer steps alone between state rounds, and
# honest parameters differ by how many steps each took and by the epoch transitions its tracker has not made yet:
# in the attack benchmark's local-updates cells (2026-12-06) honest senders ended 0.2-3.1 radii from the result in
# the shares' large parts once they had trained a few rounds together (up to 9.9 in a joiner's first rounds), tiny
# parts (a bias, a last layer of 64 values) up to 26 radii; the sign-flipping attacker 4-15 radii and the x -1e6 one
# 10-45 in the large parts. Part by part, honest peers were excluded in 4 of 6 clean runs.
SHARE_OUTLIER_RADII = 4.0
# In a round of two senders CenteredClip is their mean (neither can be told the liar), but a reducer that is one of
# the two trusts its own part: the other counts as an outlier there (evidence only: the result is still the mean)
# when it is further from this peer's part than this many times that part's norm. Honest gradients of one model
# differ by about their norm, and an honest peer whose parameters went astray (a bad download) sends 10-20x a
# converged peer's gradient (10x flagged one in the swarm test); a x -1000 liar is 1000 times off. Without it a liar
# that one honest peer excluded meets the others in pairs, where no evidence against it would ever come
# (swarm/exclusion.py). Loud liars only: a liar at honest scale is caught in groups of three.
PAIR_OUTLIER_RATIO = 100.0
# What comes back (issue 34 item 2): a reducer can lie about the average of its share. The receiver checks each part
# it gets against what it sent for that part: the average is refused when it is not finite, or its norm is above
# RETURN_RATIO x max(the part this peer sent, this peer's whole vector's norm spread evenly over the part's size).
# An honest average is a weighted mean of the senders' parts, within the spread of honest parts (a few times a
# part's norm, more where this peer's part is sparse: hence the even-spread floor); a reducer that returns x1000 is
# refused. Loud lies only: a reducer that shifts the average a little is not caught here. A refused part is never
# applied (this peer keeps its own values there, the round is partial: swarm/upstream/partial_rounds.py), and the reducer
# is reported as evidence (swarm/exclusion.py, "returned").
RETURN_RATIO = 100.0
# Updates that pull against the round (gradients, DiLoCo's pseudo-gradients; `Aggregation.judge_direction`): a
# sender whose part of this peer's share points away from the result there (cosine below OPPOSED_COSINE over the
# share) is an outlier in that round. A sign flip at honest scale stays within the clip radius (a third of a group
# of six flipping ended at 3x the clean loss, docs/FAULTS.md), but it points against what the others send. An honest
# sender is part of the result it is judged against: even senders of pure noise are at cosine ~1/sqrt(n) with their
# mean of n. Measured (the attack benchmark's sync and DiLoCo cells of 4 peers, 2026-12-06, every sender's cosine
# over each honest reducer's share per round): honest senders at +0.28..+0.99 (a zero update, DiLoCo's with nothing
# computed: 0), a sign-flipping sender at -0.87..-0.25 in every round of its sync cell. Where the senders' noise is
# well above their common direction (twice its norm), a flipper's own noise in the result outweighs its flip and it
# is not found (tests/unit/test_robust_aggregation.py). In a group of two with this peer the result is their mean:
# the other's part is judged against this peer's own instead (two honest updates are at cosine |mean|^2 / (|mean|^2
# + |noise|^2) > 0), so that a flipper that other honest peers excluded, and that meets this one in pairs, is found
# there too: where this peer holds other evidence against it (a pair's word alone is no evidence, and a stale update
# none: `AggregatesRobustly.excused_directions`). Parameters all point alike: what is judged there is each sender's
# step since this peer's last state round (its parameters minus that round's result, `CenteredClipReducer.origins`),
# against the result's step (see AggregatesRobustly.judged_step_tensors).
OPPOSED_COSINE = 0.0
# ...by a margin the judged values' number makes significant: below OPPOSED_COSINE - OPPOSED_SIGMAS / sqrt(values).
# Two directions that have nothing to do with each other in d values are at a cosine of about N(0, 1/d); an honest
# sender's mean is positive, but once the loss is at its noise floor the signal is small next to a 64-sample batch's
# noise, and in a share of a few hundred values (six peers, the attack benchmark's 2177-value model) or of one small
# tensor its cosine is that noise. Measured (2026-12-07, clean six-peer cells): honest senders found "pulling
# against" at -0.01..-0.23 where their rounds were in step, which put 2-6 of the 6 honest peers under suspicion in
# every clean run and had one excluded in 3 of 11 (with the margin: 0-2 suspects, none excluded, in 5). A flipper with
# a signal to flip is far below it (-0.38..-0.99 in the same runs; over 2048 values the bound is -0.07, over 129
# -0.26); one without (noise-dominated) flips little but noise. docs/FAULTS.md, "Honest peers under suspicion".
# `swarm.aggregation.direction_sigmas` (0: a bare sign test).
OPPOSED_SIGMAS = 3.0
# A sender out of step (`_out_of_step`) is excused from the direction test for this many of its rounds in a row
# with this peer: an honest peer the swarm outran downloads within a round or two (swarm/round_epochs.py; seen: two
# in a row in 12 of 44 honest peers' logs of the liar swarm test, never three); a liar that claims another epoch in
# every round to escape the test is judged from its next round on.
STALE_ROUNDS_EXCUSED = 3
MAX_STREAKS = 1024  # senders whose streak a reducer remembers (peer ids come from strangers: bounded)
# Senders whose (capped) weights differ by more than this factor are judged for the evidence by an unweighted
# CenteredClip (a second pass): see CenteredClipReducer.aggregate.
EVIDENCE_WEIGHT_SPREAD = 1.5
# A finite part whose sender weighs at most this share of the heaviest sender's weight is no evidence against it:
# it cannot move the result, and honest peers send such parts by design (a peer catching up weighs 1e-6 in a state
# round with its older parameters, and 0 in a DiLoCo outer round with nothing computed): judged by distance alone
# they would count as "clipped". (Not the cause of the honest DiLoCo exclusions in docs/FAULTS.md: those remain.)
NEGLIGIBLE_WEIGHT_SHARE = 1e-3
# A weight at or below this is the sender's own word that it takes and does not give (a peer catching up, or just
# refreshed, weighs peer_parts.CATCHING_UP_WEIGHT, 1e-6): it sets no median of the weights. Honest weights are samples
# (>= 1) or, for parameters, hivemind's 1. Counted, peers just downloaded can be most of a round: with three of four
# at 1e-6 the upper median was theirs, so the one peer at full weight was capped to max_weight_ratio x 1e-6 (its
# state no heavier than their older ones, the opposite of what their weight asks) and named overweight: an honest
# peer excluded in a clean local-updates cell of the attack benchmark (2026-12-07, fifth session).
COUNTED_WEIGHT_FLOOR = 1e-3


@dataclass(frozen=True)
class Aggregation:
    """How this peer reduces its share of an all-reduce (`swarm.aggregation`). Pickles into the averager's process."""

    method: str = "centered_clip"
    tau: float = 1.0
    iterations: int = 3
    max_weight_ratio: float = 2.0  # a sender's weight at most this x the senders' lower median weight; 0: uncapped
    # updates that point away from the result are evidence (OPPOSED_COSINE); an averager of parameters hands its
    # reducer False (AggregatesRobustly.judges_direction): nobody reads which way they point
    judge_direction: bool = True
    # a sender further from the coordinate-wise median than this x the median sender's distance is left out of the
    # part, not clipped (`_centered_clip`); 0: clipped like the others
    far_ratio: float = 100.0
    # a cosine counts as pointing away below OPPOSED_COSINE - direction_sigmas / sqrt(values judged); 0: below it
    direction_sigmas: float = OPPOSED_SIGMAS

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"aggregation method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if not self.tau > 0 or self.iterations < 1:
            raise ValueError(f"aggregation needs tau > 0 and iterations >= 1, not {self.tau} and {self.iterations}")
        if self.max_weight_ratio < 0:
            raise ValueError(f"aggregation needs max_weight_ratio >= 0, not {self.max_weight_ratio}")
        if not self.direction_sigmas >= 0:
            raise ValueError(f"aggregation needs direction_sigmas >= 0, not {self.direction_sigmas}")
        if self.far_ratio != 0 and not self.far_ratio >= OUTLIER_RADII:
            raise ValueError(f"aggregation needs far_ratio 0 or >= {OUTLIER_RADII:g}, not {self.far_ratio}")


def capped_weights(weights: Sequence[float], ratio: float) -> list[float]:
    """The senders' weights (the samples each claims) with none above `ratio` x the (upper) median of the positive
    ones (0: as they are). A weight is a claim nobody can check: uncapped, one sender claiming 100x the samples sets
    the average (CenteredClip's result moves by a sender's weight share of the clip radius per iteration) and makes
    every honest sender look like the outlier. The cap also bounds an honest peer much faster than the others (a GPU
    beside CPUs) to `ratio` x the median: raise it in such a swarm. The upper median, because weights far below the
    others' are honest too (a peer catching up weighs 1e-6 in a state round, swarm/upstream/optimizer.py) and must not set the
    cap; so a pair is never capped (neither of two can be told the liar, as in swarm/claims.py); such weights (at or
    below COUNTED_WEIGHT_FLOOR) are not counted at all, however many senders declare them."""
    median = _upper_median_weight(weights)
    if ratio <= 0 or median is None:
        return [float(w) for w in weights]
    cap = ratio * median
    return [min(float(w), cap) for w in weights]


def _upper_median_weight(weights: Sequence[float], least: int = 1) -> Optional[float]:
    """The upper median of the weights above COUNTED_WEIGHT_FLOOR (see capped_weights for why the upper one); None
    with fewer than `least` of them."""
    positive = sorted(float(w) for w in weights if w > COUNTED_WEIGHT_FLOOR)
    return positive[len(positive) // 2] if positive and len(positive) >= least else None


SORTING_NETWORK_ROWS = 16  # up to this many senders the median sorts by elementwise min/max (0.4 ms against 15 ms
# for torch's sort along dim 0, 4 x 128k floats on one thread); the network's cost grows with the square of the rows


def _sorted_rows(stacked: torch.Tensor) -> list[torch.Tensor]:
    """The rows' values sorted per coordinate (odd-even transposition sort of whole rows)."""
    if len(stacked) > SORTING_NETWORK_ROWS:
        return list(stacked.sort(dim=0).values.unbind(0))
    rows = list(stacked.unbind(0))
    for round_ in range(len(rows)):
        for i in range(round_ % 2, len(rows) - 1, 2):
            rows[i], rows[i + 1] = torch.minimum(rows[i], rows[i + 1]), torch.maximum(rows[i], rows[i + 1])
    return rows


def _median(stacked: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median over dim 0; for an even count the mean of the two middle values (two senders: the
    mean), not torch.median's lower one."""
    ordered, n = _sorted_rows(stacked), len(stacked)
    return ordered[n // 2].clone() if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _distances(y: torch.Tensor, squared: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """|y_i - u| for each row of y, from |y_i|^2 (`squared`) and dot products."""
    return (squared - 2 * (y @ u) + (u @ u)).clamp_min(0).sqrt()


def centered_clip(
    parts: Sequence[torch.Tensor], weights: Sequence[float], tau: float, iterations: int, far_ratio: float = 0.0
) -> tuple[torch.Tensor, list[bool]]:
    """CenteredClip of the senders' `parts` (same shape) with their `weights`: (the aggregate, in float32, and for
    each sender whether it was an outlier: left out as non-finite or far (`far_ratio`, 0: none), or further than
    OUTLIER_RADII clip radii from the result)."""
    result, clipped, _ = _centered_clip(parts, weights, tau, iterations, far_ratio)
    return result, clipped


@dataclass(frozen=True)
class _Spread:
    """How far each sender ended from a part's result, and the part's clip radius (None: not measured: two senders
    or fewer, or none finite)."""

    distances: list[float]
    radius: float


def _counted(w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The weights `w` of the senders that `counts` (a mask), 0 for the others; where those all weigh 0 (peers with
    no samples), each of them counts the same."""
    w = torch.where(counts, w, torch.zeros_like(w))
    return w if float(w.sum()) > 0 else counts.float()


def _centered_clip(parts, weights, tau: float, iterations: int,
                   far_ratio: float = 0.0) -> tuple[torch.Tensor, list[bool], Optional[_Spread]]:
    x = torch.stack([part.reshape(-1).float() for part in parts])  # a copy: changed in place below
    w = torch.tensor([float(weight) for weight in weights], dtype=torch.float32)
    # a row's sum is finite only if all its values are (a sum that overflows float32 is no honest part either)
    finite = torch.isfinite(x.sum(1)) & torch.isfinite(w) & (w >= 0)
    if not bool(finite.any()):
        return (x * w[:, None]).sum(0).div_(w.sum()).reshape(parts[0].shape), [True] * len(parts), None  # upstream's
    w = _counted(w, finite)
    # (row indices, not boolean masks: masked indexing of the rows cost half the time of the whole aggregation)
    kept, left_out = finite.nonzero().squeeze(1), (~finite).nonzero().squeeze(1)
    if len(left_out):
        x.index_fill_(0, left_out, 0.0)
    if len(kept) <= 2:  # two senders cannot tell which one lies: their weighted mean, exactly
        mean = (x * w[:, None]).sum(0).div_(w.sum()).reshape(parts[0].shape)
        return mean, [not flag for flag in finite.tolist()], None
    median = _median(x.index_select(0, kept) if len(left_out) else x)
    # around the median: distances are small next to the values (parameters), and |y - u|^2 expanded into dot
    # products stays accurate; one pass of matrix-vector products per iteration instead of a copy of every part
    y = x.sub_(median)
    if len(left_out):
        y.index_fill_(0, left_out, 0.0)
    squared = (y * y).sum(1)
    distances = squared.index_select(0, kept).sqrt().sort().values
    typical = float(distances[(len(distances) - 1) // 2])  # the lower median: a majority is at most this far
    radius = tau * typical
    if far_ratio > 0 and typical > 0:
        # Far senders are left out, not clipped: each clipped sender still pulls the result by its weight's share of
        # the radius per iteration, and the radius is about an honest update's size, so two x -1e6 senders of six
        # turned it about one radius their way (its error against the honest senders' mean 0.47 of the signal, under
        # 0.05 left out: tests/unit/test_robust_aggregation.py; docs/FAULTS.md). Honest parts were at most 26x the
        # median distance (a tiny part); a sender that must stay under the bound to count pulls as a clipped one did.
        w = _counted(w, finite & (squared.sqrt() <= far_ratio * typical))  # at least half the finite senders
    u = torch.zeros_like(median)  # v - median
    for _ in range(iterations):
        norms = _distances(y, squared, u)
        # a sender within the radius keeps its whole difference; one beyond it is pulled in to the radius
        scale = torch.where(norms > radius, radius / norms.clamp_min(1e-30), torch.ones_like(norms))
        share = w * scale / w.sum()
        u = u * (1 - float(share.sum())) + share @ y
    # an outlier: the clip took more than half its difference from the result away. Honest senders are often a little
    # beyond the radius (it is the median one's distance), so plain "clipped at all" would flag them too.
    distances = _distances(y, squared, u)
    clipped = (~finite) | (distances > OUTLIER_RADII * radius)
    if radius == 0:
        # most senders sent the very same values (copies: parameters after a download, or a group that stepped
        # alike): the result is theirs, but an honest peer whose own step made it differ is no liar
        clipped = ~finite
    v = median.add_(u)
    spread = _Spread([float(d) if f else 0.0 for d, f in zip(distances.tolist(), finite.tolist())], radius)
    return v.reshape(parts[0].shape), [bool(flag) for flag in clipped], spread


@dataclass(frozen=True)
class _Sent:
    """A sender's part as it goes through upstream's `accumulate_part` to the accumulator: with who sent it."""

    sender: int
    tensor: torch.Tensor


class _Contributions:
    """Stands in for upstream's accumulator tensor: `add_` records a sender's part and weight, `div_` (called once
    every sender's part is in) returns the robust aggregate. Each sender adds at most once per part (upstream's
    reducer checks the part index)."""

    def __init__(self, reducer: "CenteredClipReducer", shape: torch.Size):
        self._reducer, self._shape = reducer, shape
        self._sent: list[_Sent] = []
        self._weights: list[float] = []

    def add_(self, sent: _Sent, alpha: float = 1.0) -> "_Contributions":
        # a part of another size is left out like a non-finite one (and counted against its sender). Raising, as
        # upstream's tensor add_ does, would leave the part waiting for that sender until the round times out: its
        # part is already counted as received. Its sender's call then fails on the size (and it is banned).
        if sent.tensor.numel() != self._shape.numel():
            sent = _Sent(sent.sender, torch.full(self._shape, float("nan")))
        self._sent.append(sent)
        self._weights.append(alpha)
        return self

    def div_(self, denominator: float) -> torch.Tensor:
        return self._reducer.aggregate(self._sent, self._weights)


class CenteredClipReducer(TensorPartReducer):
    """Upstream's reducer, each part aggregated by CenteredClip instead of summed; counts, per sender, the parts in
    which it was an outlier (`clipped_by_sender`) and their values (`outlier_values`, of `values_sent`): the
    evidence a later exclusion can use."""

    def __init__(self, part_shapes, num_senders: int, aggregation: Aggregation, own_sender: Optional[int] = None,
                 origins: Optional[Sequence[Optional[torch.Tensor]]] = None):
        self.aggregation = aggregation  # before upstream's __init__: it resets the accumulators
        self.own_sender = own_sender  # this peer's index among the senders (None: it sends nothing, a client's)
        # per part, where the direction is judged of steps (parameters): the values the part had after this peer's
        # last round, subtracted from every sender's part and from the result before their cosine is taken (None:
        # that part is not judged); None: what is sent is itself an update (gradients, pseudo-gradients)
        self.origins = origins
        self.clipped_by_sender = [0] * num_senders
        self.outlier_values = [0] * num_senders
        # values each sender sent at a weight that can move the result (not NEGLIGIBLE_WEIGHT_SHARE): a sender with
        # none is not judged this round at all, and the exclusion window does not count it as a round it passed. A
        # peer just downloaded weighs 1e-6 in its next state round; counted, such rounds were half an attacker's
        # rounds in the attack benchmark's local-updates cells, and diluted the evidence of the others under the
        # exclusion's share (swarm/exclusion.py)
        self.values_sent = [0] * num_senders
        # parts that were blatant: non-finite, or further than PAIR_OUTLIER_RATIO x this peer's own part from it
        self.blatant_by_sender = [0] * num_senders
        # over the whole share (the parts with three senders or more): each sender's squared distance from the
        # results, and the squared clip radii, for `far_senders`
        self.squared_distance_by_sender = [0.0] * num_senders
        self.squared_radii = 0.0
        # over the same parts: each sender's dot product with the results, its squared norm and the results' (the
        # parts it sent), for `opposed_senders`
        self.dot_with_result_by_sender = [0.0] * num_senders
        self.squared_norm_by_sender = [0.0] * num_senders
        self.squared_result_by_sender = [0.0] * num_senders
        self.values_judged_by_sender = [0] * num_senders  # how many values the direction was judged over
        # the largest weight (samples) each sender claimed for a part, before the cap: for `overweight_senders`
        self.claimed_weight_by_sender = [0.0] * num_senders
        super().__init__(part_shapes, num_senders)

    def blatant_senders(self) -> list[int]:
        """The senders that sent a blatant part this round: non-finite, or (with this peer a sender) further from
        its own part than PAIR_OUTLIER_RATIO x that part's norm; what no honest peer sends, whatever it trained."""
        return [sender for sender, blatant in enumerate(self.blatant_by_sender) if blatant]

    def far_senders(self) -> list[int]:
        """The blatant senders, and those further from the results than SHARE_OUTLIER_RADII radii over this peer's
        whole share (the square roots of the sums of squares over its parts): the judgement for parameters (see
        SHARE_OUTLIER_RADII), where a part of a few values says little and a sender's distance in the large parts
        is what sets it apart."""
        bound = SHARE_OUTLIER_RADII**2 * self.squared_radii
        blatant = set(self.blatant_senders())
        return [sender for sender, squared in enumerate(self.squared_distance_by_sender)
                if sender in blatant or (bound > 0 and squared > bound)]

    def opposed_senders(self) -> list[int]:
        """The senders whose parts, over this peer's whole share, point away from the results of the parts with three
        senders or more, or from this peer's own parts in a pair with it: cosine below OPPOSED_COSINE by more than
        chance explains (`opposed_bound`; the averagers of updates ask: `AggregatesRobustly.judges_direction`)."""
        return [sender for sender, values in enumerate(self.values_judged_by_sender)
                if values and self.cosine_with_result(sender) < self.opposed_bound(sender)]

    def opposed_bound(self, sender: int) -> float:
        """The cosine below which `sender` points away from the result (`Aggregation.direction_sigmas`)."""
        values = max(1, self.values_judged_by_sender[sender])
        return OPPOSED_COSINE - self.aggregation.direction_sigmas / math.sqrt(values)

    def cosine_with_result(self, sender: int) -> float:
        """The cosine between what `sender` sent and the results (or this peer's own parts, in a pair), over the
        judged parts it sent (0: nothing judged, or a zero part)."""
        norms = self.squared_norm_by_sender[sender] * self.squared_result_by_sender[sender]
        return self.dot_with_result_by_sender[sender] / math.sqrt(norms) if norms > 0 else 0.0

    def overweight_senders(self, ratio: float) -> list[int]:
        """The senders that claimed more than `ratio` x the (upper) median of the positive weights claimed this round
        (the samples each says it accumulated), of three senders or more: of two, neither can be told the liar. The
        cap (`capped_weights`) already bounds what such a claim does to the result; this is the evidence of it."""
        median = _upper_median_weight(self.claimed_weight_by_sender, least=3)
        if ratio <= 0 or median is None:
            return []
        bound = ratio * median
        return [sender for sender, weight in enumerate(self.claimed_weight_by_sender) if weight > bound]

    def clipped_senders(self) -> list[int]:
        """The senders that were outliers in more than OUTLIER_SHARE of the values they sent this round."""
        return [sender for sender, (outside, sent) in enumerate(zip(self.outlier_values, self.values_sent))
                if sent and outside > OUTLIER_SHARE * sent]

    def reset_accumulators(self):
        super().reset_accumulators()
        if not self.finished.is_set():
            self.accumulator = _Contributions(self, self.part_shapes[self.current_part_index])

    async def accumulate_part(self, sender_index: int, part_index: int, tensor_part, weight: float = 1.0):
        # upstream hands `tensor_part` to the accumulator's add_ and nowhere else: it carries its sender there
        return await super().accumulate_part(sender_index, part_index, _Sent(sender_index, tensor_part), weight)

    def aggregate(self, sent: list[_Sent], weights: list[float]) -> torch.Tensor:
        shape = self.part_shapes[self.current_part_index]
        if not sent:  # every sender of this part failed: upstream would return 0/0
            return torch.zeros(shape)
        parts = [one.tensor for one in sent]
        claimed = self.claimed_weight_by_sender
        for one, weight in zip(sent, weights):
            if math.isfinite(float(weight)):
                claimed[one.sender] = max(claimed[one.sender], float(weight))
        weights = capped_weights(weights, self.aggregation.max_weight_ratio)
        try:
            aggregation = self.aggregation
            result, clipped, spread = _centered_clip(parts, weights, aggregation.tau, aggregation.iterations,
                                                     aggregation.far_ratio)
            judged = result
            positive = [w for w in weights if w > 0]
            if positive and max(positive) > EVIDENCE_WEIGHT_SPREAD * min(positive):
                # the evidence is judged with every sender counting alike: a sender weighed heavily (honestly or
                # not) pulls the result its way and would make the others look like outliers
                judged, clipped, spread = _centered_clip(parts, [1.0 if w > 0 else 0.0 for w in weights],
                                                         aggregation.tau, aggregation.iterations, aggregation.far_ratio)
        except Exception:  # a bug here must not hang the round: the part gets upstream's mean
            logger.exception("Robust aggregation failed; this part is the senders' weighted mean")
            total = sum(weights) or 1.0
            return sum(part.float().reshape(shape) * (weight / total) for part, weight in zip(parts, weights))
        self._record_evidence(sent, weights, clipped, spread, judged)
        return result.reshape(shape)

    def _record_evidence(self, sent: list[_Sent], weights, clipped: list[bool], spread: Optional[_Spread],
                         result: torch.Tensor) -> None:
        """Counts, per sender, what this part says against it: clipped as an outlier, blatant, how far, and which
        way it points next to the `result` the evidence is judged by."""
        shape, parts = self.part_shapes[self.current_part_index], [one.tensor for one in sent]
        own = self._own_part(sent)
        far = self._judged_by_own_part(sent, own)
        if len(sent) == 2 and not any(clipped):
            clipped = far
        finite = [bool(torch.isfinite(part).all()) for part in parts]
        negligible = _negligible(finite, weights)
        # which way each sender points: next to the result (three senders or more), or in a pair with this peer next
        # to this peer's own part (the result is their mean: the other's half of it would count for it); flattened and
        # its norm taken once per part
        reference, origin = None, self._origin_of_part()
        if self.aggregation.judge_direction and (self.origins is None or origin is not None):
            reference = result.reshape(-1).float() if spread is not None else own if len(sent) == 2 else None
            if reference is not None and origin is not None:
                reference = reference - origin  # the result's step since the last round (or this peer's own)
        squared_reference = float(reference @ reference) if reference is not None else 0.0
        for index, one in enumerate(sent):
            if negligible[index]:  # it cannot move the result: nothing against it (NEGLIGIBLE_WEIGHT_SHARE), and
                continue  # no round it passed either (not counted as sent: see values_sent)
            self.values_sent[one.sender] += shape.numel()
            self.blatant_by_sender[one.sender] += far[index] or not finite[index]
            if spread is not None:
                self.squared_distance_by_sender[one.sender] += spread.distances[index] ** 2
            if reference is not None and finite[index] and one.sender != self.own_sender:
                values = parts[index].reshape(-1).float()
                if origin is not None:
                    values = values - origin
                self.dot_with_result_by_sender[one.sender] += float(values @ reference)
                self.squared_norm_by_sender[one.sender] += float(values @ values)
                self.squared_result_by_sender[one.sender] += squared_reference
                self.values_judged_by_sender[one.sender] += values.numel()
            if clipped[index]:
                self.clipped_by_sender[one.sender] += 1
                self.outlier_values[one.sender] += shape.numel()
        if spread is not None:
            self.squared_radii += spread.radius**2

    def _origin_of_part(self) -> Optional[torch.Tensor]:
        """The current part's origin (see `origins`), where it has one of the part's size."""
        if self.origins is None or self.current_part_index >= len(self.origins):
            return None
        origin = self.origins[self.current_part_index]
        return origin if origin is not None and origin.numel() == self.part_shapes[self.current_part_index].numel() \
            else None

    def _own_part(self, sent: list[_Sent]) -> Optional[torch.Tensor]:
        """This peer's own part among `sent` (flat, float32), or None where it sent none."""
        own = [one.tensor for one in sent if one.sender == self.own_sender]
        return own[0].reshape(-1).float() if own and bool(torch.isfinite(own[0]).all()) else None

    def _judged_by_own_part(self, sent: list[_Sent], own: Optional[torch.Tensor]) -> list[bool]:
        """Each sender's flag by this peer's own part (`own`, from _own_part), where this peer is a sender: further
        than PAIR_OUTLIER_RATIO x |own part| from it (a pair's judgement, see PAIR_OUTLIER_RATIO; and what makes a part
        blatant)."""
        if own is None:
            return [False] * len(sent)
        reference = float(torch.linalg.vector_norm(own))
        if not reference > 0:
            return [False] * len(sent)
        bound = PAIR_OUTLIER_RATIO * reference
        return [one.sender != self.own_sender
                and float(torch.linalg.vector_norm(one.tensor.reshape(-1).float() - own)) > bound for one in sent]


def _behind_the_round(senders: Sequence, epochs: dict) -> dict[int, str]:
    """For each sender whose epoch sent with the round is below the round's (swarm/round_epochs.py round_epoch), the
    words the evidence lines end with: a sign of an honest peer the swarm outran, or of a liar that says so."""
    round_at = round_epoch(epochs.values())
    if round_at is None:
        return {}
    said = {index: gathered_epoch(epochs.get(peer)) for index, peer in enumerate(senders)}
    return {index: f"; it was at epoch {epoch}, the round's members at {round_at}: behind the swarm"
            for index, epoch in said.items() if epoch is not None and epoch < round_at}


def _out_of_step(senders: Sequence, epochs: dict, own) -> set[int]:
    """The senders whose update is of another epoch than what its direction is judged against: the round's epoch
    (swarm/round_epochs.py round_epoch) where the result is the reference, this peer's own where it is one of a pair
    (its own part the reference). A gradient of parameters a step older is no evidence of a lie: at a learning rate
    where the loss oscillates about its floor, consecutive steps' gradients point opposite ways (seen in the liar
    swarm test: an honest founder one epoch behind at cosine -0.58 over 2048 values and -0.79 over 129, and each of
    the pair found the other "pulling against", until one excluded the other). A sender that sent no epoch (a plain
    hivemind peer) is judged. A liar that claims another epoch in every round is judged again after
    STALE_ROUNDS_EXCUSED rounds (`AggregatesRobustly.excused_directions`)."""
    said = [gathered_epoch(epochs.get(peer)) for peer in senders]
    if len(senders) == 2 and own in senders:
        reference = said[list(senders).index(own)]
    else:
        reference = round_epoch(epochs.values())
    if reference is None:
        return set()
    return {sender for sender, epoch in enumerate(said) if epoch is not None and epoch != reference}


def _negligible(finite: list[bool], weights) -> list[bool]:
    """For each sender: a finite part whose sender weighs next to nothing (NEGLIGIBLE_WEIGHT_SHARE): no evidence
    against it, whatever it sent."""
    heaviest = max((float(w) for w in weights if math.isfinite(float(w))), default=0.0)
    return [is_finite and math.isfinite(float(w)) and float(w) <= NEGLIGIBLE_WEIGHT_SHARE * heaviest
            for is_finite, w in zip(finite, weights)]


def implausible_return(sent: torch.Tensor, delta: torch.Tensor, floor: float) -> str:
    """Why the average a reducer returned for a part is refused ("" when it is not): `sent` is the part this peer
    sent, `delta` the average minus it (what hivemind's reducers return), `floor` the least norm a part is compared
    against (see RETURN_RATIO)."""
    delta = delta.float()
    if not bool(torch.isfinite(delta).all()):
        return "not finite"
    average = sent.detach().float().reshape(-1) + delta.reshape(-1)
    reference = max(float(torch.linalg.vector_norm(sent.detach().float())), floor)
    norm = float(torch.linalg.vector_norm(average))
    if reference > 0 and norm > RETURN_RATIO * reference:
        return f"its norm is {norm / reference:.3g}x this peer's part's"
    return ""


def origin_parts(origins: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor],
                 parts: Sequence[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """For each of this peer's `parts` of its share (views into the averaged `tensors`, as upstream's
    TensorPartContainer splits them), the same values of `origins` (flat, float32; aligned with the first tensors),
    or None where the part lies in a tensor past them (optimizer statistics: not judged for direction)."""
    # each tensor's memory span, sorted by where it begins (a model has hundreds of tensors, a share hundreds of parts)
    spans = sorted((tensor.data_ptr(), index) for index, tensor in enumerate(tensors[:len(origins)]) if tensor.numel())
    begins = [begin for begin, _ in spans]
    found: list[Optional[torch.Tensor]] = []
    for part in parts:
        start, at = part.data_ptr(), bisect.bisect_right(begins, part.data_ptr()) - 1
        index = spans[at][1] if at >= 0 and part.numel() else None
        tensor = tensors[index] if index is not None else None
        if tensor is None or start >= begins[at] + tensor.numel() * tensor.element_size():
            found.append(None)
            continue
        offset, origin = (start - begins[at]) // tensor.element_size(), origins[index].reshape(-1)
        found.append(origin[offset:offset + part.numel()].float() if origin.numel() == tensor.numel() else None)
    return found


class RobustAllReduceRunner(CountsRoundBytes):
    """Upstream's all-reduce with a CenteredClipReducer for this peer's share, and every average another reducer
    returns checked before it is used (`implausible_return`): `refused_reducers` holds the senders' indices in
    `ordered_peer_ids` of the reducers whose averages this peer refused in this round. Its bytes are counted
    (round_traffic.py)."""

    def __init__(self, *args, aggregation: Aggregation, origins: Optional[Sequence[torch.Tensor]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        plain = self.tensor_part_reducer
        # built by upstream's __init__ (allreduce.py l.127) before anything could reach it; marked finished so that
        # its __del__ does not log "received 0.0% of input tensors"
        plain.finished.set()
        own = self.sender_peer_ids.index(self.peer_id) if self.peer_id in self.sender_peer_ids else None
        if origins is not None:
            origins = origin_parts(origins, self.tensor_part_container.local_tensors, self.parts_for_local_averaging)
        self.tensor_part_reducer = CenteredClipReducer(plain.part_shapes, plain.num_senders, aggregation, own, origins)
        self.refused_reducers: dict[int, str] = {}  # reducer's index -> why its first refused part was refused
        self._check_returned_parts()

    def _check_returned_parts(self) -> None:
        # upstream registers every reducer's result (and a failed reducer's zeros) through the container's
        # register_processed_part (allreduce.py l.210, l.233; partition.py l.135): checked here, per instance
        container = self.tensor_part_container
        register, own_index = container.register_processed_part, self.ordered_peer_ids.index(self.peer_id)
        squares = sum(float(t.detach().float().pow(2).sum()) for t in container.local_tensors)
        per_value = (squares / max(container.total_size, 1)) ** 0.5  # this peer's vector's norm spread evenly

        def register_checked(peer_index: int, part_index: int, part: torch.Tensor) -> None:
            if peer_index != own_index:
                sent = container._input_parts_by_peer[peer_index][part_index][0]
                why = implausible_return(sent, part, per_value * sent.numel() ** 0.5)
                if why:
                    self.refused_reducers.setdefault(peer_index, why)
                    part = torch.zeros_like(sent)  # this peer's own values there: the part is missing
                    container.failed_size += sent.numel()
            register(peer_index, part_index, part)

        container.register_processed_part = register_checked


class AggregatesRobustly(DecentralizedAverager):
    runner_type = RobustAllReduceRunner  # what runs each all-reduce (a test's lying reducer is another)
    # True where the evidence against a sender is judged over this peer's whole share (CenteredClipReducer.far_senders,
    # SHARE_OUTLIER_RADII) instead of part by part: parameters (swarm/upstream/state_averager.py); the clip is the same
    judges_whole_share = False
    # True where the averaged tensors are updates (gradients, DiLoCo's pseudo-gradients), whose senders agree on a
    # direction: one that points away from the result is an outlier (CenteredClipReducer.opposed_senders)
    judges_direction = False
    # How many of the averaged tensors, from the first, hold values every member of a round leaves at its result
    # (parameters: swarm/upstream/state_averager.py): there each sender's step since this peer's last round (what it
    # sent minus this peer's values right after that round, the "origin") is judged for direction, as DiLoCo's outer
    # rounds judge pseudo-gradients. Under local updates a liar that steps uphill behind a clipped optimizer moves its
    # parameters at honest scale, within the clip radius, and its distance alone never set it apart (the attack
    # benchmark's local-updates x -1e6 cell: not excluded in 2 of 5 runs, 2026-12-07). The origins are a copy of those
    # tensors in the averager's process, taken after each round it averaged in.
    judged_step_tensors = 0

    def __init__(self, *args, aggregation: Optional[Aggregation] = None, **kwargs):
        # set before upstream's __init__, which starts the averager's process (fork copies it)
        self.aggregation = Aggregation() if aggregation is None else aggregation
        # senders clipped as outliers, one per sender and round of this peer's share; counted in the averager's
        # process, read by the host's (status, /metrics)
        self.outliers_clipped = mp.Value("q", 0)
        self._origins: Optional[list[torch.Tensor]] = None  # see judged_step_tensors; in the averager's process
        super().__init__(*args, **kwargs)

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id: Optional[bytes] = None, **kwargs):
        # upstream's body (averager.py l.537-558), with the robust runner (or, for a plain mean, upstream's runner
        # with its bytes counted)
        group_id = group_info.group_id if group_id is None else group_id
        if self.aggregation.method == "mean":
            runner_type, robust = CountsRoundBytes, {}
        else:
            # the reducer sums which way each sender points only where this averager judges it
            aggregation = replace(self.aggregation, judge_direction=self._judges_direction_now)
            runner_type, robust = self.runner_type, {"aggregation": aggregation}
            if self._judges_direction_now and self._origins is not None:
                robust["origins"] = self._origins
        runner = runner_type(
            p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors, group_id=group_id,
            ordered_peer_ids=group_info.peer_ids, **robust, **kwargs,
        )
        self._running_groups[group_id].set_result(runner)
        if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:
            async for tensor, update in azip(as_aiter(*tensors), runner):
                tensor.add_(update, alpha=self._averaging_alpha)
                self.last_updated = get_dht_time()
                self._state_updated.set()
        else:
            async for _ in runner:
                raise ValueError("aux peers should not receive averaged tensors")
        if robust:
            self._count_outliers(runner, self._gathered_epochs(group_info))
            self._remember_origins(tensors)

    def _remember_origins(self, tensors) -> None:
        """This peer's values of the `judged_step_tensors` right after a round: what the next round's steps are
        measured from. A partial round leaves this peer's own values where the average did not come (the steps there
        are then measured from them); a download since is not seen here (every step then includes its jump, alike
        for all senders: nothing is found until the next round)."""
        count = min(self.judged_step_tensors, len(tensors))
        if not count or not (self.aggregation.method != "mean" and self.aggregation.judge_direction):
            return
        kept = self._origins
        if kept is None or [origin.shape for origin in kept] != [tensor.shape for tensor in tensors[:count]]:
            self._origins = [tensor.detach().float().clone() for tensor in tensors[:count]]
            return
        for origin, tensor in zip(kept, tensors):
            origin.copy_(tensor.detach())

    def _gathered_epochs(self, group_info) -> dict:
        """What each member sent with the round, its epoch (upstream's gathered triples of bandwidth, mode and user
        data, as its `_aggregate_with_group` reads them): a stranger's claim, checked where it is read
        (swarm/round_epochs.py), as the host's gathered data are; {} where the round's gathered data cannot be read."""
        try:
            return {peer: self.serializer.loads(self.serializer.loads(data)[2])
                    for peer, data in zip(group_info.peer_ids, group_info.gathered)}
        except Exception:  # noqa: BLE001 - upstream's own reading of them fails the round first
            return {}

    def opposed_senders(self, runner: RobustAllReduceRunner, epochs: Optional[dict] = None) -> list[int]:
        """The senders whose updates pointed away from this round's result in this peer's share (none where the
        tensors are not updates, or the check is off), but for those `excused_directions` excuses; `epochs` as
        `_gathered_epochs` reads them."""
        if not self._judges_direction_now:
            return []
        excused = self.excused_directions(runner, epochs)
        return [sender for sender in runner.tensor_part_reducer.opposed_senders() if sender not in excused]

    def excused_directions(self, runner: RobustAllReduceRunner, epochs: Optional[dict] = None) -> dict[int, str]:
        """For each sender whose direction is no evidence this round, why: its update is of another epoch than what
        it is judged against (`_out_of_step`), for up to STALE_ROUNDS_EXCUSED of its rounds in a row here, or this
        peer's own part is the reference (a pair) and this peer has no other evidence against it
        (`pair_word_counts`). Decided once per round (the streaks count rounds): kept on the runner."""
        decided = getattr(runner, "excused_directions", None)
        if decided is not None:
            return decided
        senders, excused = runner.sender_peer_ids, {}
        out_of_step = _out_of_step(senders, epochs or {}, self.peer_id)
        streaks = self.__dict__.setdefault("_out_of_step_rounds", {})  # in the averager's process: sender -> rounds
        for sender, peer in enumerate(senders):
            streak = streaks.pop(peer, 0) + 1
            if sender not in out_of_step:
                streak = 0
            if streak:
                streaks[peer] = streak  # the newest last: the oldest forgotten first
                while len(streaks) > MAX_STREAKS:
                    del streaks[next(iter(streaks))]
            if 0 < streak <= STALE_ROUNDS_EXCUSED:
                excused[sender] = ("its update and what it was judged against were of different epochs: a stale "
                                   f"update ({streak} round(s) in a row)")
        if len(senders) == 2 and self.peer_id in senders:
            for sender, peer in enumerate(senders):
                if peer != self.peer_id and sender not in excused and not self.pair_word_counts(peer.to_base58()):
                    excused[sender] = ("in a pair, this peer's own part the reference, and no other evidence against "
                                       "it: a pair's word against the other's")
        runner.excused_directions = excused
        return excused

    def pair_word_counts(self, peer_id: str) -> bool:
        """Whether an update of `peer_id` pointing away from this peer's own, in a pair of the two, is evidence against
        it: here always (an averager with no exclusion table); swarm/upstream/averager_gate.py asks the table. In a
        pair the reference is this peer's own update, so a peer whose parameters went astray (a download from a liar
        before the evidence was in) finds its honest partner "pulling against" it (seen in the liar swarm test: cosine
        -0.31..-0.73 in 6 of 11 pair rounds, and an honest peer excluded), and the state round of two that would bring
        them together is refused to a suspect."""
        return True

    @property
    def _judges_direction_now(self) -> bool:
        # parameters are judged from their second round with this peer on (the first sets the origins)
        steps = self.judged_step_tensors and self._origins is not None
        return bool(self.judges_direction or steps) and self.aggregation.judge_direction

    def _count_outliers(self, runner: RobustAllReduceRunner, epochs: Optional[dict] = None) -> None:
        """Logs what this round's share says against each sender; `epochs`: each member's as it sent it with the
        round (`_gathered_epochs`), to say which senders were behind the round (an honest peer the swarm outran sends
        a gradient of parameters the others have stepped from: by distance and direction it looks like a liar)."""
        behind = _behind_the_round(runner.sender_peer_ids, epochs or {})
        for index, why in getattr(runner, "refused_reducers", {}).items():  # a plain runner checks nothing
            logger.warning("Refused the average %s returned for its share of this round (%s): this peer keeps its "
                           "own values there", runner.ordered_peer_ids[index], why)
        reducer = runner.tensor_part_reducer
        clipped = reducer.clipped_senders()
        opposed = self.opposed_senders(runner, epochs)
        if self._judges_direction_now:
            excused = self.excused_directions(runner, epochs)
            for sender in set(reducer.opposed_senders()) & set(excused):
                logger.debug("%s pointed away from the round in this peer's share (cosine %.2f over %d values), no "
                             "evidence: %s", runner.sender_peer_ids[sender], reducer.cosine_with_result(sender),
                             reducer.values_judged_by_sender[sender], excused[sender])
        with self.outliers_clipped.get_lock():
            self.outliers_clipped.value += len(set(clipped) | set(opposed))
        for sender in opposed:
            logger.info("Robust aggregation found %s pulling against the round: %s for this peer's share points "
                        "away from the result (cosine %.2f over %d values, below %.2f)%s",
                        runner.sender_peer_ids[sender],
                        "its step since this peer's last round" if getattr(reducer, "origins", None) is not None
                        else "what it sent",
                        reducer.cosine_with_result(sender),
                        reducer.values_judged_by_sender[sender], reducer.opposed_bound(sender), behind.get(sender, ""))
        far = set(reducer.far_senders()) if self.judges_whole_share else set(clipped)
        for sender in clipped:
            # judged over the whole share (parameters), an honest peer that stepped more or less than the others is
            # clipped in a part often: worth a debug line, not an operator's attention
            evidence = sender in far
            logger.log(
                logging.INFO if evidence else logging.DEBUG,
                "Robust aggregation clipped %s as an outlier in %.0f%% of the values it sent for this peer's share "
                "(%d of %d parts)%s%s", runner.sender_peer_ids[sender],
                100 * reducer.outlier_values[sender] / reducer.values_sent[sender],
                reducer.clipped_by_sender[sender], reducer.num_parts,
                "" if evidence else " (no evidence: within the share's bound for parameters)", behind.get(sender, ""),
            )
