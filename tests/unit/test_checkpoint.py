"""Checkpoints: atomic, verified, pruned; a broken or interrupted save never costs the last good one."""

import errno
import os

import pytest
import torch

from swarmd.checkpoints import store as ckpt_module
from swarmd.checkpoints.store import CheckpointError, CheckpointStore, checkpoint_epoch
from swarmd.checkpoints.restore import load_model_state


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as ALBERT's decoder is


def optimizer_state(model, epoch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([1, 2])).sum().backward() if isinstance(model, torch.nn.Embedding) else None
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()
    state["state"]["local_epoch"] = epoch
    return state


def save(store, model, epoch):
    return store.save(
        model_state=model.state_dict(), optimizer_state=optimizer_state(model, epoch), epoch=epoch, info={"run_id": "r"}
    )


def test_round_trip_with_tied_weights(tmp_path):
    model = Tied()
    store = CheckpointStore(tmp_path, keep=3)
    save(store, model, 7)
    loaded = store.load_latest()
    assert loaded.epoch == 7 and loaded.meta["run_id"] == "r"
    assert loaded.optimizer_state["state"]["local_epoch"] == 7
    assert set(loaded.optimizer_state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    fresh = Tied()
    load_model_state(fresh, loaded)
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert fresh.head.weight is fresh.embed.weight  # still tied
    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    state = loaded.optimizer_state
    state["state"].pop("local_epoch")
    opt.load_state_dict(state)  # a real optimizer accepts it


def test_a_checkpoints_folder_name_says_its_epoch(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    paths = [save(store, torch.nn.Linear(3, 3), epoch) for epoch in (12, 3)]
    assert [checkpoint_epoch(path) for path in paths] == [12, 3]
    assert [checkpoint_epoch(path) for path in store.list()] == [12, 3]  # newest first
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        checkpoint_epoch(tmp_path / ".partial-00000012-x")


def test_keeps_only_the_newest(tmp_path):
    model = torch.nn.Linear(3, 3)
    store = CheckpointStore(tmp_path, keep=2)
    for epoch in (1, 2, 3, 4):
        save(store, model, epoch)
    assert [p.name.split("-")[1] for p in store.list()] == ["00000004", "00000003"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_meta", "garbage_meta"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage, caplog):
    model = torch.nn.Linear(3, 3)
    store = CheckpointStore(tmp_path, keep=3)
    save(store, model, 1)
    newest = save(store, model, 2)
    target = newest / "model.safetensors"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:20])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "delete_meta":
        (newest / "meta.json").unlink()
    else:
        (newest / "meta.json").write_text("{not json")
    loaded = store.load_latest()
    assert loaded.epoch == 1
    assert newest.name in caplog.text and "falling back" in caplog.text


def test_interrupted_save_leaves_no_checkpoint_and_is_cleaned(tmp_path):
    model = torch.nn.Linear(3, 3)
    store = CheckpointStore(tmp_path, keep=3)
    save(store, model, 1)
    leftover = tmp_path / ".partial-00000002-abc"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    assert store.load_latest().epoch == 1
    store.remove_partials()
    assert not leftover.exists()


def test_full_disk_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 3)
    store = CheckpointStore(tmp_path, keep=1)
    save(store, model, 1)

    def no_space(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(ckpt_module, "_write_synced", no_space)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save(store, model, 2)
    monkeypatch.undo()
    assert [p.name.split("-")[1] for p in store.list()] == ["00000001"]
    assert store.load_latest().epoch == 1
    assert not list(tmp_path.glob(".partial-*"))


def test_optimizer_with_tensors_in_param_groups_round_trips(tmp_path):
    """timm's LAMB (used by the ALBERT and Swin-T configs) keeps its step count as a tensor in each param group."""
    from timm.optim import Lamb

    model = torch.nn.Linear(3, 2)
    opt = Lamb(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    opt.step()
    store = CheckpointStore(tmp_path, keep=1)
    store.save(model_state=model.state_dict(), optimizer_state=opt.state_dict(), epoch=2, info={})
    loaded = store.load_latest().optimizer_state
    assert torch.equal(loaded["param_groups"][0]["step"], torch.tensor(2.0))
    fresh = Lamb(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert float(fresh.param_groups[0]["step"]) == 2.0
