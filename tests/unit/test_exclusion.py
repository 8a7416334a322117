"""Exclusion on evidence (swarmd/swarm/exclusion.py): the table's rules, the list every process reads, the way the
evidence comes back from another process, and where an excluded peer is refused."""

import asyncio
import dataclasses
import multiprocessing as mp
import random
import time
import types

import pytest

from swarmd.swarm.exclusion import (
    EVIDENCE_QUEUE, EXCLUDED_FILE, ExclusionList, ExclusionPolicy, Exclusions, ExclusionTable, exclusions, feed,
)

T0 = 1_700_000_000.0


def clipped_rounds(table, peer, count, start=T0, every=2.0, clipped=True):
    made = None
    for i in range(count):
        made = table.observe_round(peer, clipped, start + i * every) or made
    return made


def test_one_clipped_round_is_no_evidence_three_are():
    table = ExclusionTable(ExclusionPolicy(rounds=3))
    assert table.observe_round("liar", True, T0) is None
    assert table.observe_round("liar", True, T0 + 1) is None
    made = table.observe_round("liar", True, T0 + 2)
    assert made is not None and made.reason == "clipped" and made.clipped_rounds == 3 and made.rounds_seen == 3
    assert made.until == T0 + 2 + 60.0 and made.exclusions == 1
    assert table.is_excluded("liar", T0 + 3) and [e.peer_id for e in table.excluded(T0 + 3)] == ["liar"]
    assert table.totals == {"clipped": 1, "returned": 0, "claims": 0, "state": 0}


def test_a_clean_run_excludes_nobody_even_with_rare_clipped_rounds():
    """Honest senders: hours of rounds, each clipped now and then (1 in 10, some twice in a row): never the majority
    of their rounds, so never excluded."""
    table = ExclusionTable(ExclusionPolicy())
    rng = random.Random(0)
    for i in range(20_000):  # a round every 0.5 s: 2.8 hours, four honest senders
        for peer in ("a", "b", "c", "d"):
            assert table.observe_round(peer, rng.random() < 0.1, T0 + i * 0.5) is None
    assert table.excluded(T0 + 10_000) == () and table.totals == {"clipped": 0, "returned": 0, "claims": 0, "state": 0}


def test_a_peer_clipped_in_a_minority_of_its_rounds_is_not_excluded():
    table = ExclusionTable(ExclusionPolicy(rounds=3, share=0.5))
    for i in range(10):
        table.observe_round("p", i % 3 == 0, T0 + i)  # clipped in 4 of 10
    assert not table.is_excluded("p", T0 + 10)
    for i in range(10, 20):
        table.observe_round("p", True, T0 + i)  # now 14 of 20
    assert table.is_excluded("p", T0 + 20)


def test_evidence_older_than_the_window_does_not_count():
    table = ExclusionTable(ExclusionPolicy(rounds=3, window=60.0))
    clipped_rounds(table, "p", 2, start=T0)
    assert table.observe_round("p", True, T0 + 100) is None  # the first two aged out
    assert table.observe_round("p", True, T0 + 101) is None
    assert table.observe_round("p", True, T0 + 102) is not None


def test_the_time_doubles_with_each_exclusion_up_to_the_cap():
    policy = ExclusionPolicy(rounds=3, base_seconds=60.0, max_seconds=200.0, window=600.0)
    table = ExclusionTable(policy)
    now, lengths = T0, []
    for _ in range(4):
        made = clipped_rounds(table, "liar", 3, start=now, every=1.0)
        lengths.append(made.until - made.since)
        assert made.clipped_rounds == 3  # fresh evidence each time: the last exclusion's was spent with it
        now = made.until + 1.0
        assert not table.is_excluded("liar", now)
    assert lengths == [60.0, 120.0, 200.0, 200.0]


def test_while_excluded_nothing_is_recorded_and_it_expires_on_time():
    table = ExclusionTable(ExclusionPolicy(rounds=3, base_seconds=60.0))
    made = clipped_rounds(table, "liar", 3)
    assert table.observe_round("liar", True, made.since + 10) is None
    assert table.is_excluded("liar", made.until - 0.001) and not table.is_excluded("liar", made.until)
    table.expire(made.until + 1)
    assert table.excluded(made.until + 1) == () and len(table) == 1  # its count of exclusions is remembered


def test_a_peer_well_behaved_for_max_seconds_starts_again_from_the_base_time():
    policy = ExclusionPolicy(rounds=3, base_seconds=60.0, max_seconds=600.0)
    table = ExclusionTable(policy)
    first = clipped_rounds(table, "p", 3)
    table.expire(first.until + 600.0)
    assert len(table) == 0  # forgotten altogether
    again = clipped_rounds(table, "p", 3, start=first.until + 700.0)
    assert again.until - again.since == 60.0 and again.exclusions == 1


