"""StepSync's pieces that need no second process: the control tensor, buckets, weights, checksums.

A one-rank gloo group in this process runs the real collectives (each a no-op copy with one rank)."""

import math

import pytest
import torch

from swarmd.ranks.step_sync import Command, Control, StepSync, _buckets


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))


def test_control_round_trips_through_its_tensor():
    control = Control(Command.STEP, broadcasts=7, sync_parameters=True, verify=False, zero_grads=True, epoch=123456, loss_scale=32768.0)
    assert Control.decode(control.encode("cpu")) == control
    assert Control.decode(Control(Command.STOP, 0, False, False, False, 0, 1.0).encode("cpu")).command == Command.STOP


def test_buckets_keep_order_split_by_size_and_dtype():
    a, b, c = torch.zeros(10), torch.zeros(10), torch.zeros(30)
    d = torch.zeros(5, dtype=torch.float16)
    buckets = _buckets([a, b, c, d], bucket_bytes=80)
    assert [[t.numel() for t in bucket] for bucket in buckets] == [[10, 10], [30], [5]]
    assert [t for bucket in buckets for t in bucket] == [a, b, c, d]


def test_first_step_sends_parameters_then_only_when_the_version_changes(one_rank_group):
    net = model()
    sync = StepSync(net, rank=0, world_size=1, device=torch.device("cpu"), verify_every=3)
    sent = []
    for version in (0, 0, 1, 1, 1):
        sync.lead(params_version=version)
        sent.append(sync.last_control.sync_parameters)
        sync.average_gradients(samples=4, loss=1.0)
    assert sent == [True, False, True, False, False]
    assert sync.broadcasts_total == 2
    assert sync.repairs_total == 0  # step 3's checksum agreed (one rank agrees with itself)


def test_zero_grads_is_announced_only_when_rank_0s_gradients_are_gone(one_rank_group):
    net = model()
    sync = StepSync(net, rank=0, world_size=1, device=torch.device("cpu"))
    sync.lead(params_version=0)
    assert sync.last_control.zero_grads  # no .grad yet
    net(torch.randn(8, 4)).sum().backward()
    sync.average_gradients(samples=8, loss=0.5)
    sync.lead(params_version=0)
    assert not sync.last_control.zero_grads  # reuse_grad_buffers: kept, so the ranks keep their mirror
    sync.average_gradients(samples=8, loss=0.5)
    for p in net.parameters():
        p.grad.zero_()
    sync.lead(params_version=0)
    assert sync.last_control.zero_grads  # hivemind reset the accumulators in place
    sync.average_gradients(samples=8, loss=0.5)


def test_an_abandoned_step_contributes_nothing_even_if_rank_0s_gradients_are_nan(one_rank_group):
    net = model()
    sync = StepSync(net, rank=0, world_size=1, device=torch.device("cpu"))
    sync.lead(params_version=0)
    for p in net.parameters():
        p.grad = torch.full_like(p, float("nan"))
    assert sync.in_step
    sync.abandon_step()
    assert not sync.in_step
    assert all(torch.count_nonzero(p.grad) == 0 for p in net.parameters())
    sync.abandon_step()  # outside a step: nothing to finish


def test_totals_weight_the_loss_by_samples(one_rank_group):
    net = model()
    sync = StepSync(net, rank=0, world_size=1, device=torch.device("cpu"))
    sync.lead(params_version=0)
    net(torch.randn(8, 4)).sum().backward()
    before = [p.grad.clone() for p in net.parameters()]
    totals = sync.average_gradients(samples=8, loss=0.25)
    assert (totals.samples, totals.loss) == (8, 0.25)
    assert totals.ranks[0].samples == 8 and totals.ranks[0].compute_seconds >= 0
    assert all(torch.equal(a, p.grad) for a, p in zip(before, net.parameters()))  # one rank: its own mean
    sync.lead(params_version=0)
    assert math.isnan(sync.average_gradients(samples=8, loss=float("nan")).loss)


def test_checksum_sees_any_change_of_any_parameter():
    net = model()
    sync = StepSync(net, rank=0, world_size=1, device=torch.device("cpu"))
    reference = sync.checksum()
    assert torch.equal(sync.checksum(), reference)
    with torch.no_grad():
        net[2].bias.add_(1e-6)
    assert not torch.equal(sync.checksum(), reference)


def test_roles_are_enforced():
    sync = StepSync(model(), rank=1, world_size=2, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="not for rank 1"):
        sync.lead(params_version=0)


def test_rank_stats_show_each_ranks_compute_rate_and_cuda_memory():
    from swarmd.ranks.rank_stats import RankReport, RankStats
    from swarmd.ranks.step_sync import RankStep, StepTotals

    stats = RankStats(["cuda:0", "cuda:1"])
    for _ in range(3):
        stats.record(StepTotals(samples=48, loss=1.0, ranks=[
            RankStep(0, 32, 0.5, cuda_allocated_bytes=10, cuda_reserved_bytes=20),
            RankStep(1, 16, 0.5, cuda_allocated_bytes=11, cuda_reserved_bytes=22),
        ]))
    rows = stats.snapshot()
    assert rows[0] == RankReport(rank=0, device="cuda:0", samples_total=96, samples_per_second=64.0,
                                 cuda_allocated_bytes=10, cuda_reserved_bytes=20)
    assert rows[1].samples_per_second == 32.0 and rows[1].cuda_reserved_bytes == 22
    cpu = RankStats(["cpu", "cpu"])
    assert cpu.snapshot()[1] == RankReport(rank=1, device="cpu", samples_total=0, samples_per_second=0.0)
