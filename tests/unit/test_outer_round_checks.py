"""What DiLoCo members send with an outer round to tell whether their outer states agree: the exact digest of the
first outer step, the fingerprint of the later ones, and how an entry of any swarmd version reads."""

import torch

from swarmd.swarm.upstream.outer_round import bytes_digest, fingerprint_difference, gathered_entry


def _state():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(64, 32, generator=generator), torch.tensor(0.25), torch.randn(7, generator=generator).bfloat16()]


def test_the_digest_is_equal_for_equal_states_and_tells_one_changed_bit():
    state, same = _state(), _state()
    assert bytes_digest(state) == bytes_digest(same)  # 0-d and bf16 tensors included
    same[0].view(torch.int32)[3, 5] ^= 1  # the lowest bit of one value
    assert bytes_digest(state) != bytes_digest(same)
    assert bytes_digest(state) != bytes_digest(state[:2])
    # a transposed view digests its values in their logical order, as a contiguous copy of it
    assert bytes_digest([state[0].t()]) == bytes_digest([state[0].t().contiguous()])


def test_two_initialisations_look_alike_to_the_fingerprint_and_not_to_the_digest():
    """Why the first outer step sends a digest: the norms of two random inits differ by ~1/sqrt(N), below the
    fingerprint's default tolerance for a model of a few million parameters."""
    from swarmd.config.schema import DiLoCoConfig

    first, second = (torch.randn(4_000_000, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2))
    norms = [[float(t.abs().sum()), float(t.dot(t))] for t in (first, second)]
    assert fingerprint_difference(norms) < DiLoCoConfig().state_check_tolerance
    assert bytes_digest([first]) != bytes_digest([second])


def test_a_gathered_entry_reads_every_version():
    assert gathered_entry([3, True, {"digest": "ab"}]) == (3, True, [], "ab")
    assert gathered_entry([3, False, [1.0, 2.0]]) == (3, False, [1.0, 2.0], "")
    assert gathered_entry([3, False]) == (3, False, [], "")  # older swarmd: no fingerprint
    assert gathered_entry(3) == (3, False, [], "")  # older still: the epoch alone
