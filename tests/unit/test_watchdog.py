"""systemd's watchdog is fed only while training progresses or waits within its configured bounds."""

import asyncio
import logging
import threading
import time
from types import SimpleNamespace

import pytest

from swarmd.config import load_config
from swarmd.daemon.sdnotify import Notifier, WatchdogSettings
from swarmd.daemon.systemd import STOP_MARGIN_SECONDS, SystemdNotifier, progress_check, status_line
from swarmd.status.snapshot import Snapshot
from swarmd.worker.stats import WorkerStats

from fake_task import CpuTask
from notify_receiver import NotifyReceiver


def test_progress_check_allowances():
    interval = 60.0
    # the worker's own work (no budget): one ping interval
    assert progress_check(("computing", 59.0, None), interval)[0]
    assert not progress_check(("computing", 61.0, None), interval)[0]
    # a legitimate wait: its budget plus one interval
    assert progress_check(("downloading the swarm's state", 400.0, 390.0), interval)[0]
    assert not progress_check(("downloading the swarm's state", 451.0, 390.0), interval)[0]
    ok, text = progress_check(("optimizer step", 12.34, 5.0), 1.5)
    assert not ok and text == "optimizer step for 12.3 s, allowed 6.5 s"


def test_stats_heartbeat_ages():
    now = [100.0]
    stats = WorkerStats(clock=lambda: now[0])
    stats.begin("averaging", 30.0)
    now[0] += 0.05
    assert stats.activity() == ("averaging", pytest.approx(0.05), 30.0)
    stats.begin("computing")
    assert stats.activity() == ("computing", 0.0, None)


def test_status_line():
    snapshot = Snapshot(run_id="r", phase="training", local_epoch=12, global_epoch=12, num_peers=3, samples_per_second=245.31, loss=2.3104)
    assert status_line(snapshot) == "training: epoch 12, 3 peers, 245.3 samples/s, loss 2.31"
    behind = Snapshot(run_id="r", phase="joining", state="training", local_epoch=0, global_epoch=40, num_peers=1, samples_per_second=0.0, loss=None)
    assert status_line(behind) == "joining: epoch 0 (swarm at 40), 1 peer, 0.0 samples/s"


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


def test_notifier_feeds_the_watchdog_only_while_the_worker_progresses(tmp_path, caplog):
    receiver = NotifyReceiver(str(tmp_path / "notify.sock"))
    worker_clock = [1000.0]  # the worker's activities age only when the test says so
    stats = WorkerStats(clock=lambda: worker_clock[0])
    view = SimpleNamespace(  # swarmd/extension.py DaemonView
        config=None,
        dht=None,
        worker_activity=stats.activity,
        snapshot=lambda: Snapshot(run_id="r", phase=stats.phase, local_epoch=1, global_epoch=1, num_peers=1, samples_per_second=1.0),
    )
    interval = 0.25
    extension = SystemdNotifier(
        Notifier(str(tmp_path / "notify.sock")), WatchdogSettings(timeout=2 * interval), shutdown_timeout=60.0
    )
    marks = {}

    async def until(predicate):
        await asyncio.wait_for(_until(predicate), timeout=10)

    async def scenario():
        await extension.start(view)
        await until(lambda: receiver.messages)  # the start-up continues on the loop: a STATUS line says what it does
        stats.set_phase("training")
        stats.begin("computing")
        extension.ready(view)
        marks["ready"] = time.time()
        await until(lambda: len(receiver.pings(marks["ready"])) >= 5)  # steps that keep finishing
        marks["hung"] = time.time()
        worker_clock[0] += interval + 0.1  # the step in progress is now older than its allowance: a hang
        await until(lambda: "stopped progressing" in caplog.text)
        marks["silent"] = time.time()
        await asyncio.sleep(3 * interval)  # three more checks, none of which may ping
        stats.begin("downloading the swarm's state", 1.5)  # a legitimate wait, bounded by the config
        marks["waiting"] = time.time()
        await until(lambda: len(receiver.pings(marks["waiting"])) >= 2)
        worker_clock[0] += 1.5 + interval + 0.1  # the download outlived its budget plus one interval
        await until(lambda: caplog.text.count("stopped progressing") >= 2)
        marks["spent"] = time.time()
        await asyncio.sleep(3 * interval)
        extension.stopping(view)
        await extension.close()

    with caplog.at_level(logging.INFO, logger="swarmd.systemd"):
        asyncio.run(scenario())
    receiver.close()

    messages = [m for _, m in receiver.messages]
    assert messages[0].startswith("STATUS=")
    ready = [m for m in messages if m.startswith("READY=1")]
    assert len(ready) == 1 and "MAINPID=" in ready[0] and "STATUS=training: epoch 1" in ready[0]
    # progressing: a ping every interval, never as late as the watchdog timeout
    progressing = receiver.pings(marks["ready"], marks["hung"])
    gaps = [b - a for a, b in zip(progressing, progressing[1:])]
    assert len(progressing) >= 4 and max(gaps) < 2 * interval, gaps
    # hung: pings stop once the allowance (one interval) is spent; the checks after that stay silent
    assert receiver.pings(marks["silent"], marks["waiting"]) == []
    assert "stopped progressing (computing for" in caplog.text
    # waiting legitimately: pings again, until the budget (1.5 s) plus one interval is spent
    assert "progressing again" in caplog.text
    assert receiver.pings(marks["spent"]) == []
    assert "stopped progressing (downloading the swarm's state for" in caplog.text
    stopping = [m for m in messages if m.startswith("STOPPING=1")]
    assert stopping == [f"STOPPING=1\nEXTEND_TIMEOUT_USEC={int((60 + STOP_MARGIN_SECONDS) * 1e6)}\nSTATUS=stopping (saving, saying goodbye)"]


