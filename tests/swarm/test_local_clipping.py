"""swarm.clip_local_grad_norm clips each local step's gradient before it is accumulated (hivemind's ALBERT
example clips there, through HF Trainer's max_grad_norm), so one large step cannot dominate the epoch's mean.

One in-process hivemind peer (DHT + SwarmOptimizer), SGD with lr 1, two local steps per global epoch: the global
step must move the parameters by minus the mean of the two CLIPPED step gradients.
"""

import copy

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from swarmd.errors import ConfigError
from probe_task import ProbeTask, make_probe

BATCH, CLIP = 8, 0.5


class _Linear(ProbeTask):
    name = "clip-probe"
    lr = 1.0
    widths = (16, 1)  # one Linear layer


def _gradient(model, scale: float, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(BATCH, 16, generator=generator) * scale, torch.randn(BATCH, 1, generator=generator) * scale
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _clipped(grads, max_norm):
    norm = torch.cat([g.flatten() for g in grads]).norm()
    return [g * min(1.0, max_norm / float(norm)) for g in grads]


@pytest.mark.parametrize("clip", [CLIP, None])
def test_each_local_step_is_clipped_before_the_epochs_mean(dht, tmp_path, clip):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = SwarmdConfig.model_validate({
        "run_id": f"clip-{clip is not None}",
        "swarm": {"target_batch_size": 2 * BATCH, "matchmaking_time": 1.0, "clip_local_grad_norm": clip},
        "training": {"batch_size": BATCH},
    })
    task = make_probe(_Linear, tmp_path, BATCH)
    model = task.build_model()
    start = copy.deepcopy(model)
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())
    try:
        steps = []
        for scale, seed in ((30.0, 1), (0.2, 2)):  # one huge step, one small one
            steps.append(_gradient(model, scale, seed))
            optimizer.step(batch_size=BATCH)
        assert optimizer.local_epoch == 1
        if clip is not None:
            assert float(torch.cat([g.flatten() for g in steps[0]]).norm()) > 10 * CLIP  # the clip had work to do
            steps = [_clipped(grads, clip) for grads in steps]
        expected = [-(a + b) / 2 for a, b in zip(*steps)]
        actual = [p.detach() - p0.detach() for p, p0 in zip(model.parameters(), start.parameters())]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)
    finally:
        optimizer.shutdown()


def test_local_clipping_refuses_accumulating_grad_buffers():
    from swarmd.config import load_config

    with pytest.raises(ConfigError, match="swarm.*clip_local_grad_norm needs reuse_grad_buffers: false"):
        load_config(None, environ={}, assignments=["swarm.clip_local_grad_norm=1.0", "swarm.reuse_grad_buffers=true"])
