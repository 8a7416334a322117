"""CenteredClip, the reduction every swarmd averager applies to its share of an all-reduce
(swarmd/swarm/upstream/robust_aggregation.py): a loud or a quiet liar barely moves it, and honest senders get their mean."""

import asyncio

import pytest
import torch

from swarmd.config.schema import AggregationConfig
from swarmd.swarm.upstream.robust_aggregation import Aggregation, CenteredClipReducer, centered_clip

D = 4096


def _honest(n, noise=0.5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    signal = torch.randn(D, generator=generator)
    return signal, [signal + noise * torch.randn(D, generator=generator) for _ in range(n)]


def _relative_error(result, reference, signal):
    return float(torch.linalg.vector_norm(result - reference) / torch.linalg.vector_norm(signal))


@pytest.mark.parametrize("attack", [-1e6, -1.0], ids=["loud x -1e6", "sign flip"])
def test_a_liar_barely_moves_the_result_where_the_mean_follows_it(attack):
    signal, honest = _honest(3)
    honest_mean = torch.stack(honest).mean(0)
    liar = attack * signal
    result, clipped = centered_clip([*honest, liar], [1.0] * 4, tau=1.0, iterations=3)
    mean = torch.stack([*honest, liar]).mean(0)
    assert _relative_error(result, honest_mean, signal) < 0.2
    assert _relative_error(mean, honest_mean, signal) > 0.4  # what hivemind's mean does with it
    assert clipped == [False, False, False, True]


def test_two_loud_liars_of_six_are_left_out_where_clipped_they_pulled_the_result_their_way():
    signal, honest = _honest(4, noise=1.0)
    honest_mean = torch.stack(honest).mean(0)
    generator = torch.Generator().manual_seed(1)
    senders = [*honest, *(-1e6 * (signal + torch.randn(D, generator=generator)) for _ in range(2))]
    left_out, flagged = centered_clip(senders, [1.0] * 6, tau=1.0, iterations=3, far_ratio=100.0)
    clipped, _ = centered_clip(senders, [1.0] * 6, tau=1.0, iterations=3, far_ratio=0.0)
    assert _relative_error(left_out, honest_mean, signal) < 0.05
    assert _relative_error(clipped, honest_mean, signal) > 0.3  # each clipped liar pulled by its share of the radius
    assert flagged == [False] * 4 + [True] * 2  # still evidence against them
    # honest senders alone, and a sender that stays under the bound, are aggregated as before
    for parts in (honest, [*honest, 50 * signal]):
        far, _ = centered_clip(parts, [1.0] * len(parts), tau=1.0, iterations=3, far_ratio=100.0)
        assert torch.equal(far, centered_clip(parts, [1.0] * len(parts), tau=1.0, iterations=3)[0])
    # the near senders weigh nothing (no samples) and the far one claims them all: the near ones count alike
    result, _ = centered_clip(senders[:5], [0.0] * 4 + [1.0], tau=1.0, iterations=3, far_ratio=100.0)
    assert _relative_error(result, honest_mean, signal) < 0.05


def test_without_a_liar_the_result_is_the_mean():
    signal, honest = _honest(5)
    result, clipped = centered_clip(honest, [16.0] * 5, tau=1.0, iterations=3)
    assert _relative_error(result, torch.stack(honest).mean(0), signal) < 1e-4
    assert not any(clipped)
    # uneven weights: the weighted mean lies further from the light senders than the radius, which clips them a bit
    weights = [16.0, 32.0, 16.0, 8.0, 16.0]
    result, _ = centered_clip(honest, weights, tau=1.0, iterations=3)
    weighted_mean = sum(w * x for w, x in zip(weights, honest)) / sum(weights)
    assert _relative_error(result, weighted_mean, signal) < 0.01


def test_two_senders_get_exactly_their_weighted_mean():
    # two peers cannot tell who lies: the plain-hivemind pair (and the interop test) see upstream's result
    a, b = torch.randn(D), 100 * torch.randn(D)
    result, clipped = centered_clip([a, b], [1.0, 3.0], tau=1.0, iterations=3)
    torch.testing.assert_close(result, (a + 3 * b) / 4)
    assert clipped == [False, False]


def test_non_finite_parts_and_bad_weights_are_left_out():
    signal, honest = _honest(2, noise=0.1)
    nan_part = torch.full((D,), float("nan"))
    result, clipped = centered_clip([*honest, nan_part, signal], [1.0, 1.0, 1.0, float("inf")], 1.0, 3)
    assert torch.isfinite(result).all()
    assert _relative_error(result, torch.stack(honest).mean(0), signal) < 0.1
    assert clipped[2] and clipped[3]


def test_the_reducer_aggregates_each_part_once_all_senders_sent_it():
    """Upstream's reducer bookkeeping (parts in order, a part complete when every sender's is in) with the robust
    accumulator: three senders, two parts, the third sender lies."""
    signal, honest = _honest(2, noise=0.1)

    async def run():
        reducer = CenteredClipReducer((torch.Size([D // 2]),) * 2, 3, Aggregation())
        sent = [*honest, -1e6 * signal]

        async def sender(index):
            parts = sent[index].split(D // 2)
            return [await reducer.accumulate_part(index, part, tensor) for part, tensor in enumerate(parts)]

        results = await asyncio.wait_for(asyncio.gather(*(sender(i) for i in range(3))), 10)
        return reducer, results

    reducer, results = asyncio.run(run())
    for result in results:
        assert _relative_error(torch.cat(result), torch.stack(honest).mean(0), signal) < 0.2
    assert reducer.clipped_by_sender == [0, 0, 2]
    assert reducer.clipped_senders() == [2]
    assert reducer.finished.is_set()


def test_the_setting_is_validated():
    assert Aggregation(**AggregationConfig().model_dump()) == Aggregation()
    with pytest.raises(ValueError):
        Aggregation(method="median")
    with pytest.raises(ValueError):
        AggregationConfig(tau=0)
    with pytest.raises(ValueError):
        AggregationConfig(method="trimmed")
    for off_or_beyond in (0.0, 2.0, 100.0):
        assert Aggregation(far_ratio=AggregationConfig(far_ratio=off_or_beyond).far_ratio).far_ratio == off_or_beyond
    for inside_the_outlier_bound in (0.5, 1.9):
        with pytest.raises(ValueError, match="0 .* or at least 2"):
            AggregationConfig(far_ratio=inside_the_outlier_bound)
        with pytest.raises(ValueError):
            Aggregation(far_ratio=inside_the_outlier_bound)


def test_a_part_of_the_wrong_size_is_left_out_not_waited_for():
    # (upstream's reducer would wait for the round's timeout: it counts the part received before adding it)
    signal, honest = _honest(2, noise=0.1)

    async def run():
        reducer = CenteredClipReducer((torch.Size([D]),), 3, Aggregation())
        sent = [*honest, torch.zeros(7)]
        calls = (reducer.accumulate_part(i, 0, sent[i]) for i in range(3))
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        return reducer, results

    reducer, results = asyncio.run(run())
    for result in results:
        torch.testing.assert_close(result, torch.stack(honest).mean(0))
    assert reducer.clipped_by_sender == [0, 0, 1]


@pytest.mark.parametrize("senders", [3, 4, 7, 20])
def test_the_median_is_the_coordinate_wise_median(senders):
    from swarmd.swarm.upstream.robust_aggregation import _median

    stacked = torch.randn(senders, 1000)
    torch.testing.assert_close(_median(stacked), torch.quantile(stacked, 0.5, dim=0))


def test_an_honest_sender_outside_in_a_tiny_part_only_is_not_counted_against_it():
    """In one value (a bias) the liar can sit between the honest senders and one of them look the outlier; the
    round counts a sender only when it was outside in most of what it sent."""
    signal, honest = _honest(2, noise=0.1)

    async def run():
        reducer = CenteredClipReducer((torch.Size([D]), torch.Size([1])), 3, Aggregation())
        sent = [[honest[0], torch.tensor([0.0])], [honest[1], torch.tensor([10.0])],
                [-1e6 * signal, torch.tensor([9.0])]]

        async def sender(index):
            return [await reducer.accumulate_part(index, part, tensor) for part, tensor in enumerate(sent[index])]

        await asyncio.wait_for(asyncio.gather(*(sender(i) for i in range(3))), 10)
        return reducer

    reducer = asyncio.run(run())
    assert reducer.clipped_by_sender == [1, 0, 1]  # sender 0 in the tiny part, the liar in the large one
    assert reducer.clipped_senders() == [2]


def test_every_swarmd_averager_reduces_robustly_with_the_configured_setting():
    """Gradients, parameters and DiLoCo's pseudo-gradients: each averager class carries the robust reduction (above
    hivemind's in the MRO), and the options every strategy builds with hand it the config's setting."""
    from types import SimpleNamespace

    from hivemind.averaging import DecentralizedAverager

    from swarmd.config.schema import SwarmdConfig
    from swarmd.swarm.upstream.diloco_state import DiLoCoStateAverager
    from swarmd.swarm.upstream.gradient_averager import GradientAveragerKeepingOwn
    from swarmd.swarm.upstream.state_averager import ObservedStateAverager
    from swarmd.swarm.strategies.shared import shared_optimizer_options
    from swarmd.swarm.upstream.outer_round import OuterAverager
    from swarmd.swarm.upstream.robust_aggregation import AggregatesRobustly

    for averager in (GradientAveragerKeepingOwn, ObservedStateAverager, DiLoCoStateAverager, OuterAverager):
        mro = averager.__mro__
        assert mro.index(AggregatesRobustly) < mro.index(DecentralizedAverager), averager

    config = SwarmdConfig.model_validate({"swarm": {"aggregation": {"tau": 2.5, "iterations": 5}}})
    model = torch.nn.Linear(2, 1)
    task = SimpleNamespace(parameter_groups=lambda m: list(m.parameters()), extra_tensors=lambda m: ())
    options = shared_optimizer_options(dht=SimpleNamespace(client_mode=False), config=config, model=model, task=task,
                                       averaging_log=None)
    assert options["averager_opts"]["aggregation"] == Aggregation(method="centered_clip", tau=2.5, iterations=5)


def test_a_majority_of_identical_parts_wins_without_counting_the_different_one_as_a_liar():
    # e.g. a state round: two peers hold the same parameters, the third took a local step of its own
    shared, stepped = torch.randn(D), torch.randn(D)
    result, clipped = centered_clip([shared, shared.clone(), stepped], [1.0, 1.0, 1.0], tau=1.0, iterations=3)
    torch.testing.assert_close(result, shared)
    assert not any(clipped)


def test_what_a_reducer_returns_is_checked_against_what_was_sent():
    """robust_aggregation.py implausible_return: the average (sent + delta) is refused when not finite or above
    RETURN_RATIO x max(|sent|, floor); an honest average, a sparse part under the floor and a part nobody can judge
    (zeros sent, no floor) pass."""
    from swarmd.swarm.upstream.robust_aggregation import RETURN_RATIO, implausible_return

    sent = torch.ones(1000)
    honest = torch.full((1000,), 2.0) - sent  # the group's average is 2: twice this peer's part
    assert implausible_return(sent, honest, floor=0.0) == ""
    assert "x this peer's part" in implausible_return(sent, 1000.0 * torch.ones(1000) - sent, floor=0.0)
    nan = honest.clone()
    nan[3] = float("nan")
    assert implausible_return(sent, nan, floor=0.0) == "not finite"
    sparse = torch.zeros(1000)
    sparse[0] = 0.01  # this peer's batch hardly touched these values; the others' did
    average = torch.full((1000,), 0.05)
    floor = 0.05 * 1000 ** 0.5  # this peer's whole vector, spread evenly: about the average's scale
    assert implausible_return(sparse, average - sparse, floor=floor) == ""
    assert implausible_return(sparse, average - sparse, floor=0.0) != ""  # without the floor it would be refused
    assert implausible_return(torch.zeros(10), torch.full((10,), 1e9), floor=0.0) == ""  # nothing to judge by
    assert RETURN_RATIO >= 10


def test_weights_are_capped_at_a_multiple_of_the_median():
    from swarmd.swarm.upstream.robust_aggregation import capped_weights

    assert capped_weights([64, 64, 64, 6400], 2.0) == [64, 64, 64, 128]
    assert capped_weights([64, 6400], 2.0) == [64, 6400]  # a pair: neither can be told the liar
    assert capped_weights([1.0, 1e-6], 2.0) == [1.0, 1e-6]  # a peer catching up weighs next to nothing, still
    assert capped_weights([1e-6, 64, 64, 6400], 2.0) == [1e-6, 64, 64, 128]
    assert capped_weights([64, 0, 128], 2.0) == [64, 0, 128]  # a weight of 0 stays 0 and is not the median
    # most of a state round just downloaded (1e-6 each: take, do not give): the one peer at full weight keeps it
    assert capped_weights([1.0, 1e-6, 1e-6, 1e-6], 2.0) == [1.0, 1e-6, 1e-6, 1e-6]
    assert capped_weights([64, 6400], 0.0) == [64, 6400]  # off


def test_a_sender_claiming_100x_the_samples_neither_sets_the_result_nor_makes_the_honest_look_like_liars():
    """Zeros with 100x the honest weight: capped at 2x the median (the default) it moves the result by a fifth of the
    signal, against 0.9 uncapped, and the evidence (judged with equal weights) names the zero sender, never an honest
    one."""
    from swarmd.swarm.upstream.robust_aggregation import _Sent

    signal, honest = _honest(3, noise=0.3)
    honest_mean = torch.stack(honest).mean(0)
    sent = [_Sent(i, part) for i, part in enumerate([*honest, torch.zeros_like(signal)])]
    weights = [64.0, 64.0, 64.0, 6400.0]

    async def reduce(aggregation):  # upstream's reducer makes asyncio objects: built inside a loop
        reducer = CenteredClipReducer([signal.shape], 4, aggregation)
        return reducer.aggregate(sent, weights), reducer.clipped_by_sender

    result, clipped = asyncio.run(reduce(Aggregation()))
    assert _relative_error(result, honest_mean, signal) < 0.25  # measured 0.19
    assert clipped == [0, 0, 0, 1]
    result, clipped = asyncio.run(reduce(Aggregation(max_weight_ratio=0.0)))
    assert _relative_error(result, honest_mean, signal) > 0.8  # uncapped, the zeros pull it most of the way: 0.90


def test_a_sender_claiming_far_more_samples_than_the_others_is_named_by_its_weight():
    """Honest values with 100x the samples claimed (the attack benchmark's "claims x100"): nothing to clip, the cap
    bounds what it does, and `overweight_senders` names it as the evidence (the averagers report it as an outlier,
    swarm/upstream/averager_gate.py). An honest peer 8x faster than the median is not named at the default bound
    (exclusion's claim_rate_ratio 8 x claims.SAMPLE_SLACK 2); a pair tells no liar; a bound of 0 is off."""
    from swarmd.swarm.upstream.robust_aggregation import _Sent

    signal, honest = _honest(4, noise=0.3)

    async def reduce(weights):  # upstream's reducer makes asyncio objects: built inside a loop
        reducer = CenteredClipReducer([signal.shape], len(weights), Aggregation())
        reducer.aggregate([_Sent(i, part) for i, part in enumerate(honest[:len(weights)])], weights)
        return reducer

    liar = asyncio.run(reduce([64.0, 64.0, 64.0, 6400.0]))
    assert liar.clipped_by_sender == [0, 0, 0, 0] and liar.overweight_senders(16.0) == [3]
    assert liar.overweight_senders(0.0) == []
    assert asyncio.run(reduce([64.0, 64.0, 64.0, 512.0])).overweight_senders(16.0) == []  # a fast honest peer
    assert asyncio.run(reduce([64.0, 6400.0])).overweight_senders(16.0) == []  # a pair
    assert asyncio.run(reduce([1e-6, 64.0, 64.0, 6400.0])).overweight_senders(16.0) == [3]  # one catching up
    # three of four just downloaded (1e-6 each): the peer at full weight is no liar (seen: an honest peer excluded so)
    assert asyncio.run(reduce([1.0, 1e-6, 1e-6, 1e-6])).overweight_senders(16.0) == []
    assert asyncio.run(reduce([6400.0, 64.0, 64.0, 1e-6, 1e-6])).overweight_senders(16.0) == [0]  # the liar still


def test_a_sender_weighing_next_to_nothing_is_no_evidence_against_it():
    """A peer catching up sends its older parameters at 1e-6 (a state round) or a pseudo-gradient at weight 0 (a
    DiLoCo outer round): far from the others by design, it cannot move the result, and is not counted as clipped,
    nor as sent (the round judged nothing of it); the same part at a full weight is clipped."""
    from swarmd.swarm.upstream.robust_aggregation import _Sent

    signal, honest = _honest(3, noise=0.1)
    far = -5 * signal
    sent = [_Sent(i, part) for i, part in enumerate([*honest, far])]

    async def clipped_with(weight):  # upstream's reducer makes asyncio objects: built inside a loop
        reducer = CenteredClipReducer([signal.shape], 4, Aggregation())
        result = reducer.aggregate(sent, [64.0, 64.0, 64.0, weight])
        return result, reducer.clipped_by_sender, reducer.values_sent

    for negligible in (0.0, 1e-6):
        result, clipped, values_sent = asyncio.run(clipped_with(negligible))
        assert clipped == [0, 0, 0, 0] and _relative_error(result, torch.stack(honest).mean(0), signal) < 0.05
        assert values_sent == [D, D, D, 0]  # nor a round it passed: the exclusion window does not count it
    assert asyncio.run(clipped_with(64.0))[1] == [0, 0, 0, 1]


def _reduced(parts, aggregation=Aggregation(), own_sender=None):
    """A reducer of one part that every sender in `parts` sent once (at equal weights), after the round."""
    from swarmd.swarm.upstream.robust_aggregation import _Sent

    async def run():  # upstream's reducer makes asyncio objects: built inside a loop
        reducer = CenteredClipReducer([parts[0].shape], len(parts), aggregation, own_sender=own_sender)
        reducer.aggregate([_Sent(i, part) for i, part in enumerate(parts)], [64.0] * len(parts))
        return reducer

    return asyncio.run(run())


def test_a_sign_flip_at_honest_scale_is_kept_by_the_clip_but_found_pulling_against_the_round():
    """Gradients a little noisier than their mean (the honest senders' cosines with the result, ~0.7, are those of
    the attack benchmark's sync cells): a sender that flips its own gradient stays within the clip radius and is no
    outlier by distance, part by part or over the share, but what it sends points away from the result, where
    every honest sender's points towards it. (Noisier still, its own noise in the result outweighs the flip: at
    twice the signal's norm it is at +0.09, and does as little as the noise.)"""
    signal, honest = _honest(3, noise=1.5)
    flipped = -(signal + 1.5 * torch.randn(D, generator=torch.Generator().manual_seed(7)))
    reducer = _reduced([*honest, flipped])
    assert reducer.clipped_senders() == [] and reducer.far_senders() == []  # what the distances say: nothing
    assert reducer.opposed_senders() == [3]
    cosines = [reducer.cosine_with_result(sender) for sender in range(4)]
    assert min(cosines[:3]) > 0.5 and cosines[3] < -0.1, cosines


def test_honest_noise_a_zero_update_and_the_setting_off_are_never_opposed():
    """Senders of pure noise (no common direction at all) are each part of the result they are judged against
    (cosine ~1/sqrt(n) with their mean); a sender with nothing computed sends zeros (cosine 0); and with
    judge_direction off nothing is judged."""
    generator = torch.Generator().manual_seed(3)
    noise = [torch.randn(D, generator=generator) for _ in range(5)]
    reducer = _reduced([*noise, torch.zeros(D)])
    assert reducer.opposed_senders() == []
    assert min(reducer.cosine_with_result(sender) for sender in range(5)) > 0.2
    assert reducer.cosine_with_result(5) == 0.0
    signal, honest = _honest(3, noise=1.5)
    assert _reduced([*honest, -signal], Aggregation()).opposed_senders() == [3]
    assert _reduced([*honest, -signal], Aggregation(judge_direction=False)).opposed_senders() == []


def test_in_a_pair_the_other_update_is_judged_by_the_direction_of_this_peers_own():
    """A group of two with this peer: the result is their mean, so the other's part is judged against this peer's
    own part; a flipped one points away from it, an honest one (as noisy) does not; a client's pair (this peer sent
    nothing) is not judged."""
    signal, (own, honest) = _honest(2, noise=1.5)
    flipped = -(signal + 1.5 * torch.randn(D, generator=torch.Generator().manual_seed(7)))
    assert _reduced([own, flipped], own_sender=0).opposed_senders() == [1]
    assert _reduced([own, honest], own_sender=0).opposed_senders() == []
    assert _reduced([own, flipped], own_sender=None).opposed_senders() == []


def test_honest_senders_at_the_noise_floor_are_not_found_pulling_against_by_chance():
    """Updates of a 363-value share (the attack benchmark's model in six shares) once the loss is at its noise floor:
    the signal a tenth of each 64-sample batch's noise. In a pair judged by this peer's own part, the other's cosine
    is below 0 in about half of the rounds by chance (and six senders' cosines with a result they are part of stay
    positive). Only a cosine below what chance explains over the judged values (OPPOSED_SIGMAS) is evidence; a flipper
    with a signal to flip still is."""
    from swarmd.swarm.upstream.robust_aggregation import OPPOSED_COSINE

    d, rounds = 363, 60
    found, pair_found, pair_below_zero = 0, 0, 0
    for seed in range(rounds):
        generator = torch.Generator().manual_seed(seed)
        signal = 0.1 * torch.randn(d, generator=generator)
        updates = [signal + torch.randn(d, generator=generator) for _ in range(6)]
        reducer = _reduced(updates, own_sender=0)
        found += len(reducer.opposed_senders())
        pair = _reduced(updates[:2], own_sender=0)
        pair_found += len(pair.opposed_senders())
        pair_below_zero += pair.cosine_with_result(1) < OPPOSED_COSINE
    assert pair_below_zero > rounds // 4, pair_below_zero  # what a bare sign test would have counted against them
    assert found == 0 and pair_found <= 1, (found, pair_found)

    generator = torch.Generator().manual_seed(99)
    signal = torch.randn(d, generator=generator)
    honest = [signal + 1.5 * torch.randn(d, generator=generator) for _ in range(5)]
    assert _reduced([*honest, -(signal + 1.5 * torch.randn(d, generator=generator))]).opposed_senders() == [5]


def test_the_evidence_says_which_senders_were_behind_the_rounds_epoch():
    """The epochs a gradient round's members sent (upstream's gathered triples: bandwidth, mode, user data), read in
    the reducer's process: a sender one epoch behind is named so in the evidence lines (an honest peer the swarm
    outran looks like a liar by distance and direction), a stranger's unreadable bytes give no epochs."""
    import types

    from hivemind.p2p import PeerID
    from hivemind.utils.serializer import MSGPackSerializer

    from swarmd.swarm.upstream.robust_aggregation import AggregatesRobustly, _behind_the_round

    peers = [PeerID(f"peer-{i}".encode()) for i in range(4)]
    sent = [MSGPackSerializer.dumps([1e9, 0, MSGPackSerializer.dumps(epoch)]) for epoch in (12, 12, 11, None)]
    reader = types.SimpleNamespace(serializer=MSGPackSerializer)
    epochs = AggregatesRobustly._gathered_epochs(reader, types.SimpleNamespace(peer_ids=peers, gathered=sent))
    assert epochs == dict(zip(peers, (12, 12, 11, None)))
    assert _behind_the_round(peers, epochs) == {2: "; it was at epoch 11, the round's members at 12: behind the swarm"}
    assert _behind_the_round(list(reversed(peers)), epochs).keys() == {1}  # by each sender's index in the round
    assert _behind_the_round(peers, {**epochs, peers[2]: "11"}) == {}  # what is no epoch is not taken as one
    broken = types.SimpleNamespace(peer_ids=peers, gathered=[b"\xc1"] * 4)
    assert AggregatesRobustly._gathered_epochs(reader, broken) == {}
    assert _behind_the_round(peers, {}) == {}


def _reduced_from(parts, origins, aggregation=Aggregation()):
    """`_reduced` with each part's origin (`CenteredClipReducer.origins`): the values after this peer's last round."""
    from swarmd.swarm.upstream.robust_aggregation import _Sent

    async def run():
        reducer = CenteredClipReducer([parts[0].shape], len(parts), aggregation, origins=origins)
        reducer.aggregate([_Sent(i, part) for i, part in enumerate(parts)], [1.0] * len(parts))
        return reducer

    return asyncio.run(run())


def test_parameters_are_judged_by_their_step_since_the_last_round():
    """Parameters of one lineage (all near the last round's result, far larger than a step) all point alike: judged as
    sent, a sender that stepped uphill at honest scale is found by nothing. Judged by each step since the last
    round's result (the origin), it points away from the result's step, where each honest step points towards it; a
    part without an origin (optimizer statistics) is not judged at all."""
    signal, honest = _honest(3, noise=1.5)
    uphill = -(signal + 1.5 * torch.randn(D, generator=torch.Generator().manual_seed(7)))
    origin = 20 * torch.randn(D, generator=torch.Generator().manual_seed(11))
    parameters = [origin + step for step in (*honest, uphill)]
    as_sent = _reduced(parameters)
    assert as_sent.opposed_senders() == [] and as_sent.clipped_senders() == [] and as_sent.far_senders() == []
    stepped = _reduced_from(parameters, [origin])
    assert stepped.opposed_senders() == [3]
    cosines = [stepped.cosine_with_result(sender) for sender in range(4)]
    assert min(cosines[:3]) > 0.5 and cosines[3] < -0.1, cosines
    assert _reduced_from(parameters, [None]).values_judged_by_sender == [0, 0, 0, 0]
    assert _reduced_from(parameters, [origin], Aggregation(judge_direction=False)).opposed_senders() == []


def test_each_part_of_the_share_finds_its_own_values_of_the_origins():
    """upstream's TensorPartContainer splits each averaged tensor into parts and deals them out to the group's
    reducers; `origin_parts` finds, for each part this peer reduces, the same values of the origins (the leading
    tensors: parameters), and None in the tensors past them (optimizer statistics)."""
    from hivemind.averaging.partition import TensorPartContainer

    from swarmd.swarm.upstream.robust_aggregation import origin_parts

    tensors = [torch.arange(float(n)).reshape(-1, 10) + 1000 * index for index, n in enumerate((300, 120, 250))]
    origins = [-tensor for tensor in tensors[:2]]  # any values of the parameters' shapes
    container = TensorPartContainer(tensors, (1.0, 1.0, 1.0), part_size_bytes=400)  # parts of 100 values
    seen = 0
    for peer in range(3):
        parts = container.get_raw_input_parts(peer)
        found = origin_parts(origins, tensors, parts)
        assert len(found) == len(parts) and parts
        for part, origin in zip(parts, found):
            in_statistics = part.min() >= 2000
            assert (origin is None) == bool(in_statistics)
            if origin is not None:
                assert torch.equal(origin, -part)
                seen += part.numel()
    assert seen == 420  # every value of the two leading tensors, once
