import asyncio
import logging
import sys
import threading
from pathlib import Path

import pytest

from swarmd.status.snapshot import Evaluation, NetworkBytes, Snapshot, TrackingInfo
from swarmd.swarm.averaging_log import AveragingRound
from swarmd.config import load_config
from swarmd.errors import ConfigError
from swarmd.tracking.backends import build_backends
from swarmd.tracking.base import BaseLogger, LoggerFanout
from swarmd.tracking.extension import SnapshotDiff, TrackingExtension, epoch_scalars
from swarmd.tracking.wandb import wandb_init_arguments
from swarmd.worker.stats import CudaMemory
from tracking_readers import tensorboard_scalars, wandb_history

EPOCHS = 5


def lr_at(epoch: int) -> float:
    return 0.1 / (1 + epoch)


def loss_of(epoch: int) -> float:
    return 3.0 - 0.25 * epoch


def snapshot(epoch: int, **changes) -> Snapshot:
    """What the daemon's status would say on reaching `epoch`, with the fields the tracking reads."""
    base = dict(
        run_id="tracking-run",
        state="training",
        local_epoch=epoch,
        global_epoch=epoch,
        num_peers=2,
        num_clients=0,
        target_batch_size=128,
        samples_per_second=100.0 + epoch,
        samples_total=128 * epoch,
        steps_total=8 * epoch,
        loss=loss_of(epoch),
        loss_history=tuple((e, loss_of(e)) for e in range(epoch)),
        averaging={"gradients": {"success": epoch, "failed": 0, "skipped": 0, "rejected": 0}},
        recent_averaging=tuple(
            AveragingRound("gradients", "success", group_size=2, duration_seconds=0.5, epoch=e, time=1000.0 + e)
            for e in range(epoch)
        ),
        state_loads_total=0,
        evaluation=None,
        peers=({"samples_per_second": 100.0 + epoch}, {"samples_per_second": 50.0}),
        learning_rates=(lr_at(epoch), lr_at(epoch) / 10),
        loss_scale=65536.0,
    )
    return Snapshot(**{**base, **changes})


def tracking_config(tmp_path: Path, *settings: str):
    return load_config(environ={}, flags={"state_dir": str(tmp_path / "state")}, assignments=list(settings))


def run_epochs(extension: TrackingExtension, epochs: int = EPOCHS) -> None:
    extension.ready(None)
    for epoch in range(epochs):
        extension.observe(snapshot(epoch))
    asyncio.run(extension.close())


# --- what is logged -------------------------------------------------------------------------------------------


def test_a_snapshot_becomes_named_scalars():
    scalars = epoch_scalars(
        snapshot(
            4,
            network=NetworkBytes(sent_bytes=1000, received_bytes=2000),
            step_metrics={"accuracy": 0.5},
            cuda_memory=(CudaMemory("cuda:0", allocated_bytes=2 * 1024**3, reserved_bytes=3 * 1024**3),),
        )
    )
    assert scalars["lr/group_0"] == pytest.approx(lr_at(4))
    assert scalars["lr/group_1"] == pytest.approx(lr_at(4) / 10)
    assert scalars["loss_metrics/loss_scale"] == 65536.0
    assert scalars["throughput/local_samples_per_second"] == 104.0
    assert scalars["throughput/swarm_samples_per_second"] == 154.0
    assert scalars["swarm/num_peers"] == 2.0
    assert scalars["averaging/gradients_success_total"] == 4.0
    assert scalars["network/sent_bytes_total"] == 1000.0
    assert scalars["network/received_bytes_total"] == 2000.0
    assert scalars["train_metrics/accuracy"] == 0.5
    assert scalars["memory/cuda:0/allocated(GiB)"] == 2.0
    assert scalars["memory/cuda:0/reserved(GiB)"] == 3.0
    # what the snapshot does not carry (not fp16, a CPU peer, no readings yet, metrics off) is left out, not 0
    bare = epoch_scalars(Snapshot(run_id="tracking-run", local_epoch=1, samples_per_second=3.0))
    assert "loss_metrics/loss_scale" not in bare and not any(k.startswith(("lr/", "memory/", "network/")) for k in bare)


