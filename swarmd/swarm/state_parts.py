"""A state taken in parts from several donors at once, each part compared with the other donors' view of it
(issues 37 and 34): the plan, the samples, the comparison and the vote. No I/O here: the download is
swarm/upstream/split_download.py, the wire swarm/upstream/state_stream.py.

Why parts: a joiner that takes the whole state from one donor waits for that donor's uplink (a home peer's few
Mbit/s) and for whatever keeps it busy; three donors each sending a third take a third of the time where the
donors' links are the limit. Why the comparison: a joiner has no state of its own to judge a donor's by, and a liar
that offers the newest epoch is asked first. Donors of one epoch hold the same parameters (sync: the same averaged
steps; DiLoCo: the same outer parameters; local updates: apart by the steps since the last averaging), so each
donor is also asked for the values at a few positions of every other part, drawn at random per donor and told to
no one else: a donor cannot know which of its values another one reports, so a part it changed (sign flipped,
scaled, zeroed, noise) disagrees with the others' samples. With three donors the odd one is outvoted and its part
taken from one of the two that agree; two that disagree leave no majority, and the joiner asks one donor at a
time as before (suspects last: swarm/exclusion.py). Only the parameters are compared: the optimizer's statistics of
peers under local updates or DiLoCo's inner optimizer are their own (each is still checked for its shape and for
being finite, as any download).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from bisect import bisect_left
from typing import Optional, Sequence

import torch

__all__ = [
    "Part", "plan_parts", "draw_positions", "sample_values", "samples_bytes", "samples_disagree", "majority", "positions_problem",
    "MAX_DONORS", "MAX_POSITIONS", "TOLERANCE",
]

MAX_DONORS = 3  # parts a download is split into: more streams than this gain little on a joiner's own downlink
SAMPLES_PER_TENSOR = 32  # positions of each compared tensor a donor reports of the others' parts
MAX_POSITIONS = 1 << 16  # positions one request may name (a donor refuses more: 512 kB of its values)
# How far apart two donors' samples of one tensor may be, as a share of their norm: honest donors of one epoch are
# far closer (sync and DiLoCo: equal but for the rounds one of them missed; local updates: a few local steps), while
# the lies that matter are not: a sign flip is 2.0 apart, zeros or noise at the parameters' scale 1.0 to 1.4.
TOLERANCE = 0.5


@dataclasses.dataclass(frozen=True)
class Part:
    """Tensors `first` to `stop` (not included) of a state; `stop` None: to the end, which may hold tensors this
    peer's layout does not name (DiLoCo's inner optimizer state)."""

    first: int
    stop: Optional[int]

    def holds(self, index: int) -> bool:
        return index >= self.first and (self.stop is None or index < self.stop)

    def words(self) -> str:
        return f"{self.first} {'end' if self.stop is None else self.stop}"


def plan_parts(shapes: Sequence[Sequence[int]], donors: int) -> list[Part]:
    """At most `donors` parts of consecutive tensors (at least one each) of about equal numbers of elements, for a
    state that begins with tensors of `shapes`; the last part runs to the end."""
    count = max(1, min(donors, len(shapes)))
    cumulative = list(itertools.accumulate(math.prod(shape) for shape in shapes))
    bounds = [0]
    for k in range(1, count):
        index = bisect_left(cumulative, cumulative[-1] * k / count) + 1  # tensors before it hold k/count of them
        bounds.append(min(max(index, bounds[-1] + 1), len(shapes) - (count - k)))
    return [Part(first, stop) for first, stop in zip(bounds, bounds[1:])] + [Part(bounds[-1], None)]


def draw_positions(shapes: Sequence[Sequence[int]], compared: int, own: Part,
                   generator: random.Random) -> list[tuple[int, list[int]]]:
    """(tensor, flat positions) a donor that sends `own` is asked to report: up to SAMPLES_PER_TENSOR of each of the
    first `compared` tensors outside its part, at most MAX_POSITIONS in all."""
    others = [index for index in range(min(compared, len(shapes))) if not own.holds(index)]
    if not others:
        return []
    per_tensor = max(1, min(SAMPLES_PER_TENSOR, MAX_POSITIONS // len(others)))
    drawn = []
    for index in others[:MAX_POSITIONS]:
        numel = math.prod(shapes[index])
        if numel:
            drawn.append((index, sorted(generator.sample(range(numel), min(per_tensor, numel)))))
    return drawn


def positions_problem(positions, tensors: Sequence[torch.Tensor]) -> str:
    """Why a request's positions cannot be reported from `tensors` (a donor's whole state), or ""."""
    if not isinstance(positions, list):
        return "positions are not a list"
    total = 0
    for entry in positions:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], list)):
            return "a position entry is not [tensor, [positions]]"
        index, flat = entry
        if not isinstance(index, int) or not 0 <= index < len(tensors):
            return f"tensor {index!r} is not in the state"
        total += len(flat)
        numel = tensors[index].numel()
        if total > MAX_POSITIONS or not all(isinstance(p, int) and 0 <= p < numel for p in flat):
            return f"positions of tensor {index} out of range or over {MAX_POSITIONS}"
    return ""


def sample_values(positions, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The values of `tensors` at `positions` (checked by positions_problem), as one float64 tensor."""
    values = [tensors[index].detach().reshape(-1)[torch.tensor(flat, dtype=torch.long)].to(torch.float64)
              for index, flat in positions]
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


