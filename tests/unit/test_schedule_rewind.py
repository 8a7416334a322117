"""swarm/schedule_rewind.py: a learning rate schedule set back to an earlier epoch, whatever its kind."""

import logging

import pytest
import torch

from swarmd.swarm.schedule_rewind import schedule_at, schedule_built_again, scheduler_set_back

FACTORIES = {  # each kind's rate at epoch 4 from a base rate of 0.1
    "lambda": (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1 + epoch)), 0.1 / 5),
    "step": (lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5), 0.1 * 0.5),
    "exponential": (lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9), 0.1 * 0.9 ** 4),
    "cosine": (lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20), None),
}


def _stepped(factory, epochs: int):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    schedule = factory(optimizer)
    for _ in range(epochs):
        optimizer.step()
        schedule.step()
    return optimizer, schedule


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_a_schedule_set_back_gives_the_rate_it_gave_at_that_epoch(kind):
    factory, expected = FACTORIES[kind]
    _, at_4 = _stepped(factory, 4)
    optimizer, schedule = _stepped(factory, 10)
    back = scheduler_set_back(schedule, factory, 4)
    assert back is not schedule and back.optimizer is optimizer and back.last_epoch == 4
    assert back.get_last_lr() == pytest.approx(at_4.get_last_lr())
    assert optimizer.param_groups[0]["lr"] == pytest.approx(at_4.get_last_lr()[0])
    if expected is not None:
        assert at_4.get_last_lr() == pytest.approx([expected])
    # and it goes on from there as the schedule did the first time
    optimizer.step()
    back.step()
    _, at_5 = _stepped(factory, 5)
    assert back.get_last_lr() == pytest.approx(at_5.get_last_lr())


def test_a_chainable_schedule_built_again_starts_from_the_initial_rate_not_the_current_one():
    factory = FACTORIES["step"][0]
    optimizer, _ = _stepped(factory, 10)  # the group's rate is now 0.1 * 0.5 ** 3
    plain = factory(optimizer)  # torch starts a chainable form from the group's current rate...
    assert plain.get_last_lr() == pytest.approx([0.1 * 0.5 ** 3])
    again = schedule_built_again(factory, optimizer)  # ...the helper from the initial one
    assert again.get_last_lr() == pytest.approx([0.1])


def test_a_schedule_not_past_the_epoch_or_without_a_factory_stays(caplog):
    factory = FACTORIES["step"][0]
    _, schedule = _stepped(factory, 3)
    assert scheduler_set_back(schedule, factory, 3) is schedule
    assert scheduler_set_back(schedule, factory, 7) is schedule
    assert scheduler_set_back(None, factory, 0) is None
    with caplog.at_level(logging.WARNING, logger="swarmd.swarm.schedule_rewind"):
        assert scheduler_set_back(schedule, None, 1) is schedule
    assert schedule.last_epoch == 3 and "cannot be set back to epoch 1" in caplog.text


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")  # torch: a schedule stepped before its optimizer
def test_a_schedule_at_an_epoch_is_built_where_there_is_none_and_stepped_forward_where_it_is_behind():
    """DiLoCo's inner schedule (diloco_state.py): built at the first inner step, stepped forward as it goes."""
    factory = FACTORIES["step"][0]
    _, at_7 = _stepped(factory, 7)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    built = schedule_at(None, factory, optimizer, 4)
    assert built.last_epoch == 4
    assert schedule_at(built, factory, optimizer, 7) is built and built.get_last_lr() == pytest.approx(at_7.get_last_lr())
    assert schedule_at(None, lambda opt: None, optimizer, 3) is None  # a task without a schedule