def test_each_thing_is_logged_once_at_the_step_it_belongs_to():
    diff = SnapshotDiff(log_every_steps=10)
    assert list(diff.records(snapshot(3, state="joining"))) == []
    first = list(diff.records(snapshot(3)))
    # the epoch record, the loss buckets of epochs 0..2; no old rounds (they are in the totals); the step loss
    assert [(step, axis) for _, step, axis in first] == [(3, "epoch"), (0, "epoch"), (1, "epoch"), (2, "epoch"), (24, "local_step")]
    assert list(diff.records(snapshot(3))) == []  # nothing new

    # epoch 4 begins before the worker closed epoch 3's loss bucket; the bucket shows up one tick later
    early = snapshot(4, loss_history=tuple((e, loss_of(e)) for e in range(3)), steps_total=25)
    records = list(diff.records(early))
    assert [(step, axis) for _, step, axis in records] == [(4, "epoch"), (3, "epoch")]
    assert records[0][0]["lr/group_0"] == pytest.approx(lr_at(4))
    assert records[1][0] == {"averaging/gradients_success": 1.0, "averaging/gradients_duration(s)": 0.5,
                             "averaging/gradients_group_size": 2.0}
    later = snapshot(4, evaluation=Evaluation(epoch=4, metrics={"accuracy": 0.75}), steps_total=30)
    records = list(diff.records(later))
    assert ({"loss_metrics/epoch_avg_loss": loss_of(3)}, 3, "epoch") in records
    assert ({"eval/accuracy": 0.75}, 4, "epoch") in records
    assert ({"loss_metrics/recent_avg_loss": loss_of(4)}, 30, "local_step") in records
    assert list(diff.records(later)) == []


def test_an_epoch_is_logged_once_the_worker_has_read_its_learning_rate_and_gradient_norm():
    diff = SnapshotDiff(log_every_steps=0)
    list(diff.records(snapshot(3, readings_epoch=3)))
    # the optimizer is at epoch 4, the worker has not read epoch 4's values yet: what the snapshot says is epoch 3's
    stale = snapshot(4, readings_epoch=3, learning_rates=(lr_at(3), lr_at(3) / 10), grad_norm=None)
    assert [step for _, step, axis in diff.records(stale) if axis == "epoch" and "lr/group_0" in _] == []
    fresh = snapshot(4, readings_epoch=4, grad_norm=0.5)
    records = [scalars for scalars, step, _ in diff.records(fresh) if "lr/group_0" in scalars]
    assert len(records) == 1
    assert records[0]["lr/group_0"] == pytest.approx(lr_at(4)) and records[0]["loss_metrics/grad_norm"] == 0.5


def test_the_epoch_a_run_stops_at_is_logged_on_the_way_out():
    """training.max_epochs: the worker reaches the last epoch and stops before any tick saw it in "training"."""
    diff = SnapshotDiff(log_every_steps=0)
    list(diff.records(snapshot(5)))
    last = snapshot(6, state="stopping")
    records = list(diff.records(last))
    assert [(step, axis) for scalars, step, axis in records if "swarm/local_epoch" in scalars] == [(6, "epoch")]
    assert ({"loss_metrics/epoch_avg_loss": loss_of(5)}, 5, "epoch") in records
    assert list(diff.records(last)) == []  # once
    assert list(SnapshotDiff(log_every_steps=0).records(last)) == []  # a peer that never trained


