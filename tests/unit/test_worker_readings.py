import pytest
import torch

from swarmd.status.snapshot import Identity, Snapshot, build_snapshot
from swarmd.tracking.extension import epoch_scalars
from swarmd.ranks.precision import make_precision
from swarmd.worker.readings import cuda_memory, epoch_readings
from swarmd.worker.stats import WorkerReadings, WorkerStats


def optimizer_with_two_groups():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters(), "lr": 0.01}], lr=0.1
    )
    return model, optimizer


def snapshot_with(readings: WorkerReadings) -> Snapshot:
    """The daemon's snapshot once the worker recorded `readings` (the path the tick takes)."""
    stats = WorkerStats()
    stats.record_readings(readings)
    identity = Identity(run_id="readings-run", public_name="alpha", task="swin", precision="fp16", client_mode=False,
                        auxiliary=False, target_batch_size=128, started_at=0.0)
    return build_snapshot(identity, "training", worker=stats.report())


def test_readings_follow_the_schedule_and_the_fp16_scaler():
    model, optimizer = optimizer_with_two_groups()
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5**epoch)
    precision = make_precision("fp16", model=model, device=torch.device("cpu"), reuse_grad_buffers=False)
    assert epoch_readings(optimizer, precision, torch.device("cpu")) == WorkerReadings(
        epoch=None, learning_rates=(0.1, 0.01), loss_scale=65536.0, grad_norm=None, cuda_memory=()
    )  # epoch: a plain torch optimizer has no local_epoch (hivemind's has)
    optimizer.step()
    schedule.step()
    readings = epoch_readings(optimizer, precision, torch.device("cpu"))
    assert readings.learning_rates == pytest.approx((0.05, 0.005))
    # what the status shows and the tracking logs from them, once the snapshot carries them
    snapshot = snapshot_with(readings)
    assert snapshot.learning_rates == readings.learning_rates and snapshot.loss_scale == 65536.0
    scalars = epoch_scalars(snapshot)
    assert scalars["lr/group_1"] == pytest.approx(0.005) and scalars["loss_metrics/loss_scale"] == 65536.0


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_no_loss_scale_without_fp16(name):
    model, optimizer = optimizer_with_two_groups()
    precision = make_precision(name, model=model, device=torch.device("cpu"), reuse_grad_buffers=False)
    assert epoch_readings(optimizer, precision, torch.device("cpu")).loss_scale is None
    assert epoch_readings(optimizer, None, torch.device("cpu")).loss_scale is None  # an auxiliary peer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_memory_counts_what_tensors_hold():
    device = torch.device("cuda", 0)
    before = cuda_memory([device])[0]
    block = torch.empty(64 * 1024**2, dtype=torch.uint8, device=device)  # 64 MiB
    after = cuda_memory([device])[0]
    assert after.device == "cuda:0"
    assert after.allocated_bytes - before.allocated_bytes >= 64 * 1024**2
    assert after.reserved_bytes >= after.allocated_bytes
    snapshot = snapshot_with(WorkerReadings(epoch=0, cuda_memory=(after,)))
    assert snapshot.to_dict()["cuda_memory"] == ({"device": "cuda:0", "allocated_bytes": after.allocated_bytes,
                                                  "reserved_bytes": after.reserved_bytes},)  # the socket's JSON
    scalars = epoch_scalars(snapshot.with_fields({"local_epoch": 0}))
    assert scalars["memory/cuda:0/allocated(GiB)"] >= 64 / 1024
    del block
    assert cuda_memory([torch.device("cuda")])[0].device == f"cuda:{torch.cuda.current_device()}"
