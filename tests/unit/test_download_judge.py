"""A downloaded state judged on this peer's own data (swarmd/worker/download_judge.py): the judge alone, and the
training worker driving it with a fake optimizer (a download is the optimizer's count going up with new parameters)."""

import logging
from types import SimpleNamespace

import pytest
import torch

from fake_task import CpuTask, FakeOptimizer
from swarmd.config.loader import load_config
from swarmd.tasks.base import StepOutput
from swarmd.worker.download_judge import OWN_STEPS_NEEDED, DownloadJudge
from swarmd.worker.stats import WorkerStats
from swarmd.worker.trainer import TrainingWorker, WorkerSettings


def test_the_first_loss_on_a_state_that_came_is_judged_against_the_largest_of_this_peers_own():
    judge = DownloadJudge(100.0)
    assert not judge.pending(1)  # before the join nothing is judged (a joiner's download: nothing to judge by)
    judge.begin(1)
    for loss in (0.004, 0.003, 0.002, 0.003, 0.03):  # a hard batch of its own: the reference
        assert not judge.pending(1)
        judge.record(loss)
    assert judge.pending(2)
    why = judge.judge(7.0, 2)
    assert "233x the largest" in why and "0.03;" in why, why
    assert not judge.pending(2)  # judged once
    # refused: this peer's own losses stay the reference; an honest state meeting a batch 50x its median passes
    assert judge.judge(0.15, 3) == ""
    # ...and its losses are the reference from then on: too few of them to judge the next state by
    assert judge.judge(50.0, 4) == ""
    assert judge.judge(float("nan"), 5) != ""  # a state whose loss is not finite: refused whatever came before


def test_too_few_own_steps_or_the_guard_off_judge_nothing():
    judge = DownloadJudge(100.0)
    judge.begin(0)
    for _ in range(OWN_STEPS_NEEDED - 1):
        judge.record(0.001)
    assert judge.judge(1000.0, 1) == ""
    off = DownloadJudge(0.0)
    off.begin(0)
    assert not off.pending(5)


def _worker(model, optimizer, ratio):
    class Task(CpuTask):
        batch = torch.ones(4, 2)

        def training_step(self, model, batch):
            return StepOutput(loss=(model(batch) ** 2).mean(), batch_size=4)

    config = load_config(None, environ={}, assignments=[f"swarm.guard_download_loss_ratio={ratio}"])
    stats = WorkerStats()
    worker = TrainingWorker(
        task=Task(), model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config), stats=stats,
        averaging_log=None, device=torch.device("cpu"), data_seed=0,
    )
    return worker, stats, Task().train_batches(0)


def _fake_optimizer(model):
    class Optimizer(FakeOptimizer):
        steps = 0
        refused = []
        download_in_next_step = None  # the scale of the parameters a download brings within the next step

        def step(self, batch_size=None, grad_scaler=None):
            self.steps += 1
            if self.download_in_next_step is not None:  # hivemind's step downloads where this peer is behind
                self.download(self.download_in_next_step)
                self.download_in_next_step = None

        @torch.no_grad()
        def download(self, scale):  # what a download does to the model: new values, a later epoch, the count up
            for param in model.parameters():
                param.mul_(scale)
            self.state_loads_total += 1
            self.local_epoch += 1

        @torch.no_grad()
        def refuse_state(self, saved, epoch=None):
            self.refused.append([value.clone() for value in saved])
            for value, param in zip(saved, model.parameters()):
                param.copy_(value)
            self.local_epoch = epoch
            return ["QmDonor"]

    return Optimizer(model, lr=0.0)