def test_claims_in_three_epochs_exclude_and_repeats_in_one_epoch_do_not():
    table = ExclusionTable(ExclusionPolicy(rounds=3))
    for i in range(10):
        assert table.observe_claim("p", 7, T0 + i) is None  # one epoch, fetched ten times
    assert table.observe_claim("p", 8, T0 + 11) is None
    made = table.observe_claim("p", 9, T0 + 12)
    assert made is not None and made.reason == "claims" and made.capped_claims == 3
    assert table.totals == {"clipped": 0, "returned": 0, "claims": 1, "state": 0}


def test_with_exclusion_off_the_evidence_excludes_nobody():
    table = ExclusionTable(ExclusionPolicy(enabled=False))
    assert clipped_rounds(table, "liar", 10) is None and table.excluded(T0 + 20) == ()


def test_the_table_is_bounded_and_a_flood_of_ids_cannot_free_an_excluded_peer():
    table = ExclusionTable(ExclusionPolicy(max_peers=50, rounds=3))
    clipped_rounds(table, "liar", 3)
    for i in range(10_000):  # strangers' made-up ids, one round each
        table.observe_round(f"stranger-{i}", False, T0 + 10 + i * 0.001)
    assert len(table) <= 50
    assert table.is_excluded("liar", T0 + 30)
    # full of excluded peers only: a newcomer's evidence is dropped, not stored
    full = ExclusionTable(ExclusionPolicy(max_peers=2, rounds=1, share=0.0))
    full.observe_round("x", True, T0)
    full.observe_round("y", True, T0)
    assert full.observe_round("z", True, T0 + 1) is None and len(full) == 2 and full.dropped_total == 1


def test_reports_feed_the_table_and_malformed_ones_are_skipped():
    table = ExclusionTable(ExclusionPolicy(rounds=2))
    made = feed(table, [
        ("round", T0, (("liar", True), ("honest", False))),
        ("nonsense",), ("round", "not a time", (("liar", True),)), ("round", T0 + 1, ((None,),)),
        ("claims", T0 + 1, 3, ("greedy",)),
        ("round", T0 + 2, (("liar", True), ("honest", False))),
    ])
    assert [e.peer_id for e in made] == ["liar"] and not table.is_excluded("honest", T0 + 3)


def _report_from_a_child(exclusion_list):
    exclusion_list.report_round([("liar", True), ("honest", False)])
    exclusion_list.report_claims(["greedy"], 4)


