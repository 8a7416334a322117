"""A sync gradient round that returned only part of the average (swarm/upstream/partial_rounds.py) is not a success:
the peer steps on the average where it came and its own gradient elsewhere (its own everywhere where that mix is
implausible, or with `swarm.step_on_partial_average: false`), and the group averages its state at the epoch's end, so
its members hold one model again. And a round that failed falls back to the gradient this peer contributed, not to
the zeros that hivemind's fallback reloads from accumulators its round had already reset.

One in-process hivemind peer (DHT + SwarmOptimizer); the round's result is given by hand, as the averager's
process would return it, after the gradient averager did what GradientAverager.step does at a round's start.
"""

import time
from concurrent.futures import Future

import pytest
import torch

from swarmd.config.schema import SwarmdConfig
from swarmd.swarm.upstream.partial_rounds import GatheredRound
from probe_task import ProbeTask, make_probe

BATCH = 8


class _Probe(ProbeTask):
    name = "partial-probe"


def _optimizer(dht, tmp_path, run_id: str, **swarm):
    from swarmd.swarm.averaging_log import AveragingLog
    from swarmd.swarm.strategies import build_swarm_optimizer

    config = SwarmdConfig.model_validate({
        "run_id": run_id,
        "swarm": {"target_batch_size": 100 * BATCH, "matchmaking_time": 1.0, "average_state_every": 50, **swarm},
        "training": {"batch_size": BATCH},
    })
    task = make_probe(_Probe, tmp_path, BATCH)
    model = task.build_model()
    return model, build_swarm_optimizer(dht=dht, config=config, model=model, task=task, averaging_log=AveragingLog())


def _one_step_then_a_round_starts(model, optimizer, shift: float = 100.0) -> list[torch.Tensor]:
    """A local step; then what GradientAverager.step does before its all-reduce: the accumulators go into the
    averager's buffers and are reset. The all-reduce then leaves something else in the buffers (each value moved by
    `shift`). Returns the gradient this peer contributed."""
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(BATCH, 16, generator=generator), torch.randn(BATCH, 1, generator=generator)
    torch.nn.functional.mse_loss(model(x), y).backward()
    own = [p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"]]  # buffers' order
    optimizer.step(batch_size=BATCH)
    averager = optimizer.grad_averager
    averager.load_accumulators_into_averager_()
    averager.reset_accumulated_grads_()
    with torch.no_grad(), averager.get_tensors() as buffers:
        for buffer in buffers:
            buffer.add_(shift)  # the average in part, or whatever a failed round left
    return own


def _state_round(result) -> Future:
    """A finished state round's control, as _record_state_round reads it."""
    control = Future()
    control.scheduled_time = time.time()
    control.set_result(result)
    return control


def _gradients_used(optimizer) -> list[torch.Tensor]:
    with optimizer.grad_averager.get_tensors() as buffers:  # offloaded: the optimizer's own .grad
        return [buffer.detach().clone() for buffer in buffers]


def _partial_round(optimizer, missing: float = 0.25) -> None:
    control = Future()
    control.set_result(GatheredRound({"me": None, "another-peer": None}, missing))
    optimizer._average_gradients_and_load_into_optimizer(control)


@pytest.mark.parametrize("guard", [10.0, 0.0])
def test_a_partial_gradient_round_steps_on_what_came_and_resyncs_the_group(dht, tmp_path, guard):
    model, optimizer = _optimizer(dht, tmp_path, f"partial-{guard:g}", guard_gradient_norm_ratio=guard)
    try:
        own = _one_step_then_a_round_starts(model, optimizer, shift=0.01)
        with optimizer.grad_averager.get_tensors() as buffers:
            mix = [buffer.detach().clone() for buffer in buffers]  # the average where it came, own values elsewhere
        assert optimizer.average_state_every == 50
        _partial_round(optimizer)

        last = optimizer.averaging_log.last("gradients")
        assert (last.outcome, last.group_size) == ("partial", 1), last
        assert "25.0% of the average did not arrive" in last.error
        for used, came, mine in zip(_gradients_used(optimizer), mix, own):
            torch.testing.assert_close(used, came)
            assert not torch.allclose(used, mine)
        # hivemind averages state at an epoch's end when next_epoch % average_state_every == 0: the next one does
        assert optimizer.state_averager.resync_requested and optimizer.average_state_every == 1

        # the state round that follows serves the request, whatever its outcome
        optimizer.state_averager._record_state_round(_state_round({"me": 1, "another-peer": 1}), created=time.time())
        assert not optimizer.state_averager.resync_requested and optimizer.average_state_every == 50
        assert optimizer.averaging_log.last("state").outcome == "success"
    finally:
        optimizer.shutdown()


@pytest.mark.parametrize("setting, shift", [(True, 100.0), (False, 0.01)])
def test_a_partial_round_steps_on_the_own_gradient_where_the_mix_is_implausible_or_the_setting_is_off(
    dht, tmp_path, setting, shift
):
    # +100 on every value is far above this peer's own gradient's norm: the guard (10x) refuses such a mix
    model, optimizer = _optimizer(dht, tmp_path, f"partial-own-{setting}", guard_gradient_norm_ratio=10.0,
                                  step_on_partial_average=setting)
    try:
        own = _one_step_then_a_round_starts(model, optimizer, shift=shift)
        _partial_round(optimizer)
        assert optimizer.averaging_log.last("gradients").outcome == "partial"
        for used, mine in zip(_gradients_used(optimizer), own):
            torch.testing.assert_close(used, mine)
        assert optimizer.state_averager.resync_requested
    finally:
        optimizer.shutdown()


def test_a_partial_state_round_is_partial_and_asks_for_another(dht, tmp_path):
    _, optimizer = _optimizer(dht, tmp_path, "partial-state")
    try:
        partial = _state_round(GatheredRound({"me": 1, "another-peer": 1}, 0.5))
        optimizer.state_averager._record_state_round(partial, created=time.time())
        last = optimizer.averaging_log.last("state")
        assert (last.outcome, last.error) == ("partial", "50.0% of the average did not arrive")
        assert optimizer.state_averager.rounds_with_others == 0  # not a round that evened anyone out
        assert optimizer.average_state_every == 1
    finally:
        optimizer.shutdown()


def test_a_failed_gradient_round_steps_on_the_own_gradient_not_on_zeros(dht, tmp_path):
    model, optimizer = _optimizer(dht, tmp_path, "failed-round")
    try:
        own = _one_step_then_a_round_starts(model, optimizer)
        assert any(float(g.abs().max()) > 0 for g in own)
        control = Future()
        control.set_exception(TimeoutError("no group"))
        optimizer._average_gradients_and_load_into_optimizer(control)
        assert optimizer.averaging_log.last("gradients").outcome == "failed"
        for used, mine in zip(_gradients_used(optimizer), own):
            torch.testing.assert_close(used, mine)
    finally:
        optimizer.shutdown()
