"""Every precision mode applies the same update as fp32, with and without reuse_grad_buffers.

One in-process hivemind peer (DHT + SwarmOptimizer) and the real TrainingWorker. The inner optimizer is SGD with
lr 0.5, so the global step must move the parameters by exactly -0.5 x the mean fp32 gradient of the steps that
were contributed. A bad step sits among them (NaN for fp32/bf16, an fp16 overflow for fp16) and must be dropped:
on its own without reuse_grad_buffers, together with the epoch's earlier steps with it (they share .grad).
"""

import copy

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from probe_task import ProbeTask, make_probe

LR = 0.5
BATCH = 8
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2, "fp16": 1e-2}  # relative error of the update against fp32's


class _Linear(ProbeTask):
    name = "precision-probe"
    lr = LR


def _batch(seed: int, scale: float = 0.1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, 16, generator=generator) * scale, torch.randn(BATCH, 1, generator=generator) * scale


@pytest.mark.parametrize(
    "precision,reuse,dpu",
    [
        ("fp32", False, False), ("fp32", True, False), ("bf16", False, False), ("bf16", True, False),
        ("fp16", False, False), ("fp16", True, False),
        ("fp16", False, True), ("fp16", True, True),  # with delayed parameter updates, as the ALBERT-large config
    ],
)
def test_global_step_applies_the_mean_unscaled_gradient(dht, tmp_path, precision, reuse, dpu):
    config = SwarmdConfig.model_validate(
        {
            "run_id": f"precision-{precision}-{reuse}-{dpu}",
            "swarm": {
                "target_batch_size": 2 * BATCH,
                "reuse_grad_buffers": reuse,
                "matchmaking_time": 1.0,
                "delay_grad_averaging": dpu,
                "delay_optimizer_step": dpu,
            },
            "training": {"precision": precision, "batch_size": BATCH},
        }
    )
    model, start, optimizer, worker = _worker(dht, tmp_path, config)
    try:
        a, b, c = _batch(1), _batch(2), _batch(3)
        # fp16: large inputs overflow the scaled fp16 gradients while the loss itself stays finite
        bad = _batch(4, scale=1e3) if precision == "fp16" else (torch.full((BATCH, 16), float("nan")), b[1])
        fed = []
        for batch in (a, bad, b, c, _batch(5), _batch(6)):
            worker._step(iter([batch]))
            fed.append(batch)
            if optimizer.local_epoch == 1:
                break
        assert optimizer.local_epoch == 1, f"no global step after {len(fed)} local steps"
        optimizer.state_averager.step(wait_for_delayed_updates=True)  # DPU: the step ran in the background

        # Without reuse only the bad step is lost; with reuse the step before it goes too (same .grad buffers).
        contributed = [b, c] if reuse else [a, b]
        assert len(fed) == (4 if reuse else 3)
        expected = _expected_update(start, contributed)
        actual = [p.detach() - p0.detach() for p, p0 in zip(model.parameters(), start.parameters())]
        error = _relative_error(actual, expected)
        assert error < TOLERANCE[precision], f"{precision}, reuse={reuse}: update off by {error:.3g} (relative)"
        _assert_the_bad_step_was_dropped(precision, worker)
    finally:
        optimizer.shutdown()


def _worker(dht, tmp_path, config):
    """(model, a copy of its start, the swarm optimizer, the real TrainingWorker) for `config` on one in-process peer."""
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer
    from swarmd.worker.stats import WorkerStats
    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    precision = config.training.precision
    task = make_probe(_Linear, tmp_path, BATCH, precision)
    model = task.build_model()
    start = copy.deepcopy(model)
    optimizer = build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())
    worker = TrainingWorker(
        task=task, model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config),
        stats=WorkerStats(), averaging_log=optimizer.averaging_log, device=torch.device("cpu"), data_seed=0,
    )
    return model, start, optimizer, worker


def _assert_the_bad_step_was_dropped(precision: str, worker) -> None:
    if precision == "fp16":
        assert worker.precision.loss_scale() < 65536.0  # the overflow lowered the scale
    else:
        assert worker.stats.nonfinite_steps_total == 1


def _expected_update(model, batches):
    grads = None
    for x, y in batches:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        step = [p.grad.detach().clone() for p in model.parameters()]
        grads = step if grads is None else [g + s for g, s in zip(grads, step)]
    return [-LR * g / len(batches) for g in grads]


def _relative_error(actual, expected):
    diff = torch.cat([(a - e).flatten() for a, e in zip(actual, expected)]).norm()
    return float(diff / torch.cat([e.flatten() for e in expected]).norm())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_diloco_drops_the_bad_inner_step_and_its_outer_step_lands_on_the_inner_result(dht, tmp_path, precision):
    """strategy diloco through the real TrainingWorker: the bad step is dropped (fp16 overflow or NaN), the inner
    SGD steps on the two good batches in turn, and with outer lr 1 and no momentum the lone outer step moves the
    outer parameters exactly onto the inner result (the pseudo-gradient is outer minus local, fp32 on the host)."""
    config = SwarmdConfig.model_validate(
        {
            "run_id": f"precision-diloco-{precision}",
            "swarm": {
                "strategy": "diloco",
                "matchmaking_time": 1.0,
                "diloco": {"inner_steps": 2, "outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False,
                           "max_straggler_wait": 0.0},
            },
            "training": {"precision": precision, "batch_size": BATCH},
        }
    )
    model, start, optimizer, worker = _worker(dht, tmp_path, config)
    try:
        a, b = _batch(1), _batch(2)
        bad = _batch(4, scale=1e3) if precision == "fp16" else (torch.full((BATCH, 16), float("nan")), b[1])
        for batch in (a, bad, b):
            worker._step(iter([batch]))
        assert optimizer.local_epoch == 1, "no outer step after two good inner steps"
        assert optimizer.averaging_log.last("outer").outcome == "local"  # alone: its own pseudo-gradient

        reference = copy.deepcopy(start)
        sgd = torch.optim.SGD(reference.parameters(), lr=LR)
        for x, y in (a, b):
            sgd.zero_grad()
            torch.nn.functional.mse_loss(reference(x), y).backward()
            sgd.step()
        expected = [p.detach() - p0.detach() for p, p0 in zip(reference.parameters(), start.parameters())]
        actual = [p.detach() - p0.detach() for p, p0 in zip(model.parameters(), start.parameters())]
        error = _relative_error(actual, expected)
        assert error < TOLERANCE[precision], f"diloco {precision}: update off by {error:.3g} (relative)"
        outer = [p.detach() for p in optimizer._outer_parameters()]
        main = [p.detach() for p in optimizer.state_averager.main_parameters]
        assert all(torch.equal(o, m) for o, m in zip(outer, main))  # the model took the outer parameters
        _assert_the_bad_step_was_dropped(precision, worker)
    finally:
        optimizer.shutdown()
