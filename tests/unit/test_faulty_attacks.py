"""The attack benchmark's gradient attacks (benchmarks/attacks.py), as the test-only faulty task makes them: each
keeps the loss the peer reports honest and sends the attack's gradient instead."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "swarmd-test-tasks"))

from swarmd_test_tasks.faulty import FaultyConfig, FaultyTask  # noqa: E402

from swarmd.tasks.base import TaskContext  # noqa: E402


def _task(tmp_path, **settings) -> FaultyTask:
    context = TaskContext(state_dir=tmp_path, device=torch.device("cpu"), precision="fp32", batch_size=16, seed=0)
    task = FaultyTask(FaultyConfig(**settings), context)
    task.prepare()
    return task


def _step(task, model, batch):
    """(the loss the task reports, the gradient it leaves) of one step."""
    model.zero_grad()
    output = task.training_step(model, batch)
    output.loss.backward()
    return float(output.loss), [p.grad.clone() for p in model.parameters()]


def _norm(tensors) -> float:
    return float(torch.linalg.vector_norm(torch.stack([t.norm() for t in tensors])))


@pytest.fixture
def setup(tmp_path):
    torch.manual_seed(0)
    honest = _task(tmp_path)
    model = honest.build_model()
    batch = next(iter(honest.train_batches(seed=1)))
    return tmp_path, honest, model, batch


def test_noise_has_the_honest_norm_and_nothing_of_its_direction(setup):
    tmp_path, honest, model, batch = setup
    loss, gradient = _step(honest, model, batch)
    noisy_loss, noise = _step(_task(tmp_path, gradient_attack="noise"), model, batch)
    assert noisy_loss == pytest.approx(loss)  # its reported loss stays honest
    assert _norm(noise) == pytest.approx(_norm(gradient), rel=1e-4)
    cosine = sum(float((g * n).sum()) for g, n in zip(gradient, noise)) / (_norm(gradient) * _norm(noise))
    assert abs(cosine) < 0.3


def test_every_shifting_attacker_shifts_the_same_way_by_its_norm(setup):
    tmp_path, honest, model, batch = setup
    _, gradient = _step(honest, model, batch)
    shifts = []
    for _ in range(2):  # two attackers: two task instances, one shared direction
        _, shifted = _step(_task(tmp_path, gradient_attack="shift", shift_scale=0.5), model, batch)
        shifts.append([s - g for s, g in zip(shifted, gradient)])
    assert _norm(shifts[0]) == pytest.approx(0.5 * _norm(gradient), rel=1e-4)
    assert all(torch.allclose(a, b) for a, b in zip(*shifts))


def test_a_stale_replay_sends_the_gradient_of_the_parameters_steps_ago(setup):
    tmp_path, honest, model, batch = setup
    stale = _task(tmp_path, gradient_attack="stale", stale_steps=2)
    first = [p.detach().clone() for p in model.parameters()]
    _, at_first = _step(honest, model, batch)
    for _ in range(2):  # the honest gradient until it has parameters two steps old
        _, sent = _step(stale, model, batch)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1)  # the model moves on
    _, replayed = _step(stale, model, batch)
    assert all(torch.allclose(r, g, atol=1e-6) for r, g in zip(replayed, at_first))
    _, now = _step(honest, model, batch)
    assert not all(torch.allclose(r, g, atol=1e-6) for r, g in zip(replayed, now))
    assert all(torch.allclose(p, f + 0.2) for p, f in zip(model.parameters(), first))
