"""One model per swarm, each peer its own data order: the seeds every peer derives alike, and who takes whose state
at start."""

import torch

from swarmd.seeds import init_seed, peer_data_seed, seed_everything
from swarmd.swarm.initial_state import should_take_swarm_state


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
