"""Ranks inside one peer, at the component level: this test process is rank 0 (as the daemon will be) and owns a
real compute rank (`python -m swarmd.ranks.compute_rank`) on the CPU over gloo, training the toy-regression task.

- two ranks x batch b compute the same mean gradient, and reach the same parameters after K SGD steps, as one
  rank x batch 2b on the same rows;
- a change of rank 0's parameters reaches the other rank before its next step; an unannounced one is caught by
  the checksum and repaired;
- a rank killed with SIGKILL is named with its device within seconds, rank 0's collective fails instead of
  hanging, and no process is left; a hung rank times out; ranks die with rank 0 even when it is SIGKILLed.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from swarmd.config import load_config
from swarmd.config.task_resolver import use_task_resolver
from swarmd.ranks.group import RankGroup
from swarmd.ranks.layout import rank_data_seed
from swarmd.ranks.step_sync import RankFailure, StepSync
from swarmd.tasks.base import TaskContext
from swarmd.tasks.registry import resolve_task

use_task_resolver(resolve_task)  # also in RANK0_SCRIPT's process, which imports this module without conftest.py

BATCH = 8
INIT_SEED, DATA_SEED = 11, 4242
CONNECT_TIMEOUT = 180  # a compute rank imports torch and builds the task first: slow on a loaded 2-core box


def toy_config(state_dir: Path, **training):
    return load_config(
        environ={},
        flags={
            "task.name": "toy-regression",
            "task.samples": 512,
            "state_dir": str(state_dir),
            "training.batch_size": BATCH,
            "training.devices": ["cpu", "cpu"],
            **{f"training.{key}": value for key, value in training.items()},
        },
    )


@pytest.fixture(scope="module")
def plugin_site(test_tasks_env):
    """The toy task importable here too (rank 0 builds it in this process)."""
    site = test_tasks_env["PYTHONPATH"].split(os.pathsep)[0]
    sys.path.insert(0, site)
    yield test_tasks_env
    sys.path.remove(site)


class Rank0:
    """What the training worker will do on rank 0, with plain SGD standing in for hivemind.Optimizer."""

    def __init__(self, config, group: RankGroup, *, verify_every: int, device="cpu", loss_scale=1.0):
        self.device = torch.device(device)
        self.precision, self.loss_scale = config.training.precision, loss_scale
        self.task = self._task(config)
        torch.manual_seed(INIT_SEED)
        self.model = self.task.build_model().to(self.device)
        self.sync = StepSync(
            self.model, rank=0, world_size=2, device=self.device, verify_every=verify_every,
            describe_failure=group.dead_rank,
        )
        self.batches = iter(self.task.train_batches(rank_data_seed(DATA_SEED, 0)))
        # rank 1 reads its own shard; this mirror of it (same task, same seed) lets the test compute the reference
        self.rank1_batches = iter(self._task(config).train_batches(rank_data_seed(DATA_SEED, 1)))
        self.version = 0

    @staticmethod
    def _task(config):
        from swarmd.tasks.registry import resolve_task

        task = resolve_task("toy-regression")(
            config.task.settings,
            TaskContext(state_dir=config.state_path, device=torch.device("cpu"), precision="fp32", batch_size=BATCH, seed=INIT_SEED),
        )
        task.prepare()
        return task

    def step(self):
        """One local step of the peer; returns the averaged gradients, the totals, and the peer's rows."""
        self.sync.lead(params_version=self.version, loss_scale=self.loss_scale)
        x0, y0 = (t.to(self.device) for t in next(self.batches))
        x1, y1 = (t.to(self.device) for t in next(self.rank1_batches))
        with autocast(self.precision, self.device):
            loss = torch.nn.functional.mse_loss(self.model(x0).float(), y0)
        (loss * self.loss_scale).backward()
        totals = self.sync.average_gradients(samples=BATCH, loss=loss.item())
        grads = [p.grad / self.loss_scale for p in self.model.parameters()]
        for p in self.model.parameters():
            p.grad = None  # what the worker does after hivemind's step (reuse_grad_buffers: false)
        return grads, totals, (torch.cat([x0, x1]), torch.cat([y0, y1]))


def autocast(precision: str, device):
    import contextlib

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.float16 if precision == "fp16" else torch.bfloat16)


def reference_grads(model, rows):
    """One rank x batch 2b: the gradient of the mean loss over both ranks' rows."""
    x, y = rows
    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def same(a, b, tol=1e-6):
    return all(torch.allclose(x, y, rtol=1e-5, atol=tol) for x, y in zip(a, b))