def samples_bytes(values: torch.Tensor) -> bytes:
    """Sampled values as the wire carries them (little-endian float64), as samples_disagree reads them."""
    return values.detach().to(torch.float64).numpy().astype("<f8").tobytes()


def samples_disagree(positions, reported: bytes, received: dict[int, torch.Tensor]) -> str:
    """Why the values one donor `reported` at `positions` disagree with the tensors another sent (`received`, by
    index), or "". Per tensor: their distance over the larger norm of the two, where the norm is at least what the
    smaller side's typical value gives (a tensor near zero, a bias early on, is not held to its own tiny norm)."""
    values = torch.frombuffer(bytearray(reported), dtype=torch.float64) if reported else torch.zeros(0)
    expected = sum(len(flat) for _, flat in positions)
    if values.numel() != expected:
        return f"{values.numel()} values reported for {expected} positions"
    if not bool(torch.isfinite(values).all()):
        return "reported values are not finite"
    pairs, offset = [], 0
    for index, flat in positions:
        reported_part = values[offset:offset + len(flat)]
        offset += len(flat)
        if index in received:
            sent = received[index].detach().reshape(-1)[torch.tensor(flat, dtype=torch.long)].to(torch.float64)
            pairs.append((index, reported_part, sent))
    if not pairs:
        return ""
    typical = min(_rms(torch.cat([a for _, a, _ in pairs])), _rms(torch.cat([b for _, _, b in pairs])))
    for index, a, b in pairs:
        scale = max(float(a.norm()), float(b.norm()), typical * math.sqrt(a.numel()))
        distance = float((a - b).norm())
        if not math.isfinite(distance) or distance > TOLERANCE * scale:
            return f"tensor {index} is {distance / max(scale, 1e-30):.2f} of its norm from the other's"
    return ""


def majority(donors: Sequence, agree: dict[frozenset, bool]) -> Optional[tuple]:
    """The largest group of `donors` that agree pairwise (`agree[frozenset((a, b))]`) and are more than half of them,
    in the donors' order; None when there is none (two that disagree)."""
    for size in range(len(donors), len(donors) // 2, -1):
        for group in itertools.combinations(donors, size):
            if size >= 2 and all(agree[frozenset(pair)] for pair in itertools.combinations(group, 2)):
                return group
    return None


def _rms(values: torch.Tensor) -> float:
    return float(values.norm()) / math.sqrt(max(values.numel(), 1))
