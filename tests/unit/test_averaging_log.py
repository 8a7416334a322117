import pytest

from swarmd.swarm.averaging_log import AveragingLog


def test_counts_last_and_new_rounds():
    log = AveragingLog(history=3)
    log.record("gradients", "success", group_size=2, duration=0.5, epoch=1)
    log.record("state", "failed", group_size=1, duration=1.0, epoch=1, error="TimeoutError()")
    for epoch in range(2, 5):
        log.record("gradients", "skipped", group_size=1, duration=0.0, epoch=epoch)
    assert log.counts()[("gradients", "success")] == 1
    assert log.counts()[("gradients", "skipped")] == 3
    assert log.counts()[("state", "failed")] == 1
    assert log.last().epoch == 4
    assert log.last("state").error == "TimeoutError()"
    assert len(log.summary(recent=10).recent) == 3  # bounded history
    assert [r.epoch for r in log.take_new()] == [1, 1, 2, 3, 4]  # every round once, for the event channel
    assert log.take_new() == []


def test_rejects_unknown_kinds():
    with pytest.raises(ValueError):
        AveragingLog().record("weights", "success", group_size=1, duration=0, epoch=0)


class _PeerID:
    def __init__(self, name):
        self.name = name

    def to_base58(self):
        return self.name


def test_a_rounds_timeline_from_its_control_the_group_and_the_averagers_times():
    from concurrent.futures import Future

    from swarmd.swarm.averaging_log import RoundTimeline
    from swarmd.swarm.upstream.partial_rounds import GatheredRound

    control = Future()
    control.asked_at = 100.0
    control.set_result(GatheredRound({_PeerID("QmA"): 1, _PeerID("QmB"): 1}, 0.0, grouped_at=101.5, reduced_at=102.0))
    timeline = RoundTimeline.of(control, ended_at=102.25)
    assert timeline == RoundTimeline(100.0, 101.5, 102.0, 102.25, ("QmA", "QmB"))
    assert timeline.phases() == {"matchmaking": 1.5, "all-reduce": 0.5, "applying": 0.25}

    failed = Future()
    failed.asked_at = 100.0
    failed.set_exception(TimeoutError())
    timeline = RoundTimeline.of(failed, ended_at=115.0)  # no group formed: only the time it asked is known
    assert (timeline.grouped_at, timeline.peers, timeline.phases()) == (None, (), {})
    assert RoundTimeline.of(None) is None


def test_timeline_phases_skip_what_is_missing_or_not_a_number():
    from swarmd.swarm.averaging_log import timeline_phases

    assert timeline_phases(1.0, None, 3.0, 3.5) == {"applying": 0.5}
    assert timeline_phases("<b>", [], {}, 2.0) == {}
    assert timeline_phases(5.0, 4.0, 4.5, 4.5) == {"matchmaking": 0.0, "all-reduce": 0.5, "applying": 0.0}


def test_the_status_table_prints_where_a_rounds_time_went():
    from swarmd.status.render import round_phases

    item = {"timeline": {"asked_at": 100.0, "grouped_at": 101.0, "reduced_at": 101.25, "ended_at": 101.5}}
    assert round_phases(item) == "match 1.00 s · reduce 0.25 s · apply 0.25 s"
    assert round_phases({"timeline": None}) == round_phases({}) == round_phases({"timeline": "x"}) == ""
    counted = {"timeline": {**item["timeline"], "sent_bytes": 2_500_000, "received_bytes": 812}}
    assert round_phases(counted) == "match 1.00 s · reduce 0.25 s · apply 0.25 s · sent 2.50 MB · received 812 B"
    garbage = {"timeline": {**item["timeline"], "sent_bytes": "<b>", "received_bytes": True}}
    assert round_phases(garbage) == "match 1.00 s · reduce 0.25 s · apply 0.25 s"