def test_the_worker_refuses_a_state_far_worse_on_its_own_batch_and_keeps_an_honest_one(caplog):
    """Steps on this peer's own state, then a download 1000x off in the parameters (the loss ~1e6x its own): the
    next step's loss judges it, the parameters from before it come back (refuse_state gets them), the step is
    dropped and counted as a restore. A state a little off passes and is the last good one from then on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = _fake_optimizer(model)
    worker, stats, batches = _worker(model, optimizer, 100.0)
    worker._take_backup()  # as the worker does once it has joined...
    worker._downloads.begin(optimizer.state_loads_total)  # ...after its own download, if any
    for _ in range(OWN_STEPS_NEEDED + 1):
        worker._step(batches)
    own = [p.detach().clone() for p in model.parameters()]
    optimizer.download_in_next_step = 1000.0
    worker._step(batches)  # its optimizer step downloads: a new epoch, whose backup waits for the judgement
    assert optimizer.steps == OWN_STEPS_NEEDED + 2 and optimizer.state_loads_total == 1
    assert all(torch.equal(saved, value) for saved, value in zip(worker._backup, own))

    with caplog.at_level(logging.ERROR, logger="swarmd.worker.trainer"):
        worker._step(batches)
    assert optimizer.steps == OWN_STEPS_NEEDED + 2  # the step on the refused state went nowhere
    assert len(optimizer.refused) == 1 and all(torch.equal(a, b) for a, b in zip(optimizer.refused[0], own))
    assert optimizer.local_epoch == worker._backup_epoch  # the epoch of the parameters put back, not the download's
    assert all(torch.equal(p.detach(), value) for p, value in zip(model.parameters(), own))
    assert stats.restores_total == 1
    assert any("Refused the state downloaded from QmDonor" in r.getMessage() for r in caplog.records)

    optimizer.download(1.1)  # an honest state: a little off
    worker._step(batches)
    assert len(optimizer.refused) == 1 and optimizer.steps == OWN_STEPS_NEEDED + 3
    assert all(torch.equal(saved, p.detach()) for saved, p in zip(worker._backup, model.parameters()))


def test_with_the_guard_off_the_worker_takes_whatever_came():
    model = torch.nn.Linear(2, 1)
    optimizer = _fake_optimizer(model)
    worker, stats, batches = _worker(model, optimizer, 0)
    worker._take_backup()
    worker._downloads.begin(optimizer.state_loads_total)
    for _ in range(OWN_STEPS_NEEDED + 2):
        worker._step(batches)
    optimizer.download(1000.0)
    worker._step(batches)
    assert optimizer.refused == [] and stats.restores_total == 0


SCHEDULES = {  # each kind's factory and its rate at epoch 7 from a base rate of 0.1
    "lambda": (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1 + epoch)), 0.1 / 8),
    # a chainable schedule computes each rate from the last one: only a schedule built again can go back
    "step": (lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5), 0.1 * 0.5 ** 2),
}


@pytest.mark.parametrize("schedule_kind", sorted(SCHEDULES))
def test_a_refused_state_puts_the_parameters_back_restarts_the_statistics_and_names_its_donors(tmp_path,
                                                                                            schedule_kind):
    """swarm/upstream/peer_parts.py refuse_state, as the sync optimizer composes it: the saved parameters back, Adam's
    moments and step counts zeroed (the donor's momentum would carry the next steps its way), each donor reported to
    the exclusion list as `state` evidence, and the epoch of the parameters back (DiLoCo's: the test below)."""
    import threading

    from swarmd.swarm import exclusion
    from swarmd.swarm.exclusion import ExclusionList
    from swarmd.swarm.upstream.optimizer import SwarmOptimizer

    model = torch.nn.Linear(3, 1)
    saved = [p.detach().clone() for p in model.parameters()]
    adam = torch.optim.AdamW(model.parameters(), lr=0.1)
    factory, rate_at_7 = SCHEDULES[schedule_kind]
    schedule = factory(adam)
    model(torch.ones(2, 3)).sum().backward()
    adam.step()  # moments and a step count: what came with the refused state...
    while schedule._step_count <= 10_000:  # ...and its epoch, to which upstream stepped the schedule
        schedule.step()
    donors = ["QmLiar", "QmOther"]
    averager = SimpleNamespace(main_parameters=list(model.parameters()), offload_optimizer=False, optimizer=adam,
                               lock_optimizer=threading.Lock(), donors_of_the_state=lambda: list(donors),
                               note_donors=lambda peers: donors.__setitem__(slice(None), list(peers)),
                               local_epoch=10_000, scheduler=schedule, scheduler_factory=factory,
                               state_sharing_priority=10_000)
    told, reset = [], []
    parts = object.__new__(SwarmOptimizer)
    parts.state_averager, parts.client_mode = averager, False
    parts.grad_averager = SimpleNamespace(reset_accumulated_grads_=lambda: reset.append(True),
                                          state_sharing_priority=10_000)
    parts.tracker = SimpleNamespace(
        report_local_progress=lambda local_epoch, samples_accumulated: told.append((local_epoch, samples_accumulated)))
    listed = ExclusionList(tmp_path / "excluded")
    listed.start()
    exclusion.install(listed)
    try:
        assert parts.refuse_state(saved, 7) == ["QmLiar", "QmOther"]
        reports = []
        for _ in range(50):
            reports += listed.drain()
            if reports:
                break
            threading.Event().wait(0.05)
    finally:
        exclusion.install(None)
    assert all(torch.equal(p.detach(), value) for p, value in zip(model.parameters(), saved))
    for state in adam.state.values():
        assert float(state["exp_avg"].abs().sum()) == 0 and float(state["exp_avg_sq"].abs().sum()) == 0
        assert float(state["step"]) == 0
    assert [(kind, peers) for kind, _, peers in reports] == [("state", ("QmLiar", "QmOther"))]
    # the epoch of the parameters put back, the schedule's rate at it, the progress records told, and the epoch its
    # state and gradients are offered under (the liar's, kept, would have others download this peer's state as newest)
    assert averager.local_epoch == 7 and told == [(7, 0)] and reset == [True]
    assert averager.state_sharing_priority == parts.grad_averager.state_sharing_priority == 7
    del parts.grad_averager  # not a whole optimizer: its __del__ would shut these stand-ins down
    assert averager.scheduler.last_epoch == 7 and averager.scheduler._step_count == 8
    assert averager.scheduler.optimizer is adam and type(averager.scheduler) is type(schedule)
    assert [group["lr"] for group in adam.param_groups] == pytest.approx([rate_at_7])
    assert averager.scheduler.get_last_lr() == pytest.approx([rate_at_7])
    # the state is this peer's own again: nothing left to take again from its donors
    assert donors == []


def test_a_diloco_peer_that_refuses_a_state_goes_back_to_the_outer_step_its_parameters_are_of():
    """DiLoCo's epoch is the outer step, and the worker's backup holds the parameters of its start: refusing a state
    moves the averager there with no inner step into the round (its inner schedule follows), tells the tracker, and
    starts the round again apart from the swarm's."""
    import contextlib
    import threading

    from swarmd.swarm.strategies.diloco_optimizer import DiLoCoOptimizer

    class Averager:
        state_lock = threading.RLock()
        local_epoch, round_steps = 10_000, 5  # the refused state's

        def move_to(self, epoch, round_steps):
            self.local_epoch, self.round_steps = epoch, round_steps

    told, rounds = [], []
    optimizer = object.__new__(DiLoCoOptimizer)
    optimizer.state_averager = Averager()
    optimizer.batch_size_per_step = 4
    optimizer.tracker = SimpleNamespace(pause_updates=contextlib.nullcontext,
                                        update_epoch=lambda new_epoch: told.append(new_epoch),
                                        restart_round=lambda epoch, samples: rounds.append((epoch, samples)))
    optimizer._take_epoch_back(7)
    assert (optimizer.state_averager.local_epoch, optimizer.state_averager.round_steps) == (7, 0)
    assert told == [7] and rounds == [(7, 0)] and optimizer._apart_from_swarm


def test_a_diloco_peer_that_refuses_a_state_restarts_its_inner_optimizers_statistics_too():
    """A DiLoCo state carries the inner optimizer's statistics as well as the outer SGD's: a refusal restarts both
    (before, the inner Adam kept the donor's moments, which would steer the next inner steps)."""
    import threading

    from swarmd.swarm.strategies.diloco_optimizer import DiLoCoOptimizer

    model = torch.nn.Linear(3, 1)
    outer_params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    outer = torch.optim.SGD(outer_params, lr=0.7, momentum=0.9)
    inner = torch.optim.AdamW(model.parameters(), lr=0.1)
    for params, optimizer in ((model.parameters(), inner), (outer_params, outer)):
        for param in params:
            param.grad = torch.full_like(param, 1e6)  # what a liar's state came with
        optimizer.step()
    optimizer = object.__new__(DiLoCoOptimizer)
    optimizer.state_averager = SimpleNamespace(state_lock=threading.RLock(), lock_optimizer=threading.Lock(),
                                               optimizer=outer)
    optimizer.inner_optimizer = inner
    optimizer._restart_downloaded_statistics()
    for state in inner.state.values():
        assert not state["exp_avg"].any() and not state["exp_avg_sq"].any() and float(state["step"]) == 0
    for state in outer.state.values():
        assert not state["momentum_buffer"].any()
