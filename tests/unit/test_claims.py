"""Claims checked (swarmd/swarm/claims.py): other peers' samples and samples/s capped to what the swarm makes
plausible, and the tracker that applies it (swarm/upstream/progress.py) before it sums the swarm's progress."""

import math
import types

import pytest

from swarmd.swarm.claims import SAMPLE_SLACK, Claim, median_rate, plausible_claims

NOW = 1_700_000_100.0
BEGAN = NOW - 10.0  # this peer saw the current epoch begin 10 s ago


def claim(peer, rate, samples=0, epoch=5, time=NOW - 1.0, client_mode=False):
    return Claim(peer, epoch, samples, rate, time, client_mode)


def check(claims, own="own", ratio=8.0, grace=10.0):
    return plausible_claims(claims, own, rate_ratio=ratio, epoch=5, epoch_began=BEGAN, now=NOW, grace=grace)


def test_honest_peers_of_similar_speed_are_left_as_they_are():
    claims = [claim("own", 100.0, 900), claim("b", 120.0, 1100), claim("c", 80.0, 700)]
    assert check(claims) == [(c, False) for c in claims]


def test_a_peer_claiming_a_hundred_times_the_swarms_rate_is_capped_at_the_ratio():
    claims = [claim("own", 100.0, 900), claim("b", 100.0, 900), claim("liar", 10_000.0, 90_000)]
    (_, own_capped), (_, b_capped), (liar, liar_capped) = check(claims)
    assert not own_capped and not b_capped and liar_capped
    assert liar.rate == 8.0 * 100.0
    # samples: at most SAMPLE_SLACK x its capped rate x (10 s since the epoch began + 10 s grace)
    assert liar.samples == math.ceil(SAMPLE_SLACK * 800.0 * 20.0) < 90_000


def test_a_liars_samples_are_capped_even_at_an_honest_rate():
    claims = [claim("own", 100.0), claim("b", 100.0), claim("liar", 100.0, samples=1_000_000)]
    liar, capped = check(claims)[2]
    assert capped and liar.rate == 100.0 and liar.samples == math.ceil(SAMPLE_SLACK * 100.0 * 20.0)


def test_a_slow_starting_peer_is_judged_by_the_median_rate_not_its_own():
    """hivemind's rate is an average that counts the peer's start-up: low at first, while its samples are real."""
    claims = [claim("own", 100.0), claim("b", 100.0), claim("new", 0.5, samples=1500)]
    assert check(claims)[2] == (claims[2], False)


def test_this_peers_own_claim_is_never_capped():
    claims = [claim("own", 10_000.0, 10**7), claim("b", 1.0), claim("c", 1.0)]
    assert check(claims)[0] == (claims[0], False)


def test_two_peers_cannot_tell_which_one_lies():
    """Of two rates the median is the larger: nobody is capped (as robust aggregation with two senders)."""
    claims = [claim("own", 100.0), claim("fast", 5000.0)]
    assert median_rate(claims) == 5000.0
    assert not any(capped for _, capped in check(claims))


def test_a_record_dated_long_ago_is_not_extrapolated_from_then():
    """Upstream adds (now - time) x rate: a record dated at 0 would count a lifetime of samples."""
    claims = [claim("own", 100.0), claim("b", 100.0), claim("liar", 100.0, samples=10, time=0.0)]
    liar, capped = check(claims)[2]
    assert liar.time == BEGAN and not capped  # the date alone is no evidence: clocks differ


def test_records_of_other_epochs_keep_their_samples():
    claims = [claim("own", 100.0), claim("b", 100.0), claim("old", 100.0, samples=10**6, epoch=4)]
    assert check(claims)[2] == (claims[2], False)


def test_a_ratio_of_zero_checks_nothing():
    claims = [claim("own", 1.0), claim("b", 1.0), claim("liar", 1e9, 10**9)]
    assert check(claims, ratio=0.0) == [(c, False) for c in claims]