def start_group(config, env, *, leader_timeout=60.0, devices=("cpu", "cpu")) -> RankGroup:
    group = RankGroup(
        devices=list(devices), config_data=config.to_dict(), workdir=config.state_path, init_seed=INIT_SEED,
        data_seed=DATA_SEED, leader_timeout=leader_timeout, follower_timeout=120.0,
        threads=1, env=env,
    )
    group.start()
    try:
        group.connect(CONNECT_TIMEOUT)
    except BaseException:
        group.close(0)
        raise
    return group


@pytest.fixture(scope="class")
def peer(plugin_site, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("ranks-peer")
    config = toy_config(state_dir)
    group = start_group(config, plugin_site)
    rank0 = Rank0(config, group, verify_every=4)
    yield rank0, group
    if not group.closed:  # a test failed before test_stop_ends_every_rank_cleanly
        group.close(0)


def reference_grads_keeping(model, rows):
    """reference_grads without disturbing the model's accumulated .grad."""
    kept = [p.grad for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    grads = reference_grads(model, rows)
    for p, g in zip(model.parameters(), kept):
        p.grad = g
    return grads


class TestOnePeerOfTwoRanks:
    """One group for these steps in order (a compute rank takes ~20 s to start on a loaded box); closed before
    the fault tests, which need the process-wide default group for themselves."""

    def test_two_ranks_of_batch_b_follow_one_rank_of_batch_2b(self, peer):
        rank0, group = peer
        torch.manual_seed(INIT_SEED)
        reference = rank0.task.build_model()
        reference.load_state_dict(rank0.model.state_dict())
        optimizer = torch.optim.SGD(rank0.model.parameters(), lr=0.2)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2)
        for _ in range(5):
            grads, totals, rows = rank0.step()
            expected = reference_grads(reference, rows)
            assert same(grads, expected), "the averaged gradient is not the 2b-batch gradient"
            assert totals.samples == 2 * BATCH  # what rank 0 reports to hivemind
            assert [r.samples for r in totals.ranks] == [BATCH, BATCH]
            with torch.no_grad():
                loss = torch.nn.functional.mse_loss(reference(rows[0]), rows[1]).item()
            assert totals.loss == pytest.approx(loss, rel=1e-5)
            for p, g in zip(rank0.model.parameters(), grads):
                p.grad = g
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(reference.parameters(), expected):
                p.grad = g
            reference_optimizer.step()
            reference_optimizer.zero_grad(set_to_none=True)
            rank0.version += 1  # SGD changed rank 0's parameters: announce it, rank 1 gets them before its next step
        assert same(list(rank0.model.parameters()), list(reference.parameters()))
        assert group.dead_rank() is None


    def test_a_change_on_rank_0_reaches_rank_1_before_its_next_step(self, peer):
        rank0, _ = peer
        with torch.no_grad():
            for p in rank0.model.parameters():
                p.add_(0.3)  # e.g. a state download or an averaged state
        rank0.version += 1
        sent = rank0.sync.broadcasts_total
        grads, _, rows = rank0.step()
        assert rank0.sync.broadcasts_total == sent + 1
        assert same(grads, reference_grads(rank0.model, rows)), "rank 1 computed with stale parameters"


    def test_an_unannounced_change_is_caught_by_the_checksum_and_repaired(self, peer):
        rank0, _ = peer
        with torch.no_grad():
            for p in rank0.model.parameters():
                p.mul_(0.5)  # no version bump: the ranks are not told
        repairs = rank0.sync.repairs_total
        stale_steps = 0
        while rank0.sync.repairs_total == repairs:
            assert stale_steps < rank0.sync.verify_every, "no checksum within verify_every steps"
            grads, _, rows = rank0.step()
            if rank0.sync.repairs_total == repairs:
                stale_steps += 1
                assert not same(grads, reference_grads(rank0.model, rows)), "rank 1 should still hold the old parameters"
        # the repair happened before this step's compute: rank 1 already used rank 0's parameters
        assert same(grads, reference_grads(rank0.model, rows))
        grads, _, rows = rank0.step()
        assert same(grads, reference_grads(rank0.model, rows))
        assert rank0.sync.repairs_total == repairs + 1


    def test_with_reuse_grad_buffers_the_ranks_accumulate_like_rank_0(self, peer):
        """hivemind's reuse_grad_buffers keeps .grad across local steps; rank 1 must add each step's mean to the same sum."""
        rank0, _ = peer
        rank0.version += 1
        expected = None
        for _ in range(3):
            rank0.sync.lead(params_version=rank0.version)
            x0, y0 = next(rank0.batches)
            x1, y1 = next(rank0.rank1_batches)
            loss = torch.nn.functional.mse_loss(rank0.model(x0), y0)
            loss.backward()  # into the .grad that still holds the previous steps' mean
            rank0.sync.average_gradients(samples=BATCH, loss=loss.item())
            step_grads = reference_grads_keeping(rank0.model, (torch.cat([x0, x1]), torch.cat([y0, y1])))
            expected = step_grads if expected is None else [e + g for e, g in zip(expected, step_grads)]
            assert same([p.grad for p in rank0.model.parameters()], expected, tol=1e-5)
        for p in rank0.model.parameters():
            p.grad.zero_()  # hivemind's reset after the global step: zeros in place, which rank 0 announces
        grads, _, rows = rank0.step()
        assert same(grads, reference_grads(rank0.model, rows))


    def test_stop_ends_every_rank_cleanly(self, peer):
        rank0, group = peer
        pids = group.pids
        rank0.sync.lead_stop()
        assert group.close(30) is True  # every rank exited by itself with code 0
        assert not any(alive(pid) for pid in pids)


# --- faults ----------------------------------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_rank_is_named_within_seconds_and_nothing_is_left(plugin_site, tmp_path):
    config = toy_config(tmp_path)
    group = start_group(config, plugin_site)
    try:
        rank0 = Rank0(config, group, verify_every=100)
        rank0.step()
        (pid,) = group.pids
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        while group.dead_rank() is None and time.monotonic() - started < 10:
            time.sleep(0.05)
        assert group.dead_rank() == "rank 1 (cpu) was killed by SIGKILL"
        # rank 0's next collective fails with that line instead of hanging
        started = time.monotonic()
        with pytest.raises(RankFailure, match=r"^rank 1 \(cpu\) was killed by SIGKILL$"):
            rank0.step()
        assert time.monotonic() - started < 30
    finally:
        assert group.close(5) is False  # a rank died: not a clean stop
    assert not alive(pid)
    from swarmd.swarm.children import descendant_pids

    assert pid not in descendant_pids()


def test_a_hung_rank_times_out_instead_of_blocking_rank_0(plugin_site, tmp_path):
    config = toy_config(tmp_path)
    group = start_group(config, plugin_site, leader_timeout=5.0)
    (pid,) = group.pids
    try:
        rank0 = Rank0(config, group, verify_every=100)
        rank0.step()
        os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
        started = time.monotonic()
        with pytest.raises(RankFailure, match=r"with the other ranks failed"):
            rank0.step()
        assert time.monotonic() - started < 30
        assert group.dead_rank() is None  # not dead: hung (systemd's watchdog sees the stalled step)
    finally:
        group.close(1)  # SIGKILL reaches a stopped process
    assert not alive(pid)


def test_a_rank_that_cannot_start_is_named_with_its_exit(plugin_site, tmp_path):
    data = toy_config(tmp_path).to_dict()
    data["task"]["samples"] = 4  # below the toy task's minimum: the compute rank's config check fails (exit 2)
    group = RankGroup(devices=["cpu", "cpu"], config_data=data, workdir=tmp_path, init_seed=1, data_seed=2, env=plugin_site)
    group.start()
    try:
        with pytest.raises(RankFailure) as caught:
            group.connect(CONNECT_TIMEOUT)
        assert str(caught.value) == (
            "rank 1 (cpu) failed (exit code 2; its log above says why) before it joined the process group"
        )
    finally:
        group.close(0)
    assert not list(tmp_path.glob("ranks-*")), "the rendezvous directory is left behind"


RANK0_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from pathlib import Path
    import test_ranks as t

    config = t.toy_config(Path(sys.argv[1]))
    group = t.start_group(config, {})
    print(" ".join(map(str, group.pids)), flush=True)
    sys.stdin.read()  # until the test kills this process
    """
)


def test_compute_ranks_die_with_a_sigkilled_rank_0(plugin_site, tmp_path):
    env = {**os.environ, **plugin_site}
    process = subprocess.Popen(
        [sys.executable, "-c", RANK0_SCRIPT, str(tmp_path), str(Path(__file__).parent)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.strip(), "rank 0 did not start its group"
        pids = [int(pid) for pid in line.split()]
        assert all(alive(pid) for pid in pids)
        process.kill()
        process.wait(10)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids), "a compute rank outlived rank 0"
    finally:
        process.kill()
        process.wait(10)


TORCHRUN_RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from swarmd.ranks.compute_rank import load_rank_config, run_torchrun_rank
    from swarmd.ranks.layout import torchrun_rank

    # what `swarmd join` does under torchrun when RANK is not 0
    sys.exit(run_torchrun_rank(load_rank_config(sys.argv[1]), torchrun_rank(os.environ), os.environ))
    """
)