def test_evidence_comes_back_from_a_forked_process_and_the_list_reaches_it(tmp_path):
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()
    listed.publish(["liar"])
    child = mp.get_context("fork").Process(target=_report_from_a_child, args=(listed,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    items = []
    for _ in range(50):
        items += listed.drain()
        if len(items) == 2:
            break
        time.sleep(0.1)
    assert [item[0] for item in items] == ["round", "claims"]
    assert listed.excludes("liar") and not listed.excludes("honest")
    assert listed.admit("honest", "join_group") and not listed.admit("liar", "join_group")
    assert not listed.admit("liar", "state_source")
    assert listed.refusals() == {"join_group": 1, "aggregate_part": 0, "leader": 0, "state_source": 1}


def test_a_full_queue_drops_evidence_instead_of_blocking(tmp_path):
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()
    began = time.monotonic()
    for _ in range(1000):
        listed.report_round([("liar", True)])  # returns at once, however many
    assert time.monotonic() - began < 5
    drained = []
    for _ in range(50):
        drained += listed.drain()
        if len(drained) == EVIDENCE_QUEUE:
            break
        time.sleep(0.1)
    assert len(drained) == EVIDENCE_QUEUE


class _View:
    def __init__(self, tmp_path):
        self.config = types.SimpleNamespace(state_path=tmp_path)


def test_the_extension_publishes_exclusions_to_every_process_and_lifts_them(tmp_path):
    asyncio.run(_the_extension_publishes_and_lifts(tmp_path))


async def _the_extension_publishes_and_lifts(tmp_path):
    from swarmd.swarm import exclusion

    now = [T0]
    extension = Exclusions(ExclusionPolicy(rounds=2, base_seconds=30.0), clock=lambda: now[0])
    await extension.start(_View(tmp_path))
    try:
        assert exclusion.installed() is extension.list
        reader = ExclusionList(tmp_path / EXCLUDED_FILE)  # what another process reads
        extension.list._evidence.put(("round", T0, (("liar", True),)))
        extension.list._evidence.put(("round", T0 + 1, (("liar", True),)))
        for _ in range(50):
            extension.update()
            if extension.table.is_excluded("liar", now[0]):
                break
            await asyncio.sleep(0.1)
        assert reader.excludes("liar")
        fields = extension.snapshot_fields()
        (shown,) = fields["excluded_peers"]
        assert shown.peer_id == "liar" and shown.reason == "clipped" and shown.clipped_rounds == 2
        assert fields["exclusions_total"] == {"clipped": 1, "returned": 0, "claims": 0, "state": 0}
        now[0] = shown.until + 1
        extension.update()
        assert not reader.excludes("liar") and extension.snapshot_fields()["excluded_peers"] == ()
    finally:
        await extension.close()
    assert exclusion.installed() is None


def test_the_config_turns_it_on_by_default_and_off_when_asked():
    from swarmd.config.schema import SwarmdConfig

    assert exclusions(SwarmdConfig().swarm) is not None
    off = SwarmdConfig.model_validate({"swarm": {"exclusion": {"enabled": False, "claim_rate_ratio": 0.0}}})
    assert exclusions(off.swarm) is None
    policy = exclusions(SwarmdConfig.model_validate({"swarm": {"exclusion": {"rounds": 5}}}).swarm).policy
    assert policy.rounds == 5 and policy.max_seconds == 3600.0


@pytest.mark.parametrize("bad, message", [
    ({"rounds": 0}, "swarm.exclusion.rounds"),
    ({"share": 1.0}, "swarm.exclusion.share"),
    ({"base_seconds": 100.0, "max_seconds": 10.0}, "max_seconds 10 must be at least base_seconds 100"),
])
def test_the_config_is_checked(bad, message):
    from pydantic import ValidationError

    from swarmd.config.schema import SwarmdConfig

    with pytest.raises(ValidationError) as raised:
        SwarmdConfig.model_validate({"swarm": {"exclusion": bad}})
    text = str(raised.value)
    assert message in text or message.split(".")[-1] in text


def test_an_excluded_peer_is_no_state_source_and_no_leader(tmp_path):
    from hivemind.p2p import PeerID
    from hivemind.utils.timed_storage import ValueWithExpiration

    from swarmd.swarm.upstream.averager_pace import _PacedReads
    from swarmd.swarm.upstream.state_stream import state_offers

    own, honest, liar = (PeerID(f"peer-{i}".encode()) for i in range(3))
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()
    listed.publish([liar.to_base58()])
    found = ValueWithExpiration({peer.to_bytes(): ValueWithExpiration(5.0, T0) for peer in (own, honest, liar)}, T0)
    assert set(state_offers(found, own, None, listed)) == {honest}
    assert set(state_offers(found, own, None)) == {honest, liar}  # exclusions off

    class Keys:
        async def get_averagers(self, *args, **kwargs):
            return [(honest, T0), (liar, T0)]

    reads = _PacedReads(Keys(), 0.0, listed)
    assert asyncio.run(reads.get_averagers("key", True)) == [(honest, T0)]
    assert listed.refusals()["state_source"] == 1 and listed.refusals()["leader"] == 1


def _method_only(cls, listed, own):
    """An averager of `cls` with its methods alone (no process, no DHT), reporting its evidence to `listed`."""

    class Averager(cls):
        peer_id = None

        def __del__(self):
            pass

    averager = Averager.__new__(Averager)
    averager.outliers_clipped, averager._exclusions, averager.peer_id = mp.Value("q", 0), listed, own
    return averager


def _drained(listed, count: int) -> list:
    """The reports the averagers' processes sent, once `count` of them came (or 5 s passed)."""
    reports = []
    for _ in range(50):
        reports += listed.drain()
        if len(reports) >= count:
            break
        time.sleep(0.1)
    return reports


def test_each_judged_round_reports_every_other_sender(tmp_path):
    """What an averager sends after a round of its share (swarm/upstream/averager_gate.py): every other sender that sent a
    part, with whether it was clipped, from a round of three or more, or of two with this peer one of them (its own
    part the reference); a pair of others only when clipped (a non-finite part); this peer never."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers

    own, honest, liar, silent = (PeerID(f"peer-{i}".encode()) for i in range(4))
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()

    averager = _method_only(AdmitsAllowedPeers, listed, own)

    def round_of(senders, clipped, sent):
        reducer = types.SimpleNamespace(
            clipped_senders=lambda: clipped, overweight_senders=lambda ratio: [], values_sent=sent,
            outlier_values=[10 if i in clipped else 0 for i in range(len(senders))],
            clipped_by_sender=[1 if i in clipped else 0 for i in range(len(senders))], num_parts=1,
        )
        return types.SimpleNamespace(tensor_part_reducer=reducer, sender_peer_ids=senders)

    averager._count_outliers(round_of([own, honest, liar, silent], [2], [10, 10, 10, 0]))
    averager._count_outliers(round_of([own, liar], [], [10, 10]))  # a pair with this peer: judged
    averager._count_outliers(round_of([honest, liar], [], [10, 10]))  # a client's pair: nobody told apart
    averager._count_outliers(round_of([honest, liar], [1], [10, 10]))  # ...but a non-finite part counts
    reports = _drained(listed, 3)
    assert [senders for _, _, senders in reports] == [
        ((honest.to_base58(), False), (liar.to_base58(), True)),
        ((liar.to_base58(), False),),
        ((liar.to_base58(), True),),
    ]
    assert averager.outliers_clipped.value == 2


def test_parameters_and_gradients_are_judged_over_the_whole_share(tmp_path):
    """A state round (parameters) or a gradient round reports the senders far over this peer's whole share
    (far_senders), not those clipped part by part: under local updates honest parameters differ by how far each peer
    stepped since the last round, and part by part the attack benchmark's clean cells excluded honest peers, for
    the tiny parts above all (swarm/upstream/state_averager.py). Every judged sender is reported, far or not."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
    from swarmd.swarm.upstream.state_averager import RecordsRounds

    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager
    from swarmd.swarm.upstream.outer_round import OuterAverager

    assert RecordsRounds.judges_whole_share and AdmittingGradientAverager.judges_whole_share
    assert not AdmitsAllowedPeers.judges_whole_share and not OuterAverager.judges_whole_share  # DiLoCo: part by part
    own, slow, level, liar = (PeerID(f"peer-{i}".encode()) for i in range(4))
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()

    averager = _method_only(RecordsRounds, listed, own)
    reducer = types.SimpleNamespace(
        clipped_senders=lambda: [1, 3], far_senders=lambda: [3], overweight_senders=lambda ratio: [],
        values_sent=[10] * 4,
        outlier_values=[0, 10, 0, 10], clipped_by_sender=[0, 1, 0, 1], num_parts=1)
    averager._count_outliers(
        types.SimpleNamespace(tensor_part_reducer=reducer, sender_peer_ids=[own, slow, level, liar]))
    reports = _drained(listed, 1)
    assert [senders for _, _, senders in reports] == [
        ((slow.to_base58(), False), (level.to_base58(), False), (liar.to_base58(), True))]
    assert averager.outliers_clipped.value == 2  # both were clipped in the aggregation all the same


def test_an_update_pulling_against_the_round_is_reported_as_an_outlier_where_updates_are_averaged(tmp_path):
    """Gradient and DiLoCo outer rounds report a sender whose update pointed away from the result
    (CenteredClipReducer.opposed_senders) as an outlier in that round, unless `judge_direction` is off; a state
    round (parameters, which all point alike) never asks."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager
    from swarmd.swarm.upstream.outer_round import OuterAverager
    from swarmd.swarm.upstream.robust_aggregation import Aggregation
    from swarmd.swarm.upstream.state_averager import RecordsRounds

    assert AdmittingGradientAverager.judges_direction and OuterAverager.judges_direction
    assert not RecordsRounds.judges_direction
    own, honest, flipper = (PeerID(f"peer-{i}".encode()) for i in range(3))

    def reported(cls, aggregation):
        listed = ExclusionList(tmp_path / f"{cls.__name__}-{aggregation.judge_direction}")
        listed.start()
        averager = _method_only(cls, listed, own)
        averager.aggregation = aggregation
        reducer = types.SimpleNamespace(
            clipped_senders=lambda: [], far_senders=lambda: [], opposed_senders=lambda: [2],
            overweight_senders=lambda ratio: [],
            cosine_with_result=lambda sender: -0.5, opposed_bound=lambda sender: -0.1, values_judged_by_sender=[10] * 3,
            values_sent=[10] * 3, outlier_values=[0] * 3,
            clipped_by_sender=[0] * 3, num_parts=1)
        averager._count_outliers(types.SimpleNamespace(tensor_part_reducer=reducer,
                                                       sender_peer_ids=[own, honest, flipper]))
        return [senders for _, _, senders in _drained(listed, 1)], averager.outliers_clipped.value

    flagged = [((honest.to_base58(), False), (flipper.to_base58(), True))]
    for cls in (AdmittingGradientAverager, OuterAverager):
        assert reported(cls, Aggregation()) == (flagged, 1), cls
        assert reported(cls, Aggregation(judge_direction=False))[0] == [
            ((honest.to_base58(), False), (flipper.to_base58(), False))], cls
    assert reported(RecordsRounds, Aggregation())[0] == [((honest.to_base58(), False), (flipper.to_base58(), False))]


def test_a_stale_update_or_a_pairs_word_alone_is_no_evidence_of_pulling_against(tmp_path):
    """A sender whose update is of another epoch than the round's (or than this peer's own, in a pair where this
    peer's part is the reference) pointed away by staleness, not by a lie (the liar swarm test: an honest founder a
    step behind at cosine -0.79): not reported as an outlier. In a pair, an update pointing away from this peer's own
    counts only against a peer this peer already suspects (the same swarm test: a peer whose parameters a download
    from the liar had set astray found its honest partner "pulling against" in 6 of 11 pair rounds, and excluded it).
    A sender in step in a group of three or more, or one that sent no epoch (a plain hivemind peer), is judged as
    before."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager
    from swarmd.swarm.upstream.robust_aggregation import Aggregation

    own, behind, flipper, plain = (PeerID(f"peer-{i}".encode()) for i in range(4))

    def reported(senders, epochs, suspects=()):
        listed = ExclusionList(tmp_path / f"round-{len(list(tmp_path.iterdir()))}")
        listed.start()
        listed.publish([], suspects=[peer.to_base58() for peer in suspects])
        averager = _method_only(AdmittingGradientAverager, listed, own)
        averager.aggregation = Aggregation()
        count = len(senders)
        reducer = types.SimpleNamespace(
            clipped_senders=lambda: [], far_senders=lambda: [], opposed_senders=lambda: list(range(1, count)),
            overweight_senders=lambda ratio: [], cosine_with_result=lambda sender: -0.8,
            opposed_bound=lambda sender: -0.1, values_judged_by_sender=[100] * count, values_sent=[100] * count,
            outlier_values=[0] * count, clipped_by_sender=[0] * count, num_parts=1)
        averager._count_outliers(types.SimpleNamespace(tensor_part_reducer=reducer, sender_peer_ids=senders), epochs)
        return {peer: flagged for _, _, report in _drained(listed, 1) for peer, flagged in report}

    group = [own, behind, flipper, plain]
    assert reported(group, {own: 29, behind: 28, flipper: 29}) == {
        behind.to_base58(): False, flipper.to_base58(): True, plain.to_base58(): True}
    # ...where the round's epochs cannot be read, everyone is judged
    assert reported([own, behind, flipper], {}) == {behind.to_base58(): True, flipper.to_base58(): True}
    # in a pair: only against a suspect, and with this peer's own epoch the reference
    assert reported([own, flipper], {own: 29, flipper: 29}) == {flipper.to_base58(): False}
    assert reported([own, flipper], {own: 29, flipper: 29}, suspects=[flipper]) == {flipper.to_base58(): True}
    assert reported([own, flipper], {own: 28, flipper: 29}, suspects=[flipper]) == {flipper.to_base58(): False}


def test_a_sender_out_of_step_round_after_round_is_judged_by_direction_again(tmp_path):
    """A stale update is excused for STALE_ROUNDS_EXCUSED rounds in a row (an honest peer the swarm outran downloads
    within a round or two): a liar that claims another epoch in every round, to escape the direction test, is judged
    from the next one on; a round in step starts the count again."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager
    from swarmd.swarm.upstream.robust_aggregation import STALE_ROUNDS_EXCUSED, Aggregation

    own, honest, claimer = (PeerID(f"peer-{i}".encode()) for i in range(3))
    listed = ExclusionList(tmp_path / "excluded_peers.active")
    listed.start()
    averager = _method_only(AdmittingGradientAverager, listed, own)
    averager.aggregation = Aggregation()

    def judged(claimed_epoch: int) -> bool:
        reducer = types.SimpleNamespace(
            clipped_senders=lambda: [], far_senders=lambda: [], opposed_senders=lambda: [2],
            overweight_senders=lambda ratio: [], cosine_with_result=lambda sender: -0.8,
            opposed_bound=lambda sender: -0.1, values_judged_by_sender=[100] * 3, values_sent=[100] * 3,
            outlier_values=[0] * 3, clipped_by_sender=[0] * 3, num_parts=1)
        runner = types.SimpleNamespace(tensor_part_reducer=reducer, sender_peer_ids=[own, honest, claimer])
        averager._count_outliers(runner, {own: 40, honest: 40, claimer: claimed_epoch})
        return dict(report for _, _, senders in _drained(listed, 1) for report in senders)[claimer.to_base58()]

    assert [judged(39) for _ in range(STALE_ROUNDS_EXCUSED + 2)] == [False] * STALE_ROUNDS_EXCUSED + [True, True]
    assert judged(40) is True  # in step: judged (and the count starts again)
    assert judged(39) is False


def test_a_sender_claiming_far_more_samples_than_the_round_is_reported_as_an_outlier(tmp_path):
    """The weight a sender claims above claim_rate_ratio x claims.SAMPLE_SLACK x the round's median
    (CenteredClipReducer.overweight_senders) counts as an outlier in that round, in every averager; with claims
    unchecked (claim_rate_ratio 0) it does not."""
    from hivemind.p2p import PeerID

    from swarmd.swarm.claims import SAMPLE_SLACK
    from swarmd.swarm.exclusion import ExclusionPolicy
    from swarmd.swarm.upstream.gradient_averager import AdmittingGradientAverager
    from swarmd.swarm.upstream.robust_aggregation import Aggregation
    from swarmd.swarm.upstream.state_averager import RecordsRounds

    own, honest, claimer = (PeerID(f"peer-{i}".encode()) for i in range(3))
    asked = []

    def reported(cls, policy):
        listed = ExclusionList(tmp_path / f"{cls.__name__}-{policy.claim_rate_ratio}", policy)
        listed.start()
        averager = _method_only(cls, listed, own)
        averager.aggregation = Aggregation()

        def overweight(ratio):
            asked.append(ratio)
            return [2] if ratio > 0 else []

        reducer = types.SimpleNamespace(
            clipped_senders=lambda: [], far_senders=lambda: [], opposed_senders=lambda: [],
            overweight_senders=overweight, cosine_with_result=lambda sender: 1.0, values_sent=[10] * 3,
            outlier_values=[0] * 3, clipped_by_sender=[0] * 3, num_parts=1)
        averager._count_outliers(types.SimpleNamespace(tensor_part_reducer=reducer,
                                                       sender_peer_ids=[own, honest, claimer]))
        return [senders for _, _, senders in _drained(listed, 1)]

    for cls in (AdmittingGradientAverager, RecordsRounds):
        assert reported(cls, ExclusionPolicy()) == [((honest.to_base58(), False), (claimer.to_base58(), True))], cls
        assert reported(cls, ExclusionPolicy(claim_rate_ratio=0.0)) == [
            ((honest.to_base58(), False), (claimer.to_base58(), False))], cls
    assert asked[0] == ExclusionPolicy().claim_rate_ratio * SAMPLE_SLACK


def test_far_over_the_whole_share_is_what_the_large_parts_say_not_a_tiny_one():
    """far_senders: blatant (non-finite, or 100x this peer's own part), or further than SHARE_OUTLIER_RADII radii
    over the whole share. A sender 200 radii off in a part of 3 values where the others happen to agree closely
    (the logs' tiny parts: a bias, the last layer), by as much per value as the senders differ in the part of 1000,
    is clipped there but not far; one 10 radii off in the large part is, as is a non-finite part anywhere."""
    import torch

    from swarmd.swarm.upstream.robust_aggregation import Aggregation, CenteredClipReducer, _Sent

    generator = torch.Generator().manual_seed(0)
    centre_large, centre_tiny = torch.randn(1000, generator=generator), torch.randn(3, generator=generator)

    def honest(size, centre):  # the large part's senders differ by 0.01 per value, the tiny part's by 1e-4
        return centre + (0.01 if size > 3 else 1e-4) * torch.randn(size, generator=generator)

    def far_senders(large_offsets, tiny_offsets, nan_in_tiny=()):
        async def run():  # upstream's reducer is made inside the averager's event loop
            reducer = CenteredClipReducer([torch.Size([1000]), torch.Size([3])], 5, Aggregation(), own_sender=0)
            for index, (centre, offsets) in enumerate(((centre_large, large_offsets), (centre_tiny, tiny_offsets))):
                reducer.current_part_index = index
                parts = [honest(centre.numel(), centre) + offset for offset in offsets]
                for sender in nan_in_tiny if index == 1 else ():
                    parts[sender][0] = float("nan")
                reducer.aggregate([_Sent(i, part) for i, part in enumerate(parts)], [1.0] * 5)
            return reducer

        reducer = asyncio.run(run())
        return reducer.far_senders(), [i for i, n in enumerate(reducer.clipped_by_sender) if n]

    far, clipped = far_senders([0, 0, 0, 0, 0], [0, 0, 0, 0, 0.02])
    assert far == [] and 4 in clipped  # clipped in the tiny part, not far over the share
    assert far_senders([0, 0, 0, 0, 0.01 * 10 * 31.6], [0] * 5)[0] == [4]  # ~10 radii off in the large part
    assert far_senders([0] * 5, [0] * 5, nan_in_tiny=(2,))[0] == [2]


def test_parameters_are_not_averaged_in_a_pair_with_a_suspect(tmp_path, monkeypatch):
    """A state averager (parameters) refuses a group of two whose other member is a suspect: a pair's result is
    their mean, so a quiet liar that other peers excluded would replace half of this peer's model every round. The
    round's future is cancelled (the other's wait for this peer's parts ends at once). A group of three with the
    suspect, a pair with a peer without evidence, and a gradient averager's pair average as before."""
    from hivemind.averaging.group_info import GroupInfo
    from hivemind.averaging.matchmaking import MatchmakingException
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.averager_gate import AdmitsAllowedPeers
    from swarmd.swarm.upstream.partial_rounds import ReportsPartialRounds
    from swarmd.swarm.upstream.state_averager import RecordsRounds

    own, suspect, clean = (PeerID(f"peer-{i}".encode()) for i in range(3))
    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()
    listed.publish([], suspects=[suspect.to_base58()])

    async def upstream(self, group_info, min_vector_size, **kwargs):
        return "averaged"

    monkeypatch.setattr(ReportsPartialRounds, "_aggregate_with_group", upstream)

    def averager_of(cls):
        averager = _method_only(cls, listed, own)
        averager._running_groups = {}
        return averager

    async def round_with(averager, *others):
        group = GroupInfo(b"group", (own, *others), (b"",) * (1 + len(others)))
        averager._running_groups[group.group_id] = asyncio.get_running_loop().create_future()
        try:
            return await averager._aggregate_with_group(group, 0)
        finally:
            assert averager._running_groups[group.group_id].cancelled() == (len(others) == 1 and suspect in others
                                                                            and averager.avoids_pairs_with_suspects)

    state = averager_of(RecordsRounds)
    with pytest.raises(MatchmakingException, match="group of two with suspect"):
        asyncio.run(round_with(state, suspect))
    assert asyncio.run(round_with(state, suspect, clean)) == "averaged"
    assert asyncio.run(round_with(state, clean)) == "averaged"
    assert asyncio.run(round_with(averager_of(AdmitsAllowedPeers), suspect)) == "averaged"


def test_in_a_pair_the_reducer_judges_the_other_sender_by_its_own_part():
    """Two senders: the result is their mean either way (robust_aggregation.py), but the reducer that is one of them
    counts the other as an outlier when it is more than PAIR_OUTLIER_RATIO x its own part's norm away."""
    import torch

    from swarmd.swarm.upstream.robust_aggregation import Aggregation, CenteredClipReducer, _Sent

    generator = torch.Generator().manual_seed(0)
    own = torch.randn(1000, generator=generator)
    honest = own + torch.randn(1000, generator=generator)  # as far from it as its own norm: an honest partner

    def clipped(other, own_sender):
        async def run():  # upstream's reducer is made inside the averager's event loop
            reducer = CenteredClipReducer([torch.Size([1000])], 2, Aggregation(), own_sender=own_sender)
            return reducer, reducer.aggregate([_Sent(0, own), _Sent(1, other)], [1.0, 1.0])

        reducer, result = asyncio.run(run())
        assert torch.allclose(result, (own + other) / 2)
        return reducer.clipped_by_sender

    assert clipped(-1000 * own, own_sender=0) == [0, 1]
    assert clipped(honest, own_sender=0) == [0, 0]
    assert clipped(-1000 * own, own_sender=None) == [0, 0]  # a client reduces: neither part is its own


def test_a_blatant_part_is_non_finite_or_100x_this_peers_own_whatever_the_group_size():
    """What a state round counts against a sender (swarm/upstream/state_averager.py): a part that is non-finite, or
    further from this peer's own part than PAIR_OUTLIER_RATIO x its norm; a sender merely clipped (lagging, or a
    sign flip at honest scale) is not blatant, and a client (no own part) finds only non-finite parts blatant."""
    import torch

    from swarmd.swarm.upstream.robust_aggregation import Aggregation, CenteredClipReducer, _Sent

    generator = torch.Generator().manual_seed(0)
    own = torch.randn(1000, generator=generator)
    honest = [own + 0.1 * torch.randn(1000, generator=generator) for _ in range(2)]
    reversed_steps, exploded, broken = own - 3.0, 1000 * own, own.clone()
    broken[7] = float("nan")

    def judged(own_sender):
        async def run():  # upstream's reducer is made inside the averager's event loop
            reducer = CenteredClipReducer([torch.Size([1000])], 6, Aggregation(), own_sender=own_sender)
            parts = [own, *honest, reversed_steps, exploded, broken]
            reducer.aggregate([_Sent(i, part) for i, part in enumerate(parts)], [1.0] * 6)
            return reducer

        reducer = asyncio.run(run())
        return reducer.blatant_senders(), [i for i, n in enumerate(reducer.clipped_by_sender) if n]

    blatant, clipped = judged(own_sender=0)
    assert blatant == [4, 5] and clipped == [3, 4, 5]  # the reversed steps: clipped, not blatant
    assert judged(own_sender=None)[0] == [5]


def test_the_status_view_names_an_excluded_peer_its_evidence_and_the_time_left():
    from swarmd.status.render import excluded_line

    entry = {"peer_id": "QmLiar", "reason": "clipped", "since": T0, "until": T0 + 60, "clipped_rounds": 3,
             "rounds_seen": 4, "capped_claims": 0, "exclusions": 1}
    line = excluded_line(entry, uptime=20.0, started_at=T0)
    assert "QmLiar" in line and "clipped in 3 of 4 rounds" in line and "40 s left" in line
    claims = {**entry, "reason": "claims", "capped_claims": 3, "exclusions": 2}
    assert "claims capped in 3 epochs" in excluded_line(claims, uptime=20.0, started_at=T0)


def test_a_reducer_whose_averages_were_refused_in_three_rounds_is_excluded_and_the_report_travels():
    """`returned` evidence (robust_aggregation.py RETURN_RATIO): each round in which this peer refused what a
    reducer returned; three within the window exclude it, older ones age out; the report comes through the queue."""
    table = ExclusionTable(ExclusionPolicy(rounds=3, window=600.0))
    assert table.observe_returned("liar", T0) is None
    assert table.observe_returned("liar", T0 + 700) is None  # the first aged out: one in the window
    assert table.observe_returned("liar", T0 + 701) is None
    made = table.observe_returned("liar", T0 + 702)
    assert made is not None and made.reason == "returned" and made.returned_rounds == 3
    assert table.totals == {"clipped": 0, "returned": 1, "claims": 0, "state": 0}

    table = ExclusionTable(ExclusionPolicy(rounds=1))
    made = feed(table, [("returned", T0, ("liar", "other")), ("returned", "bad")])
    assert sorted(e.peer_id for e in made) == ["liar", "other"]


def test_a_peer_with_any_evidence_in_the_window_is_a_suspect_until_excluded_or_aged_out():
    table = ExclusionTable(ExclusionPolicy(rounds=3, window=600.0))
    clipped_rounds(table, "honest", 5, clipped=False)
    table.observe_round("odd", True, T0)
    table.observe_claim("boaster", 4, T0)
    assert table.suspects(T0 + 1) == ("boaster", "odd")
    clipped_rounds(table, "odd", 2, start=T0 + 1)  # the third clipped round excludes it: excluded, not a suspect
    assert table.is_excluded("odd", T0 + 4) and table.suspects(T0 + 4) == ("boaster",)
    assert table.suspects(T0 + 601) == ()  # the claim is older than the window


def test_the_status_shows_each_suspect_with_its_evidence():
    from swarmd.status.render import suspected_line

    table = ExclusionTable(ExclusionPolicy(rounds=3, window=600.0))
    clipped_rounds(table, "odd", 11, clipped=False)
    table.observe_round("odd", True, T0 + 20)
    table.observe_claim("boaster", 4, T0)
    table.observe_claim("boaster", 4, T0 + 1)  # one epoch, claimed twice
    odd, boaster = sorted(table.suspected_peers(T0 + 30), key=lambda p: p.peer_id, reverse=True)
    assert (odd.peer_id, odd.clipped_rounds, odd.rounds_seen, odd.capped_claims) == ("odd", 1, 12, 0)
    assert (boaster.peer_id, boaster.capped_claims, boaster.rounds_seen) == ("boaster", 1, 0)
    line = suspected_line(dataclasses.asdict(odd))
    assert "clipped in 1 of 12 rounds" in line and "asked last for the state" in line
    assert "claims capped in 1 epochs" in suspected_line(dataclasses.asdict(boaster))
    exclusions = Exclusions(ExclusionPolicy(), clock=lambda: T0 + 30)
    exclusions.table = table
    assert [p.peer_id for p in exclusions.snapshot_fields()["suspected_peers"]] == ["boaster", "odd"]


def test_suspects_reach_every_process_are_not_refused_and_are_asked_last_for_the_state(tmp_path):
    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream.state_stream import donor_order

    listed = ExclusionList(tmp_path / EXCLUDED_FILE)
    listed.start()
    newest, honest, other = (PeerID(f"peer-{i}".encode()) for i in range(3))
    listed.publish(["excluded-one"], suspects=[newest.to_base58()])
    reader = ExclusionList(tmp_path / EXCLUDED_FILE)  # what an averager's process reads
    assert reader.excludes("excluded-one") and not reader.excludes(newest.to_base58())
    assert reader.suspected(newest.to_base58()) and not reader.suspected("excluded-one")
    assert reader.admit(newest.to_base58(), "state_source")  # a suspect is not refused
    offers = {newest: 9.0, honest: 7.0, other: 8.0}
    assert donor_order(offers, reader) == [other, honest, newest]  # the newest offer is the suspect's: asked last
    assert donor_order(offers) == [newest, other, honest]  # exclusions off: upstream's order, newest first
    listed.publish(["excluded-one"])
    assert not reader.suspected(newest.to_base58())


def test_a_donor_of_three_refused_states_is_excluded_one_makes_it_a_suspect_and_the_report_travels():
    """`state` evidence (swarmd/worker/download_judge.py): each state this peer refused as far worse on its own data
    counts once against each of its donors; one makes a suspect (asked last for the state), three within the window
    exclude, older ones age out; the report comes through the queue; the status names it."""
    from swarmd.status.render import excluded_line, suspected_line

    table = ExclusionTable(ExclusionPolicy(rounds=3, window=600.0))
    assert table.observe_state("liar", T0) is None
    (suspect,) = table.suspected_peers(T0 + 1)
    assert suspect.refused_states == 1 and "1 states it served refused" in suspected_line(dataclasses.asdict(suspect))
    assert table.observe_state("liar", T0 + 700) is None  # the first aged out: one in the window
    assert table.observe_state("liar", T0 + 701) is None
    made = table.observe_state("liar", T0 + 702)
    assert made is not None and made.reason == "state" and made.refused_states == 3
    assert table.totals == {"clipped": 0, "returned": 0, "claims": 0, "state": 1}
    line = excluded_line(dataclasses.asdict(made), uptime=702.0, started_at=T0)
    assert "3 states it served refused" in line

    table = ExclusionTable(ExclusionPolicy(rounds=1))
    made = feed(table, [("state", T0, ("liar", "other")), ("state", "bad")])
    assert sorted(e.peer_id for e in made) == ["liar", "other"]
