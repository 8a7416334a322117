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
