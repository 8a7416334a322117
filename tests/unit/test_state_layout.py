"""A donor's state is compared with the receiver's own layout before anything of it is applied
(swarm/state_layout.py): hivemind's loader would broadcast one number into each parameter, load statistics of any
shape, and put statistics on the parameters the donor's indices name."""

import torch
from hivemind.optim.state_averager import dump_optimizer_state

from swarmd.swarm.state_layout import StateLayout, layout_mismatch, optimizer_layout


def adam(seed: int, steps: int = 2):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()
    return model, optimizer


def layout_of(model, optimizer, more_allowed=False) -> StateLayout:
    metadata, statistics = optimizer_layout(optimizer)
    shapes = tuple(tuple(p.shape) for p in model.parameters())
    return StateLayout(shapes + statistics, metadata, more_allowed=more_allowed)


def served(model, optimizer):
    """What hivemind's get_current_state sends: (metadata, parameters then the optimizer's statistics)."""
    optimizer_metadata, statistics = dump_optimizer_state(optimizer)
    return {"epoch": 3, "optimizer_metadata": optimizer_metadata}, [*model.parameters(), *statistics]


def test_another_peers_state_of_the_same_model_fits_and_its_values_do_not_matter():
    model, optimizer = adam(0)
    layout = layout_of(model, optimizer)
    assert layout_mismatch(layout, *served(*adam(1, steps=5))) == ""
    assert layout.shapes[:4] == tuple(tuple(p.shape) for p in model.parameters())  # the parameters first
    assert len(layout.shapes) == 4 + 4 * 3  # then step, exp_avg, exp_avg_sq of each


def test_one_number_per_parameter_is_refused_where_hivemind_would_broadcast_it():
    layout = layout_of(*adam(0))
    metadata, tensors = served(*adam(1))
    tensors[0] = torch.tensor(7.0)
    assert layout_mismatch(layout, metadata, tensors) == "tensor 0 has shape [], this peer's [4, 3]"


def test_a_statistic_of_another_shape_or_another_count_is_refused():
    layout = layout_of(*adam(0))
    metadata, tensors = served(*adam(1))
    assert layout_mismatch(layout, metadata, tensors[:-1]) == "15 tensors where this peer has 16"
    assert layout_mismatch(layout, metadata, [*tensors, torch.zeros(1)]) == "17 tensors where this peer has 16"
    assert layout_mismatch(StateLayout(layout.shapes, layout.optimizer_metadata, more_allowed=True), metadata,
                           [*tensors, torch.zeros(1)]) == ""  # DiLoCo appends its inner state
    shapes = [tuple(t.shape) for t in tensors]
    wrong = next(i for i in range(4, len(tensors)) if shapes[i] == (4, 3))
    tensors[wrong] = torch.zeros(3, 4)
    assert layout_mismatch(layout, metadata, tensors) == f"tensor {wrong} has shape [3, 4], this peer's [4, 3]"


def test_optimizer_metadata_that_moves_statistics_or_names_other_parameters_is_refused():
    layout = layout_of(*adam(0))
    metadata, tensors = served(*adam(1))
    entries = metadata["optimizer_metadata"]
    tensor_positions = [i for i, e in enumerate(entries) if e["type"] == "tensor"]
    first, second = tensor_positions[1], tensor_positions[2]
    swapped = [dict(e) for e in entries]
    swapped[first], swapped[second] = swapped[second], swapped[first]
    assert "is not this peer's tensor" in layout_mismatch(layout, dict(metadata, optimizer_metadata=swapped), tensors)
    # the param group's parameter indices: the donor's would map its statistics to other parameters
    index_positions = [i for i, e in enumerate(layout.optimizer_metadata) if "parameter" in e]
    assert [entries[i]["value"] for i in index_positions] == [0, 1, 2, 3]
    renamed = [dict(e) for e in entries]
    renamed[index_positions[0]], renamed[index_positions[1]] = dict(type="value", value=1), dict(type="value", value=0)
    assert "names parameter 1, this peer's 0" in layout_mismatch(layout, dict(metadata, optimizer_metadata=renamed),
                                                                 tensors)
    assert "of 3 entries" in layout_mismatch(layout, dict(metadata, optimizer_metadata=entries[:3]), tensors)
    assert "no entries" in layout_mismatch(layout, dict(metadata, optimizer_metadata=None), tensors)
    nested = [dict(e) for e in entries]
    value_position = next(i for i, e in enumerate(layout.optimizer_metadata) if e == {"type": "value"})
    nested[value_position] = dict(type="value", value={"lr": 1e6})
    assert "not a plain value" in layout_mismatch(layout, dict(metadata, optimizer_metadata=nested), tensors)


def test_a_download_of_parameters_only_checks_the_parameters():
    model, _ = adam(0)
    layout = StateLayout(tuple(tuple(p.shape) for p in model.parameters()))
    assert layout_mismatch(layout, {}, list(adam(1)[0].parameters())) == ""
    assert layout_mismatch(layout, {}, [torch.zeros(1)] * 4) == "tensor 0 has shape [1], this peer's [4, 3]"