@pytest.mark.parametrize("rate", [math.inf, 1e300])
def test_an_absurd_rate_is_capped(rate):
    claims = [claim("own", 100.0), claim("b", 100.0), claim("liar", rate, 10)]
    liar, over = check(claims)[2]
    assert liar.rate == 800.0 and not over  # its samples are plausible: no evidence


def test_a_stale_solo_rate_beside_newcomers_is_capped_but_no_evidence():
    """A peer that trained alone at 2000 samples/s, two peers that just joined (rates counting their start-up):
    its rate is capped at 8x the median, its real samples of a short epoch are not, and it is not reported."""
    claims = [claim("own", 6.0, 64), claim("solo", 2000.0, 384), claim("other-new", 5.0, 64)]
    solo, over = check(claims)[1]
    assert solo.rate == 8.0 * 6.0 and solo.samples == 384 and not over


# --- the tracker ------------------------------------------------------------------------------------------------


def _tracker(own_peer_id, epoch=5, began=BEGAN):
    from swarmd.swarm.upstream.progress import ThrottledProgressTracker

    tracker = ThrottledProgressTracker.__new__(ThrottledProgressTracker)  # the method alone: no DHT, no thread
    tracker.dht = types.SimpleNamespace(peer_id=own_peer_id)
    tracker.local_progress = types.SimpleNamespace(epoch=epoch)
    tracker.max_refresh_period = 5.0
    tracker._epoch_seen = (epoch, began)
    return tracker


def _records(entries):
    from hivemind.optim.progress_tracker import LocalTrainingProgress
    from hivemind.utils import ValueWithExpiration

    return {
        f"[owner:{peer.to_base58()}]".encode(): ValueWithExpiration(
            LocalTrainingProgress(peer_id=peer.to_bytes(), epoch=5, samples_accumulated=samples,
                                  samples_per_second=rate, time=NOW - 1.0, client_mode=False).dict(), NOW + 60)
        for peer, samples, rate in entries
    }


@pytest.fixture
def excluding(tmp_path):
    from swarmd.swarm import exclusion

    listed = exclusion.ExclusionList(tmp_path / exclusion.EXCLUDED_FILE, exclusion.ExclusionPolicy())
    listed.start()
    exclusion.install(listed)
    yield listed
    exclusion.install(None)


def test_the_tracker_caps_a_liars_claims_reports_it_and_drops_excluded_peers(excluding, monkeypatch):
    import time

    from hivemind.p2p import PeerID

    from swarmd.swarm.upstream import progress

    monkeypatch.setattr(progress, "get_dht_time", lambda: NOW)
    own, honest, liar, excluded = (PeerID(f"peer-{i}".encode()) for i in range(4))
    excluding.publish([excluded.to_base58()])
    metadata = _records([(own, 500, 100.0), (honest, 500, 100.0), (liar, 10**6, 10_000.0), (excluded, 10, 100.0)])
    checked = _tracker(own)._checked_claims(metadata)
    values = {record.value["peer_id"]: record.value for record in checked.values()}
    assert set(values) == {own.to_bytes(), honest.to_bytes(), liar.to_bytes()}  # the excluded peer counts for nothing
    assert values[honest.to_bytes()]["samples_accumulated"] == 500
    assert values[liar.to_bytes()]["samples_per_second"] == 800.0
    assert values[liar.to_bytes()]["samples_accumulated"] < 10**6
    reports = []
    for _ in range(50):
        reports += excluding.drain()
        if reports:
            break
        time.sleep(0.1)
    assert [(kind, epoch, peers) for kind, _, epoch, peers in reports] == [("claims", 5, (liar.to_base58(),))]


def test_without_exclusions_installed_the_records_are_upstreams():
    from hivemind.p2p import PeerID

    own, liar = PeerID(b"peer-0"), PeerID(b"peer-1")
    metadata = _records([(own, 500, 100.0), (liar, 10**6, 10_000.0)])
    assert _tracker(own)._checked_claims(metadata) is metadata