def test_a_rank_started_by_torchrun_joins_rank_0_in_the_same_roles(plugin_site, tmp_path):
    import json
    import socket

    from swarmd.ranks.group import TorchrunGroup
    from swarmd.ranks.layout import torchrun_rank

    config = toy_config(tmp_path, seed=INIT_SEED)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torchrun_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    process = subprocess.Popen(
        [sys.executable, "-c", TORCHRUN_RANK_SCRIPT, str(tmp_path / "config.json")],
        env={**os.environ, **plugin_site, **torchrun_env, "RANK": "1", "LOCAL_RANK": "1"},
    )
    try:
        place = torchrun_rank({**torchrun_env, "RANK": "0", "LOCAL_RANK": "0"})
        group = TorchrunGroup(place, device="cpu", data_seed=DATA_SEED, environ=torchrun_env, leader_timeout=60)
        group.start()
        group.connect(CONNECT_TIMEOUT)
        rank0 = Rank0(config, group, verify_every=100)
        for _ in range(2):
            grads, totals, rows = rank0.step()
            assert same(grads, reference_grads(rank0.model, rows))  # the same data seeds as a spawned rank
            assert totals.samples == 2 * BATCH
        rank0.sync.lead_stop()
        assert process.wait(60) == 0
        assert group.close(5)
    finally:
        process.kill()
        process.wait(10)


