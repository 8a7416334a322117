"""The plan, samples and vote of a download split across donors (swarm/state_parts.py): parts of about equal size,
positions a donor cannot guess, honest donors agreeing through drift and lies (sign flip, scale, zeros, noise, NaN)
disagreeing, and a majority only where one exists."""

import math
import random

import pytest
import torch

from swarmd.swarm.state_parts import (
    MAX_POSITIONS, SAMPLES_PER_TENSOR, Part, draw_positions, majority, plan_parts, positions_problem, sample_values,
    samples_bytes, samples_disagree,
)


def test_parts_hold_about_equal_shares_of_the_elements_and_the_last_runs_to_the_end():
    shapes = [(1000, 100), (100,), (100, 100), (100,), (1000, 100), (1000, 100), (100,)]
    parts = plan_parts(shapes, 3)
    assert parts[0].first == 0 and parts[-1].stop is None
    assert all(a.stop == b.first for a, b in zip(parts, parts[1:]))
    sizes = [sum(math.prod(shapes[i]) for i in range(p.first, len(shapes) if p.stop is None else p.stop)) for p in parts]
    assert max(sizes) <= 2 * min(sizes), sizes
    assert plan_parts([(5,), (5,)], 3) == [Part(0, 1), Part(1, None)]  # never an empty part
    assert plan_parts([(10,)], 3) == [Part(0, None)]
    assert plan_parts([(1,), (1,), (10_000,)], 3) == [Part(0, 1), Part(1, 2), Part(2, None)]


def test_a_donor_is_asked_for_positions_outside_its_part_only_and_each_donor_for_others():
    shapes = [(50, 40), (40,), (40, 10), (10,), (50, 40)]
    own = Part(1, 3)
    generator = random.Random(1)
    first = draw_positions(shapes, compared=4, own=own, generator=generator)
    second = draw_positions(shapes, compared=4, own=own, generator=generator)
    assert [index for index, _ in first] == [0, 3]  # tensor 4 is not compared (a statistic), 1 and 2 are its own
    assert all(len(flat) == min(SAMPLES_PER_TENSOR, math.prod(shapes[i])) for i, flat in first)
    assert all(0 <= p < math.prod(shapes[i]) for i, flat in first for p in flat)
    assert first != second  # drawn anew for each donor
    many = draw_positions([(4,)] * (MAX_POSITIONS + 5), MAX_POSITIONS + 5, Part(0, 1), generator)
    assert sum(len(flat) for _, flat in many) <= MAX_POSITIONS


def honest(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {0: torch.randn(64, 32, generator=generator), 1: torch.randn(32, generator=generator) * 1e-3,
            2: torch.randn(32, 8, generator=generator)}


def reported(tensors, positions) -> bytes:
    return samples_bytes(sample_values(positions, [tensors[i] for i in range(len(tensors))]))


POSITIONS = [(0, list(range(0, 2048, 64))), (1, list(range(32))), (2, list(range(0, 256, 8)))]


def test_honest_donors_agree_through_drift_and_a_bias_near_zero():
    mine = honest()
    drifted = {i: t + 0.05 * t.std() * torch.randn_like(t) for i, t in mine.items()}
    drifted[1] = torch.randn(32) * 1e-3  # a small bias that went its own way: no weight in the model
    assert samples_disagree(POSITIONS, reported(mine, POSITIONS), mine) == ""
    assert samples_disagree(POSITIONS, reported(mine, POSITIONS), drifted) == ""


@pytest.mark.parametrize("lie", ["sign", "scale", "zeros", "noise", "one tensor", "nan"])
def test_a_lying_part_disagrees_with_an_honest_donors_samples(lie):
    mine = honest()
    lying = {
        "sign": lambda t: {i: -v for i, v in t.items()},
        "scale": lambda t: {i: v * -1e6 for i, v in t.items()},
        "zeros": lambda t: {i: torch.zeros_like(v) for i, v in t.items()},
        "noise": lambda t: {i: torch.randn_like(v) * v.std() for i, v in t.items()},
        "one tensor": lambda t: {**t, 2: -t[2]},
        "nan": lambda t: {**t, 0: torch.full_like(t[0], float("nan"))},
    }[lie](mine)
    assert samples_disagree(POSITIONS, reported(mine, POSITIONS), lying) != ""
    assert samples_disagree(POSITIONS, reported(lying, POSITIONS), mine) != ""  # its samples of others' parts too


def test_reported_values_that_do_not_match_the_positions_disagree():
    mine = honest()
    assert "values reported" in samples_disagree(POSITIONS, reported(mine, POSITIONS)[:-8], mine)
    assert "not finite" in samples_disagree(POSITIONS, b"\xff" * 8 * 96, mine)
    assert samples_disagree(POSITIONS, reported(mine, POSITIONS), {}) == ""  # nothing of theirs to compare


def test_positions_out_of_bounds_are_named():
    tensors = [torch.zeros(4), torch.zeros(2, 2)]
    assert positions_problem([[1, [3]]], tensors) == ""
    assert "not in the state" in positions_problem([[2, [0]]], tensors)
    assert "out of range" in positions_problem([[0, [4]]], tensors)
    assert "out of range" in positions_problem([[0, [-1]]], tensors)
    assert "not a list" in positions_problem({"a": 1}, tensors)
    assert "[tensor, [positions]]" in positions_problem([[0, 1]], tensors)


def test_the_majority_is_the_largest_agreeing_group_of_more_than_half():
    a, b, c = "a", "b", "c"
    pairs = lambda ab, ac, bc: {frozenset((a, b)): ab, frozenset((a, c)): ac, frozenset((b, c)): bc}  # noqa: E731
    assert majority([a, b, c], pairs(True, True, True)) == (a, b, c)
    assert majority([a, b, c], pairs(False, False, True)) == (b, c)  # a outvoted
    assert majority([a, b, c], pairs(False, False, False)) is None
    assert majority([a, b], {frozenset((a, b)): True}) == (a, b)
    assert majority([a, b], {frozenset((a, b)): False}) is None  # two that disagree: nobody to believe
