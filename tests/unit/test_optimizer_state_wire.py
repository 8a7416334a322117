"""The inner optimizer's state between DiLoCo peers (swarm/optimizer_state_wire.py): a joiner's optimizer that has
not stepped takes the donor's state exactly, and a sender cannot set hyperparameters or misplace a tensor."""

import copy

import pytest
import torch
from timm.optim import Lamb

from swarmd.swarm.optimizer_state_wire import describe_optimizer_state, load_described_state


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))


def _lamb(model, lr=0.01):
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return Lamb([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr, weight_decay=0.01,
                eps=1e-6, max_grad_norm=1.0)


def _step(model, optimizer, seed):
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=generator), torch.randn(8, 1, generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def _donor_and_joiner(make=_lamb):
    donor_model = _model()
    donor = make(donor_model)
    for seed in range(7):
        _step(donor_model, donor, seed)
    joiner_model = copy.deepcopy(donor_model)  # the parameters came with the outer state
    return donor_model, donor, joiner_model, make(joiner_model)


def test_a_joiner_whose_lamb_never_stepped_continues_exactly_as_the_donor():
    donor_model, donor, joiner_model, joiner = _donor_and_joiner()
    assert "step" not in joiner.param_groups[0]  # what made hivemind's packing shift every later value
    description, tensors = describe_optimizer_state(donor)
    load_described_state(joiner, description, tensors)
    assert float(joiner.param_groups[0]["step"]) == 7
    for seed in (7, 8):
        _step(donor_model, donor, seed)
        _step(joiner_model, joiner, seed)
    for a, b in zip(donor_model.parameters(), joiner_model.parameters()):
        assert torch.equal(a, b)


def test_hivemind_s_packing_puts_the_donors_values_on_the_wrong_keys():
    """The reason for the wire module: the negative control, so the test above cannot pass by accident."""
    from hivemind.optim.state_averager import dump_optimizer_state, load_optimizer_state

    _, donor, _, joiner = _donor_and_joiner()
    load_optimizer_state(joiner, *dump_optimizer_state(donor))
    assert joiner.param_groups[0]["trust_clip"] is not False  # it got the donor's step count (or another value)


def test_adamw_s_per_parameter_steps_travel_too():
    make = lambda model: torch.optim.AdamW(model.parameters(), lr=0.01)  # noqa: E731
    donor_model, donor, joiner_model, joiner = _donor_and_joiner(make)
    load_described_state(joiner, *describe_optimizer_state(donor))
    _step(donor_model, donor, 9)
    _step(joiner_model, joiner, 9)
    assert all(torch.equal(a, b) for a, b in zip(donor_model.parameters(), joiner_model.parameters()))


def test_the_senders_hyperparameters_stay_its_own():
    _, _, joiner_model, _ = _donor_and_joiner()
    liar_model = _model()
    liar = _lamb(liar_model, lr=1e6)
    liar.param_groups[0]["initial_lr"] = 1e6  # what a schedule starts from: it stays the joiner's too
    _step(liar_model, liar, 0)
    joiner = _lamb(joiner_model)
    load_described_state(joiner, *describe_optimizer_state(liar))
    assert [group["lr"] for group in joiner.param_groups] == [0.01, 0.01]
    assert "initial_lr" not in joiner.param_groups[0] and float(joiner.param_groups[0]["step"]) == 1


def _lie(description, tensors, how):
    description = copy.deepcopy(description)
    tensors = list(tensors)
    if how == "a hyperparameter":
        description["groups"].append([0, "lr", 0, False])
    elif how == "a parameter out of range":
        description["state"][0][0] = 99
    elif how == "another shape":
        tensors[description["state"][0][2]] = torch.zeros(3, 3)
    elif how == "NaN":
        tensors[description["state"][0][2]] = torch.full_like(tensors[description["state"][0][2]], float("nan"))
    elif how == "a negative step":
        tensors[description["groups"][0][2]] = torch.tensor(-5.0)
    elif how == "another version":
        description["version"] = 0
    elif how == "a key that is no name":
        description["state"][0][1] = "x" * 500
    return description, tensors


@pytest.mark.parametrize("how", ["a hyperparameter", "a parameter out of range", "another shape", "NaN",
                                 "a negative step", "another version", "a key that is no name"])
def test_a_state_that_does_not_fit_is_refused_whole_with_what_is_wrong(how):
    _, donor, _, joiner = _donor_and_joiner()
    before = copy.deepcopy(joiner.state_dict())
    with pytest.raises(ValueError) as refused:
        load_described_state(joiner, *_lie(*describe_optimizer_state(donor), how))
    assert len(str(refused.value)) < 200
    after = joiner.state_dict()
    assert after["state"] == before["state"] and after["param_groups"] == before["param_groups"]
