"""What a checkpoint holds besides the weights (worker/resume.py): the random generators, the loss scaler and the
data position survive a save and a load, in the same atomic checkpoint; older checkpoints simply have none."""

import random

import numpy as np
import torch

from swarmd.checkpoints.store import CheckpointStore
from swarmd.tasks.loader import SeededBatchOrder
from swarmd.worker.resume import DataPosition, ResumePoint, capture_rng_states, restore_rng_states


def _draws():
    return random.random(), float(np.random.normal()), float(torch.rand(()))


def test_the_random_generators_come_back_through_a_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # a cached Gaussian in NumPy's state too
    point = ResumePoint(
        rng=capture_rng_states(),
        loss_scaler={"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 7, "_growth_tracker": 3},
        data=DataPosition(peer_seed=11, seed=12, batches=345),
    )
    expected = _draws()
    model = torch.nn.Linear(2, 2)
    store = CheckpointStore(tmp_path, keep=2)
    store.save(model_state=model.state_dict(), optimizer_state={"state": {}, "param_groups": []}, epoch=3,
               info={}, resume=point.to_checkpoint())
    _draws(), _draws()  # the generators move on

    loaded = store.load_latest()
    back = ResumePoint.from_checkpoint(loaded.resume_tensors, loaded.resume_meta)
    restore_rng_states(back.rng)
    assert _draws() == expected
    assert back.loss_scaler == point.loss_scaler and back.data == point.data

    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(back.loss_scaler)
    assert scaler.state_dict()["scale"] == 1024.0 and scaler.state_dict()["_growth_tracker"] == 3


def test_a_checkpoint_of_an_older_version_has_no_resume_point(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    store.save(model_state=torch.nn.Linear(2, 2).state_dict(), optimizer_state={"state": {}, "param_groups": []},
               epoch=1, info={})
    loaded = store.load_latest()
    assert ResumePoint.from_checkpoint(loaded.resume_tensors, loaded.resume_meta) is None


def test_a_damaged_resume_file_makes_the_checkpoint_unusable_like_any_other_file(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    kwargs = dict(model_state=torch.nn.Linear(2, 2).state_dict(), optimizer_state={"state": {}, "param_groups": []},
                  info={}, resume=ResumePoint(rng=capture_rng_states()).to_checkpoint())
    store.save(epoch=1, **kwargs)
    newest = store.save(epoch=2, **kwargs)
    (newest / "resume.safetensors").write_bytes(b"garbage")
    assert store.load_latest().epoch == 1  # verified by its SHA-256, skipped, the previous one used


def test_the_batch_order_skips_to_any_position_without_reading_data():
    def take(order, n):
        iterator = iter(order)
        return [next(iterator) for _ in range(n)]

    whole = take(SeededBatchOrder(10, 3, seed=4), 12)  # 3 batches a pass: four passes
    for skip in (0, 2, 3, 7):
        assert take(SeededBatchOrder(10, 3, seed=4, skip=skip), 12 - skip) == whole[skip:]
    assert take(SeededBatchOrder(10, 3, seed=5), 3) != whole[:3]  # another peer, another order