def test_the_extensions_stopping_hook_logs_the_last_epoch(tmp_path):
    class View:  # the daemon's view, as the stopping hook gets it: the snapshot is read by calling it
        def snapshot(self):
            return snapshot(EPOCHS, state="stopping")

    recording = Recording()
    extension = TrackingExtension(tracking_config(tmp_path), backends=[recording])
    extension.ready(None)
    for epoch in range(EPOCHS):
        extension.observe(snapshot(epoch))
    extension.stopping(View())
    asyncio.run(extension.close())
    logged = sorted({step for step, axis, scalars in recording.records if "swarm/local_epoch" in scalars})
    assert logged == list(range(EPOCHS + 1))


# --- TensorBoard ----------------------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_loss_and_lr_for_every_epoch(tmp_path):
    config = tracking_config(tmp_path, "tracking.backends=[tensorboard]", "daemon.public_name=peer-a")
    extension = TrackingExtension(config)
    run_epochs(extension)

    runs = list((tmp_path / "state" / "tracking" / "tensorboard").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("peer-a-")
    scalars = tensorboard_scalars(runs[0])
    assert scalars["lr/group_0"] == pytest.approx({e: lr_at(e) for e in range(EPOCHS)})
    # an epoch's loss is known once it has ended: every epoch but the one still running
    assert scalars["loss_metrics/epoch_avg_loss"] == pytest.approx({e: loss_of(e) for e in range(EPOCHS - 1)})
    assert scalars["throughput/swarm_samples_per_second"][EPOCHS - 1] == pytest.approx(150.0 + EPOCHS - 1)
    assert extension.snapshot_fields()["tracking"] == TrackingInfo(
        backends=("tensorboard",), failed=(), failures_total=0, dropped_total=0
    )


# --- Weights & Biases -------------------------------------------------------------------------------------------


def test_wandb_offline_run_history_holds_loss_and_lr_for_every_epoch(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = tracking_config(tmp_path, "tracking.backends=[wandb]", "tracking.wandb.mode=offline")
    extension = TrackingExtension(config)
    run_epochs(extension)
    assert extension.fanout.failed == []

    run_files = list((tmp_path / "state" / "tracking" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    rows = [row for row in wandb_history(run_files[0]) if "epoch" in row]
    lr = {row["epoch"]: row["lr/group_0"] for row in rows if "lr/group_0" in row}
    loss = {row["epoch"]: row["loss_metrics/epoch_avg_loss"] for row in rows if "loss_metrics/epoch_avg_loss" in row}
    assert lr == pytest.approx({e: lr_at(e) for e in range(EPOCHS)})
    assert loss == pytest.approx({e: loss_of(e) for e in range(EPOCHS - 1)})


def test_wandb_settings_come_from_the_config_then_wandb_variables_then_swarmd_defaults(tmp_path):
    settings = tracking_config(tmp_path).tracking.wandb
    defaults = dict(default_project="run-x", default_name="peer-a", default_dir=tmp_path)
    assert wandb_init_arguments(settings, environ={}, **defaults) == {
        "project": "run-x", "name": "peer-a", "group": "run-x", "dir": str(tmp_path)
    }
    from_env = {"WANDB_PROJECT": "p", "WANDB_NAME": "n", "WANDB_DIR": "/d", "WANDB_RUN_GROUP": "g", "WANDB_MODE": "offline"}
    assert wandb_init_arguments(settings, environ=from_env, **defaults) == {}  # wandb reads them itself
    configured = tracking_config(tmp_path, "tracking.wandb={project: q, entity: e, mode: disabled}").tracking.wandb
    assert wandb_init_arguments(configured, environ=from_env, **defaults) == {"project": "q", "entity": "e", "mode": "disabled"}


def test_wandb_online_without_credentials_is_dropped_instead_of_prompting(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings file
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    recording = Recording()
    config = tracking_config(tmp_path, "tracking.backends=[wandb]", "tracking.wandb.mode=online")
    extension = TrackingExtension(config, backends=[*build_backends(config), recording])
    run_epochs(extension)
    assert len(extension.fanout.failed) == 1 and "no W&B credentials" in extension.fanout.failed[0]
    assert sorted({step for step, axis, _ in recording.records if axis == "epoch"}) == list(range(EPOCHS))


# --- failures -----------------------------------------------------------------------------------------------------


class Recording(BaseLogger):
    name = "recording"

    def __init__(self):
        self.records = []
        self.closed = False

    def log(self, scalars, step, axis="epoch"):
        self.records.append((step, axis, dict(scalars)))

    def close(self):
        self.closed = True


class Broken(BaseLogger):
    name = "broken"

    def __init__(self, fail_in: str):
        self.fail_in = fail_in
        self.calls = 0

    def open(self):
        if self.fail_in == "open":
            raise OSError(28, "No space left on device")

    def log(self, scalars, step, axis="epoch"):
        self.calls += 1
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("fail_in", ["open", "log"])
def test_a_backend_that_raises_is_dropped_with_one_warning_and_logging_goes_on(tmp_path, caplog, fail_in):
    recording, broken = Recording(), Broken(fail_in)
    extension = TrackingExtension(tracking_config(tmp_path), backends=[broken, recording])
    with caplog.at_level(logging.WARNING, logger="swarmd.tracking"):
        run_epochs(extension)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "broken" in warnings[0] and "No space left on device" in warnings[0]
    assert broken.calls == (0 if fail_in == "open" else 1)
    assert sorted({step for step, axis, _ in recording.records if axis == "epoch"}) == list(range(EPOCHS))
    assert recording.closed
    status = extension.snapshot_fields()["tracking"]
    assert status.failures_total == 1 and status.backends == ("recording",)
    assert status.failed[0].startswith("broken: ")


def test_logging_never_blocks_when_a_backend_stalls():
    release = threading.Event()

    class Stalled(BaseLogger):
        name = "stalled"

        def log(self, scalars, step, axis="epoch"):
            release.wait(10)

    fanout = LoggerFanout([Stalled()], queue_size=2)
    fanout.start()
    for step in range(10):
        fanout.log({"x": 1.0}, step)  # would hang here if log() waited for the backend
    assert 7 <= fanout.dropped_total <= 8  # one record in the backend, two in the queue (one may not be taken yet)
    release.set()
    assert fanout.close(timeout=10)


def test_no_backends_costs_nothing(tmp_path):
    extension = TrackingExtension(tracking_config(tmp_path))
    run_epochs(extension)
    assert extension.fanout._thread is None
    assert extension.snapshot_fields()["tracking"].backends == ()


# --- configuration -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_a_backend_whose_package_is_missing_is_a_config_error_with_the_pip_command(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # what an environment without the package looks like
    with pytest.raises(ConfigError) as error:
        tracking_config(tmp_path, f"tracking.backends=[{backend}]")
    message = str(error.value)
    assert "tracking.backends" in message and f"pip install 'swarmd[{backend}]'" in message
    assert "\n" not in message


def test_unknown_or_repeated_backends_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="tracking.backends.0"):
        tracking_config(tmp_path, "tracking.backends=[mlflow]")
    with pytest.raises(ConfigError, match="each backend once"):
        tracking_config(tmp_path, "tracking.backends=[wandb, wandb]")


def test_swarmd_join_stops_before_starting_when_the_package_is_missing(tmp_path):
    """The error comes at start-up validation: exit 2, one line, nothing started (no state dir created)."""
    from daemons import REPO, run_cli

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None  # as if not installed\n")
    env = {"PYTHONPATH": f"{hide}:{REPO}"}
    config = tmp_path / "peer.yaml"
    config.write_text("tracking:\n  backends: [wandb]\n")
    state_dir = tmp_path / "state"
    for args in (["config", "validate", str(config)], ["join", "--config", str(config), "--state-dir", str(state_dir)]):
        result = run_cli(*args, env=env, timeout=120)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "pip install 'swarmd[wandb]'" in result.stderr, result.stderr
        assert "tracking.backends" in result.stderr and str(config) in result.stderr
    assert not state_dir.exists()
    assert run_cli("config", "validate", str(config), timeout=120).returncode == 0  # where wandb is installed
