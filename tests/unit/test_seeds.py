"""One model per swarm, each peer its own data order: the seeds every peer derives alike, and who takes whose state
at start."""

import torch

from fake_task import CpuTask
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


def _first_step_of_a_peer(peer_id, *, resume=None):
    """What one trainer does from start-up to its first step: the model built with the run's shared seed (as the
    daemon builds it), then the worker's first training step, which sees the drop-path masks of its generators.
    Returns (initial parameters, the first step's logits, the worker's data seed)."""
    import threading
    from types import SimpleNamespace

    from swarmd.config import load_config
    from swarmd.tasks.base import StepOutput
    from swarmd.tasks.swin import SwinModelConfig
    from swarmd.tasks.swin.model import build_swin
    from swarmd.worker.stats import WorkerStats
    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    seed_everything(init_seed(None, "mask-run"))
    model = build_swin(SwinModelConfig(drop_path_rate=0.5), num_classes=10, device="cpu")
    initial = [p.detach().clone() for p in model.parameters()]
    images = torch.ones(8, 3, 32, 32)  # the same batch for both peers: only the masks can differ
    logits = []

    class Task(CpuTask):
        batch = images

        def training_step(self, model, batch):
            out = model(batch)  # train mode: timm's DropPath draws its masks from torch's global generator
            logits.append(out.detach().clone())
            return StepOutput(loss=out.square().mean(), batch_size=batch.shape[0])

    class Optimizer:
        local_epoch = 0
        param_groups = [{"lr": 0.1}]
        tracker = SimpleNamespace(  # the swarm is ahead: a (here empty) download, no look for level peers
            fetched_global_progress_this_epoch=threading.Event(), global_epoch=1,
            global_progress=SimpleNamespace(num_peers=2),
        )
        state_averager = SimpleNamespace(offload_optimizer=False, main_parameters=list(model.parameters()))
        state_loads_total = 0

        def load_state_from_peers(self):
            pass

        def step(self, batch_size=None, grad_scaler=None):
            worker.request_stop()

    Optimizer.tracker.fetched_global_progress_this_epoch.set()
    data_seed = peer_data_seed(None, peer_id)
    worker = TrainingWorker(
        task=Task(), model=model, optimizer=Optimizer(),
        settings=WorkerSettings.from_config(load_config(None, environ={})), stats=WorkerStats(), averaging_log=None,
        device=torch.device("cpu"), data_seed=data_seed, resume=resume,
    )
    worker.start()
    assert worker.join(60) and worker.failure is None, worker.failure
    return initial, logits[0], data_seed


def test_peers_start_from_one_model_but_draw_their_own_drop_path_masks():
    initial_a, logits_a, _ = _first_step_of_a_peer("QmPeerA")
    initial_b, logits_b, _ = _first_step_of_a_peer("QmPeerB")
    assert all(torch.equal(a, b) for a, b in zip(initial_a, initial_b))  # one model per swarm
    assert not torch.allclose(logits_a, logits_b)  # same weights, same batch: the masks differ
    _, again, _ = _first_step_of_a_peer("QmPeerA")
    torch.testing.assert_close(again, logits_a)  # and a peer's own stream is reproducible


def test_a_peer_resumed_from_its_own_checkpoint_continues_its_generators_instead():
    from swarmd.worker.resume import DataPosition, ResumePoint, capture_rng_states

    def checkpoint_of(peer_id):
        torch.manual_seed(99)  # where that peer's generators stood when it saved
        seed = peer_data_seed(None, peer_id)
        return ResumePoint(rng=capture_rng_states(), data=DataPosition(seed, seed, 0))

    _, fresh, _ = _first_step_of_a_peer("QmPeerA")
    _, resumed, _ = _first_step_of_a_peer("QmPeerA", resume=checkpoint_of("QmPeerA"))
    _, resumed_again, _ = _first_step_of_a_peer("QmPeerA", resume=checkpoint_of("QmPeerA"))
    torch.testing.assert_close(resumed, resumed_again)  # exact resume: the checkpoint's generators go on
    assert not torch.allclose(resumed, fresh)
    # another peer's checkpoint: its generators are that peer's, so this one draws its own again
    _, from_another, _ = _first_step_of_a_peer("QmPeerA", resume=checkpoint_of("QmPeerB"))
    torch.testing.assert_close(from_another, fresh)