def test_the_worker_declares_its_waits_with_budgets_from_the_config():
    import torch

    from swarmd.tasks.base import StepOutput
    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    config = load_config(
        None,
        environ={},
        assignments=[
            "swarm.matchmaking_time=1",
            "swarm.averaging_timeout=3",
            "swarm.load_state_timeout=7",
            "swarm.load_state_attempts=2",
        ],
    )
    stats = WorkerStats()
    seen: dict[str, tuple] = {}
    model = torch.nn.Linear(2, 1)

    class Task(CpuTask):
        batch = torch.ones(4, 2)

        def training_step(self, model, batch):
            seen["training_step"] = stats.activity()
            return StepOutput(loss=model(batch).sum(), batch_size=4)

    class Optimizer:
        local_epoch = 0
        param_groups = [{"lr": 0.1}]
        tracker = SimpleNamespace(
            fetched_global_progress_this_epoch=threading.Event(), global_epoch=5, global_progress=SimpleNamespace(num_peers=2)
        )
        state_averager = SimpleNamespace(offload_optimizer=False, main_parameters=list(model.parameters()))
        state_loads_total = 0

        def load_state_from_peers(self):
            seen["load_state_from_peers"] = stats.activity()
            self.local_epoch = 5

        def step(self, batch_size=None, grad_scaler=None):
            seen["step"] = stats.activity()
            worker.request_stop()

    Optimizer.tracker.fetched_global_progress_this_epoch.set()
    worker = TrainingWorker(
        task=Task(), model=model, optimizer=Optimizer(), settings=WorkerSettings.from_config(config), stats=stats,
        averaging_log=None, device=torch.device("cpu"), data_seed=0,
    )
    worker.start()
    assert worker.join(30) and worker.failure is None, worker.failure

    download = 2 * 7 + 3  # attempts x load_state_timeout, after waiting for a delayed update (averaging_timeout)
    assert seen["load_state_from_peers"][0] == "downloading the swarm's state"
    assert seen["load_state_from_peers"][2] == pytest.approx(download)
    assert seen["training_step"][0] == "computing" and seen["training_step"][2] is None
    assert seen["step"][0] == "optimizer step"
    assert seen["step"][2] == pytest.approx(1 + 3 * 3 + download)  # matchmaking + 3 averaging rounds + a download


