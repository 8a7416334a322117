"""SwarmOptimizer.parameters_version changes whenever hivemind writes the model's parameters, in every mode.

It is what rank 0 hands StepSync.lead so the other ranks of the peer receive the parameters exactly when they
changed (swarmd.ranks). One in-process hivemind peer, a tiny model: after every local step, a change of any
parameter must come with a new version (a missed one would leave the ranks stale until the next checksum), and
with plain gradient averaging the version must stay put between global steps (no broadcast every step).
"""

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from probe_task import ProbeTask, make_probe

BATCH = 8


class _Tiny(ProbeTask):
    name = "parameters-version-probe"
    widths = (4, 4, 1)


@pytest.fixture
def dht():  # one per mode, the daemon's DHT class: a mode's averagers shutting down must not reach the next mode
    from swarmd.swarm.upstream.dht_process import ToleratesExitedCallers

    node = ToleratesExitedCallers(start=True)
    yield node
    node.shutdown()


@pytest.mark.parametrize(
    "mode, swarm",
    [
        ("gradient averaging", {}),
        ("gradient averaging, reuse_grad_buffers", {"reuse_grad_buffers": True}),
        ("local updates", {"use_local_updates": True, "average_state_every": 2}),
        ("delayed optimizer step (DPU)", {"delay_grad_averaging": True, "delay_optimizer_step": True}),
    ],
)
def test_every_write_of_the_parameters_changes_the_version(dht, tmp_path, mode, swarm):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = SwarmdConfig.model_validate(
        {"run_id": f"params-version-{abs(hash(mode))}", "swarm": {"target_batch_size": 2 * BATCH, "matchmaking_time": 1.0, **swarm}}
    )
    task = make_probe(_Tiny, tmp_path, BATCH)
    model = task.build_model()
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())
    generator = torch.Generator().manual_seed(1)
    changed_steps, bumped_steps = [], []
    try:
        for step in range(8):
            before = [p.detach().clone() for p in model.parameters()]
            version = optimizer.parameters_version
            x = torch.randn(BATCH, 4, generator=generator)
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
            optimizer.step(batch_size=BATCH)
            if not config.swarm.reuse_grad_buffers:
                model.zero_grad(set_to_none=True)
            changed = any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
            if changed:
                changed_steps.append(step)
            if optimizer.parameters_version != version:
                bumped_steps.append(step)
            assert not changed or optimizer.parameters_version != version, (
                f"{mode}: step {step} changed the parameters without a new version"
            )
    finally:
        optimizer.shutdown()
    assert changed_steps, f"{mode}: nothing changed the parameters in 8 steps (4 global epochs)"
    if not swarm.get("use_local_updates") and not swarm.get("delay_optimizer_step"):
        assert bumped_steps == changed_steps, f"{mode}: a new version without a change (a needless broadcast)"
