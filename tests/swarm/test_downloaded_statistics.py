"""A joiner under local updates (or DiLoCo) checks the optimizer statistics its download brought against its own first gradient
(swarm/downloaded_statistics.py): a donor whose unclipped gradients were x 1e6 sends second moments ~1e12 times an
honest peer's, which would shrink the joiner's steps a million-fold for ~27,000 steps.

Two in-process hivemind peers on a real DHT: the donor trains alone with its loss (so its gradients) times 1e6 and
plain Adam (no clipping); the joiner downloads its state and takes one honest step."""

import time

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers
from probe_task import ProbeTask, make_probe

BATCH = 8


class _AdamProbe(ProbeTask):
    name = "downloaded-statistics-probe"

    def build_optimizer(self, param_groups):
        return torch.optim.Adam(param_groups, lr=0.01)  # unclipped: the donor's x 1e6 reaches its moments


STRATEGIES = {  # the donor's five steps stay within its first epoch (local updates) or outer round (DiLoCo)
    "local updates": {"target_batch_size": 8 * BATCH, "use_local_updates": True, "prescheduled_averaging": False,
                      "average_state_every": 100},
    "diloco": {"strategy": "diloco", "grad_compression": "none", "diloco": {"inner_steps": 8, "max_straggler_wait": 1.0}},
}


def _peer(dht, tmp_path, strategy: str, **tracker_opts):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = SwarmdConfig.model_validate({
        "run_id": f"downloaded-statistics-{tmp_path.name}",
        "swarm": {**STRATEGIES[strategy], "matchmaking_time": 1.0, "averaging_timeout": 5.0,
                  "tracker_opts": {"min_refresh_period": 0.1, "default_refresh_period": 0.2, **tracker_opts}},
        "training": {"batch_size": BATCH},
    })
    task = make_probe(_AdamProbe, tmp_path, BATCH)
    model = task.build_model()
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())
    return task, model, optimizer


def _step(peer, seed: int, loss_scale: float = 1.0) -> None:
    task, model, optimizer = peer
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randn(BATCH, 16, generator=generator), torch.randn(BATCH, 1, generator=generator)
    output = task.training_step(model, batch)
    (output.loss * loss_scale).backward()
    optimizer.step(batch_size=output.batch_size)
    model.zero_grad()


def _largest_second_moment(optimizer) -> float:
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer.state_averager.optimizer  # DiLoCo's, or hivemind's
    states = inner.state.values()
    return max(float(state["exp_avg_sq"].max()) for state in states)


def _join_a_scaled_donor(dht, tmp_path, strategy: str):
    """The donor's five steps at x 1e6, the joiner's download and its first honest step: their largest second
    moments, the joiner's after the download and after its step."""
    from hivemind.utils.crypto import RSAPrivateKey

    other_dht = ToleratesExitedCallers(initial_peers=dht.get_visible_maddrs(), start=True)
    donor = _peer(dht, tmp_path, strategy)
    joiner = None
    try:
        for seed in range(5):
            _step(donor, seed, loss_scale=1e6)
        joiner = _peer(other_dht, tmp_path, strategy, private_key=RSAPrivateKey())  # its own progress record
        deadline = time.monotonic() + 30
        while joiner[2].state_loads_total == 0:
            assert time.monotonic() < deadline, "the joiner found no donor"
            joiner[2].load_state_from_peers()
        downloaded = _largest_second_moment(joiner[2])
        _step(joiner, 100)
        return _largest_second_moment(donor[2]), downloaded, _largest_second_moment(joiner[2])
    finally:
        donor[2].shutdown()
        if joiner is not None:
            joiner[2].shutdown()
        other_dht.shutdown()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_joiner_restarts_statistics_far_above_its_own_gradient(dht, tmp_path, caplog, strategy):
    with caplog.at_level("WARNING", logger="swarmd.swarm.downloaded_statistics"):
        donors, downloaded, joiners = _join_a_scaled_donor(dht, tmp_path, strategy)
    assert downloaded == donors > 1e6, "the download did not bring the donor's statistics"
    assert joiners < 1.0, f"the joiner kept the donor's statistics ({joiners:.3g})"
    said = [r.getMessage() for r in caplog.records if r.name == "swarmd.swarm.downloaded_statistics"]
    assert len(said) == 1 and "starting them afresh" in said[0], said


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_without_the_check_the_joiner_keeps_the_donors_statistics(dht, tmp_path, monkeypatch, strategy):
    for module in ("swarmd.swarm.upstream.optimizer", "swarmd.swarm.strategies.diloco_optimizer"):
        monkeypatch.setattr(f"{module}.restart_implausible_statistics", lambda *args: None)
    donors, downloaded, joiners = _join_a_scaled_donor(dht, tmp_path, strategy)
    assert joiners > 0.99 * 0.999 * donors > 1e6  # beta2 = 0.999: a thousand steps to forget a factor of e
