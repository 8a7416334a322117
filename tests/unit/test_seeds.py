"""One model per swarm, each peer its own data order: the seeds every peer derives alike, and who takes whose state
at start."""

import torch

from swarmd.seeds import init_seed, peer_data_seed, seed_everything
from swarmd.swarm.initial_state import level_offers, should_take_swarm_state, start_values


def test_without_a_seed_every_peer_of_a_run_initialises_alike_and_runs_differ():
    assert init_seed(None, "albert-demo") == init_seed(None, "albert-demo")  # stable: no process-local salt
    assert init_seed(None, "albert-demo") != init_seed(None, "albert-demo-2")
    assert init_seed(7, "albert-demo") == 7  # a configured seed wins
    assert 0 <= init_seed(None, "x") < 2**32  # numpy's legacy seeding takes 32 bits


def test_the_run_id_seed_builds_the_same_parameters():
    def build(seed):
        seed_everything(seed)
        return torch.nn.Linear(8, 4).weight.detach().clone()

    assert torch.equal(build(init_seed(None, "run")), build(init_seed(None, "run")))
    assert not torch.equal(build(init_seed(None, "run")), build(init_seed(None, "other-run")))


def test_the_data_order_stays_the_peers_own():
    assert peer_data_seed(None, "QmA") != peer_data_seed(None, "QmB")
    assert peer_data_seed(3, "QmA") != peer_data_seed(4, "QmA")
    assert peer_data_seed(None, "QmA") == peer_data_seed(None, "QmA")  # the same peer after a restart


def test_a_trainer_takes_the_state_of_one_ahead_or_level_and_first_in_id_order():
    assert not should_take_swarm_state(0, "QmB", {})  # alone: keeps its own
    assert should_take_swarm_state(0, "QmB", {"QmA": 0.0})  # two starting together: exactly one downloads
    assert not should_take_swarm_state(0, "QmA", {"QmB": 0.0})
    assert should_take_swarm_state(0, "QmA", {"QmB": 3.0})  # the swarm is ahead
    assert not should_take_swarm_state(5, "QmB", {"QmA": 0.0})  # resumed at epoch 5: never back to a fresh model


def test_a_level_peer_that_started_from_the_same_values_is_not_downloaded_from():
    same, other = "0:aaaa", "0:bbbb"
    # level, first in id order, same start: nothing to take
    assert not should_take_swarm_state(0, "QmB", {"QmA": 0.0}, own_start=same, starts={"QmA": same})
    # another start, an unknown one (no record yet, an older swarmd), or none of this peer's own: take it
    assert should_take_swarm_state(0, "QmB", {"QmA": 0.0}, own_start=same, starts={"QmA": other})
    assert should_take_swarm_state(0, "QmB", {"QmA": 0.0}, own_start=same, starts={})
    assert should_take_swarm_state(0, "QmB", {"QmA": 0.0}, own_start="", starts={"QmA": ""})
    # of two level peers first in id order, one that started elsewhere is enough
    offers = {"QmA": 0.0, "Qm9": 0.0}
    assert should_take_swarm_state(0, "QmB", offers, own_start=same, starts={"QmA": same, "Qm9": other})
    assert level_offers(0, "QmB", {**offers, "QmC": 0.0, "Qm1": 2.0}) == ["Qm9", "QmA"]
    # a peer ahead is taken whatever it started from
    assert should_take_swarm_state(0, "QmB", {"QmC": 1.0}, own_start=same, starts={"QmC": same})


def test_start_values_tell_parameter_values_and_epochs_apart():
    def model(seed):
        seed_everything(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)

    assert start_values(model(1), 0) == start_values(model(1), 0)
    assert start_values(model(1), 0) != start_values(model(2), 0)
    assert start_values(model(1), 0) != start_values(model(1), 3)
    nudged = model(1)
    with torch.no_grad():
        nudged[1].bias[0] += 1  # one value of one parameter
    assert start_values(nudged, 0) != start_values(model(1), 0)
    assert len(start_values(model(1), 123456)) <= 64  # fits the peer record's field
