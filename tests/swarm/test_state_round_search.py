"""A sync peer's state round that finds no group gives up two matchmaking times past its start, not after
averaging_timeout (swarm/upstream/state_averager.py RecordsRounds.group_search_limit): its next optimizer step waits
on the round, and a joiner of benchmarks/join_time.py that came to the swarm's state round late stood 17-25 s at one
epoch, then averaged its parameters of ten epochs before into the swarm's next state round.

One real peer (its DHT and averager processes) with nobody to average with: its round looks for a group that never
comes, as a late peer's does once the others' round is over."""

import time

import pytest

from swarmd.config.schema import SwarmdConfig
from daemons import wait_for
from probe_task import ProbeTask, make_probe

BATCH = 8
MATCHMAKING_TIME = 1.0
AVERAGING_TIMEOUT = 30.0


class _Probe(ProbeTask):
    name = "state-round-search-probe"


def _peer(dht, tmp_path, **swarm):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = SwarmdConfig.model_validate(
        {
            "run_id": f"state-round-search-{tmp_path.name}",
            "swarm": {"target_batch_size": 2 * BATCH, "matchmaking_time": MATCHMAKING_TIME,
                      "averaging_timeout": AVERAGING_TIMEOUT, **swarm},
            "training": {"batch_size": BATCH},
        }
    )
    task = make_probe(_Probe, tmp_path, BATCH)
    log = AveragingLog()
    return build_swarm_optimizer(dht=dht, config=config, model=task.build_model(), task=task, averaging_log=log), log


@pytest.fixture
def peer(dht, tmp_path):
    optimizer, log = _peer(dht, tmp_path)
    yield optimizer, log
    optimizer.shutdown()


def test_a_state_round_that_finds_no_group_gives_up_after_two_matchmaking_times(peer):
    optimizer, log = peer
    assert optimizer.state_averager.group_search_limit == 2 * MATCHMAKING_TIME
    began = time.monotonic()
    # what upstream's global step does at a state epoch (Optimizer._update_global_epoch), waited for
    optimizer.state_averager.step(averaging_round=True, delay_averaging=False,
                                  averaging_opts=dict(timeout=AVERAGING_TIMEOUT))
    took = time.monotonic() - began
    assert took < 4 * MATCHMAKING_TIME + 3, f"the round looked for a group for {took:.1f} s"
    wait_for(lambda: log.counts()["state", "failed"] == 1, "the failed round recorded", 10)


def test_a_prescheduled_state_round_looks_from_its_scheduled_start(peer):
    from hivemind.utils import get_dht_time

    optimizer, log = peer
    began = time.monotonic()
    # as upstream pre-schedules it (Optimizer._maybe_schedule_state_averaging): a start ahead, averaging_timeout
    control = optimizer.state_averager.schedule_step(scheduled_time=get_dht_time() + 2 * MATCHMAKING_TIME,
                                                     timeout=AVERAGING_TIMEOUT)
    control.allow_allreduce()
    with pytest.raises(Exception):
        control.result(AVERAGING_TIMEOUT + 10)
    took = time.monotonic() - began
    # not before its start plus the limit, and long before averaging_timeout
    assert 4 * MATCHMAKING_TIME - 0.5 <= took < 4 * MATCHMAKING_TIME + 3, took


@pytest.mark.parametrize("swarm", [{"use_local_updates": True, "average_state_every": 2}, {"state_round_search": 0}],
                         ids=["local-updates", "turned-off"])
def test_the_search_is_upstreams_under_local_updates_and_where_turned_off(dht, tmp_path, swarm):
    """Local updates average parameters in their state rounds, which peers whose epochs are a round apart share
    (docs/NAT.md): the search is not cut there. `swarm.state_round_search: 0` is hivemind's way, for benchmarks."""
    optimizer, _ = _peer(dht, tmp_path, **swarm)
    try:
        assert optimizer.state_averager.group_search_limit is None
    finally:
        optimizer.shutdown()