# --- CUDA: NCCL between GPUs, autocast, the loss scale, non_blocking copies ---------------------------------
# .ci/cuda-ranks runs these in one go on a GPU machine; elsewhere they skip and say why.

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 CUDA GPUs (NCCL puts one rank per GPU); this machine has "
    f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}",
)


@needs_two_gpus
@pytest.mark.parametrize("precision, loss_scale, tol", [("fp32", 1.0, 1e-5), ("bf16", 1.0, 3e-2), ("fp16", 1024.0, 1e-2)])
def test_cuda_two_gpu_ranks_over_nccl_average_like_one_rank(plugin_site, tmp_path, precision, loss_scale, tol):
    config = toy_config(tmp_path, devices=["cuda:0", "cuda:1"], precision=precision)
    group = start_group(config, plugin_site, devices=("cuda:0", "cuda:1"))
    try:
        assert group.backend == "nccl"
        rank0 = Rank0(config, group, verify_every=2, device="cuda:0", loss_scale=loss_scale)
        for _ in range(4):
            grads, totals, rows = rank0.step()
            with autocast(precision, rank0.device):
                expected = reference_grads(rank0.model, rows)
            assert same(grads, expected, tol=tol), f"{precision}: the averaged gradient is not the 2b-batch gradient"
            assert totals.samples == 2 * BATCH
            assert all(r.cuda_allocated_bytes > 0 and r.cuda_reserved_bytes >= r.cuda_allocated_bytes for r in totals.ranks)
            rank0.version += 1
        assert rank0.sync.repairs_total == 0
        rank0.sync.lead_stop()
        assert group.close(30)
    finally:
        group.close(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; torch.cuda.is_available() is False")
def test_cuda_pinned_batches_reach_the_gpu_intact_with_non_blocking_copies():
    from swarmd.ranks.batches import move_to_device as _to_device

    batch = {"x": torch.randn(64, 16).pin_memory(), "y": [torch.arange(64).pin_memory()]}
    moved = _to_device(batch, torch.device("cuda:0"))
    torch.cuda.synchronize()
    assert moved["x"].is_cuda and torch.equal(moved["x"].cpu(), batch["x"])
    assert torch.equal(moved["y"][0].cpu(), batch["y"][0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; torch.cuda.is_available() is False")
def test_cuda_auto_takes_every_visible_gpu():
    from swarmd.ranks.devices import resolve_devices

    devices = resolve_devices(load_config(environ={}, flags={"training.devices": "auto"}).training)
    assert [str(d) for d in devices] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
