"""The swarm's totals between two reads of the peer records: loss weighted by the samples each peer trained."""

import pytest

from swarmd.monitor.totals import swarm_totals


def record(peer: str, *, samples: int, rate: float, loss, ok: int = 0, failed: int = 0, auxiliary: bool = False):
    return {"peer_id": peer, "samples_total": samples, "samples_per_second": rate, "loss": loss,
            "averaging_success": ok, "averaging_failed": failed, "auxiliary": auxiliary}


def test_the_loss_is_weighted_by_the_samples_trained_since_the_last_read():
    before = {"a": record("a", samples=1000, rate=10, loss=9.0), "b": record("b", samples=500, rate=10, loss=9.0)}
    now = [record("a", samples=1300, rate=30, loss=1.0, ok=3), record("b", samples=600, rate=10, loss=2.0, ok=1, failed=1)]
    totals = swarm_totals(now, before, global_epoch=7)
    assert totals.loss == pytest.approx((300 * 1.0 + 100 * 2.0) / 400)  # not the mean of means, 1.5
    assert (totals.alive_peers, totals.trainers, totals.samples_per_second, totals.global_epoch) == (2, 2, 40, 7)
    assert (totals.rounds_succeeded, totals.rounds_failed) == (4, 1)
    assert totals.rounds_at_least == 3  # peer a reported 3 rounds: at least 3 took place, not 5


def test_one_round_of_two_peers_is_two_reports_of_at_least_one_round():
    before = {"a": record("a", samples=0, rate=10, loss=1.0), "b": record("b", samples=0, rate=10, loss=1.0)}
    now = [record("a", samples=16, rate=10, loss=1.0, ok=1), record("b", samples=16, rate=10, loss=1.0, ok=1)]
    totals = swarm_totals(now, before, global_epoch=1)
    assert (totals.rounds_succeeded, totals.rounds_at_least) == (2, 1)


def test_first_seen_peers_weigh_by_rate_and_auxiliary_peers_do_not_train():
    now = [record("a", samples=50, rate=30, loss=1.0), record("b", samples=10, rate=10, loss=3.0),
           record("aux", samples=0, rate=0, loss=None, auxiliary=True)]
    totals = swarm_totals(now, {}, global_epoch=None)
    assert totals.loss == pytest.approx((30 * 1.0 + 10 * 3.0) / 40)
    assert (totals.alive_peers, totals.trainers, totals.rounds_succeeded) == (3, 2, 0)
    assert "swarm/global_epoch" not in totals.scalars() and totals.scalars()["swarm/alive_peers"] == 3.0


def test_a_restarted_peer_counts_from_zero_and_an_idle_swarm_has_no_loss():
    before = {"a": record("a", samples=5000, rate=10, loss=1.0, ok=40)}
    restarted = swarm_totals([record("a", samples=200, rate=10, loss=2.0, ok=2)], before, global_epoch=3)
    assert restarted.loss == 2.0 and restarted.rounds_succeeded == 2
    idle = swarm_totals([record("a", samples=5000, rate=0, loss=1.0, ok=40)], before, global_epoch=3)
    assert idle.loss is None and idle.rounds_succeeded == 0