def test_a_diloco_peer_catching_up_neither_evaluates_nor_checkpoints_under_the_epoch_it_took():
    """swarm/strategies/diloco_optimizer.py _catch_up_by_averaging takes the swarm's epoch before its state is the swarm's: the epoch's
    checkpoint and evaluation wait for the epoch after the repairing round."""
    import torch

    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    config = load_config(None, environ={}, assignments=["checkpoint.every_epochs=1"])
    model = torch.nn.Linear(2, 1)
    saved, evaluated = [], []

    class Task(CpuTask):
        eval_every_epochs = 1

        def evaluate(self, model):
            evaluated.append(optimizer.local_epoch)
            return {}

    optimizer = SimpleNamespace(
        local_epoch=0, catching_up=False, param_groups=[{"lr": 0.1}], state_loads_total=0,
        state_averager=SimpleNamespace(offload_optimizer=False, main_parameters=list(model.parameters())),
    )
    worker = TrainingWorker(
        task=Task(), model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config),
        stats=WorkerStats(), averaging_log=None, device=torch.device("cpu"), data_seed=0,
        save_checkpoint=lambda: saved.append(optimizer.local_epoch),
    )
    optimizer.local_epoch, optimizer.catching_up = 7, True  # took the swarm's epoch 7, its state is older
    worker._on_new_epoch(3)
    optimizer.local_epoch, optimizer.catching_up = 8, False  # the round repaired it and stepped
    worker._on_new_epoch(7)
    assert saved == [8] and evaluated == [8]


def _worker_at_the_last_epoch(finish_wait: float, behind: list):
    """A worker whose optimizer just stepped to epoch 3 = training.max_epochs, and a tracker whose fetches show
    `behind` (one entry per fetch, the last repeated): how many other peers are at an earlier epoch."""
    import torch

    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    config = load_config(None, environ={}, assignments=["training.max_epochs=3",
                                                        f"training.finish_wait_seconds={finish_wait}"])
    model = torch.nn.Linear(2, 1)
    fetches = []

    class Tracker:
        def peers_behind(self, epoch):
            assert epoch == 3
            return behind[min(len(fetches), len(behind) - 1)]

        def fetch_soon(self):
            fetches.append(time.monotonic())

    optimizer = SimpleNamespace(
        local_epoch=3, catching_up=False, param_groups=[{"lr": 0.1}], state_loads_total=0, tracker=Tracker(),
        state_averager=SimpleNamespace(offload_optimizer=False, main_parameters=list(model.parameters())),
    )
    worker = TrainingWorker(
        task=CpuTask(), model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config),
        stats=WorkerStats(), averaging_log=None, device=torch.device("cpu"), data_seed=0,
    )
    return worker, fetches


def test_at_the_last_epoch_a_peer_serves_its_state_until_no_peer_is_behind(caplog):
    """trainer.py _wait_for_peers_behind: a peer an epoch behind takes the last model from one that waits for it (the
    router lab's flake: with every donor gone it stopped an update short, with a model of its own)."""
    worker, fetches = _worker_at_the_last_epoch(60, behind=[1, 1, 1, 0])
    with caplog.at_level(logging.INFO, logger="swarmd.worker.trainer"):
        worker._on_new_epoch(2)
    assert worker.reached_max_epochs and worker._stop.is_set()
    assert len(fetches) == 3  # a fetch asked for each time it still saw one behind; stopped at the first showing none
    assert "1 peer(s) of the swarm are behind epoch 3" in caplog.text
    assert "Every peer of the swarm reached epoch 3" in caplog.text
    assert worker.stats.activity()[0] == "serving the last state to peers behind"

    caplog.clear()
    # the common end: the fetch from before the last round still shows the others behind, the next one does not
    worker, fetches = _worker_at_the_last_epoch(60, behind=[2, 0])
    with caplog.at_level(logging.INFO, logger="swarmd.worker.trainer"):
        worker._on_new_epoch(2)
    assert worker._stop.is_set() and len(fetches) == 1 and "behind" not in caplog.text


def test_the_wait_for_peers_behind_is_bounded_and_can_be_turned_off(caplog):
    worker, fetches = _worker_at_the_last_epoch(1.5, behind=[2])  # a peer that never catches up (or died unseen)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="swarmd.worker.trainer"):
        worker._on_new_epoch(2)
    assert 1.5 <= time.monotonic() - started < 5 and worker._stop.is_set()
    assert "2 peer(s) still behind epoch 3 after 2 s: stopping without them" in caplog.text

    worker, fetches = _worker_at_the_last_epoch(0, behind=[2])
    worker._on_new_epoch(2)
    assert worker._stop.is_set() and fetches == []

    worker, fetches = _worker_at_the_last_epoch(60, behind=[2])
    threading.Timer(0.3, worker._stop.set).start()  # a signal during the wait ends it within its poll
    started = time.monotonic()
    worker._on_new_epoch(2)
    assert time.monotonic() - started < 3 and len(fetches) == 1
