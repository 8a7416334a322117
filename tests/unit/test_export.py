"""`swarmd export`: a checkpoint becomes a directory that transformers, timm or safetensors load without swarmd,
giving the outputs of the checkpoint's model; bad input is one line and exit code 2, and OUT is never half-written."""

import errno
import json
from pathlib import Path

import pytest
import torch
import yaml

from daemons import REPO, blocked_imports_env, run_cli
from swarmd import __version__
from swarmd.config import load_config
from swarmd.checkpoints.store import CheckpointStore
from swarmd.errors import ConfigError, SwarmdError
from swarmd.export import CONFIG_FILE, METADATA_FILE, export_checkpoint
from swarmd.tasks.base import TaskContext
from swarmd.tasks.registry import resolve_task

CONFIGS = Path(REPO) / "configs"
# fewer generated samples than the micro configs' own, to keep the data fixtures quick; the models are theirs
SMALL_DATA = {
    "albert": ["task.data.generated.documents=200"],
    "swin": ["task.data.generated.train_per_class=2", "task.data.generated.val_per_class=1"],
}


def trained_checkpoint(config, epoch=7, **extra_meta):
    """The task's model, its weights moved away from any fresh initialisation, saved as the daemon saves it."""
    task = resolve_task(config.task.name)(
        config.task.settings,
        TaskContext(config.state_path, torch.device("cpu"), "fp32", 1, 0),  # fewer images than a micro batch
    )
    task.prepare()
    torch.manual_seed(1)
    model = task.build_model()
    with torch.no_grad():
        for param in model.parameters():  # tied parameters appear once, so they stay tied
            param.add_(0.05 * torch.randn_like(param))
    model.eval()
    info = {"run_id": config.run_id, "task": config.task.name, "peer_id": "QmExportTest", "swarmd_version": "0.0.test"}
    path = CheckpointStore(config.checkpoint_path, keep=3).save(
        model_state=model.state_dict(), optimizer_state={"state": {}, "param_groups": []}, epoch=epoch,
        info={**info, **extra_meta},
    )
    return task, model, path


def micro_config(name, state_dir, *more):
    return load_config(
        CONFIGS / f"{name}-micro.yaml", environ={}, flags={"state_dir": str(state_dir)},
        assignments=[*SMALL_DATA[name], *more],
    )


def test_albert_export_loads_with_transformers_and_gives_the_checkpoints_outputs(tmp_path):
    from transformers import AlbertForPreTraining, AutoTokenizer

    config = micro_config("albert", tmp_path / "state")
    task, model, checkpoint = trained_checkpoint(config, epoch=7)
    out = tmp_path / "out"
    result = export_checkpoint(config, out)
    assert (result.checkpoint, result.epoch, result.task) == (checkpoint.name, 7, "albert")

    exported = AlbertForPreTraining.from_pretrained(str(out)).eval()
    batch = next(iter(task.train_batches(seed=3)))
    inputs = {key: batch[key] for key in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        expected, got = model(**inputs), exported(**inputs)
    torch.testing.assert_close(got.prediction_logits, expected.prediction_logits)
    torch.testing.assert_close(got.sop_logits, expected.sop_logits)
    assert exported.get_output_embeddings().weight.data_ptr() == exported.get_input_embeddings().weight.data_ptr()

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = "Ada walked to the harbour with a red lantern."
    assert tokenizer(text)["input_ids"] == task.prepared.tokenizer()(text)["input_ids"]
    assert len(tokenizer) == exported.config.vocab_size

    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["run_id"] == "albert-micro" and metadata["task"] == "albert"
    assert metadata["global_epoch"] == 7 and metadata["checkpoint"] == checkpoint.name
    assert metadata["swarmd_version"] == "0.0.test" and metadata["exported_by"] == f"swarmd {__version__}"
    assert metadata["samples_seen"] is None and metadata["last_evaluation"] is None  # this checkpoint has none
    assert metadata["parameters"] == sum(p.numel() for p in model.parameters())
    assert metadata["model"]["load"] == "transformers.AlbertForPreTraining.from_pretrained(DIR)"
    saved = yaml.safe_load((out / CONFIG_FILE).read_text())
    assert saved["task"]["model"]["hidden_size"] == 64 and saved["run_id"] == "albert-micro"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


def test_swin_export_loads_with_timm_and_gives_the_checkpoints_outputs(tmp_path):
    import timm
    from safetensors.torch import load_file

    config = micro_config("swin", tmp_path / "state")
    _, model, checkpoint = trained_checkpoint(config, epoch=12, samples_seen=12345, last_evaluation={"top1": 0.5})
    out = tmp_path / "out"
    export_checkpoint(config, out)

    timm_config = json.loads((out / "config.json").read_text())
    assert timm_config["architecture"] == "swin_tiny_patch4_window7_224"
    by_name = timm.create_model(timm_config["architecture"], **timm_config["model_args"])
    by_name.load_state_dict(load_file(str(out / "model.safetensors")))
    from_dir = timm.create_model(f"local-dir:{out}", pretrained=True)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(images)
        for exported in (by_name, from_dir):
            torch.testing.assert_close(exported.eval()(images), expected)
    assert expected.shape == (4, 10)
    # the run's own preprocessing, not that of the ImageNet checkpoint timm knows for the architecture
    assert not {"tag", "license"} & set(timm_config["pretrained_cfg"])
    data_config = timm.data.resolve_data_config({}, model=from_dir)
    assert (data_config["crop_pct"], data_config["interpolation"]) == (0.875, "bicubic")
    assert data_config["input_size"] == (3, 32, 32)
    # one mode for every file (safetensors wrote 0600), a folder others can read (the staging one was 0700)
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o644"}
    assert oct(out.stat().st_mode & 0o777) == "0o755"

    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["global_epoch"] == 12 and metadata["samples_seen"] == 12345
    assert metadata["last_evaluation"] == {"top1": 0.5} and metadata["checkpoint"] == checkpoint.name
    assert metadata["model"]["model_args"] == timm_config["model_args"]


def test_a_plugin_task_is_exported_by_the_default_and_the_command_line(tmp_path, test_tasks_env, monkeypatch):
    from safetensors.torch import load_model

    monkeypatch.syspath_prepend(test_tasks_env["PYTHONPATH"].split(":")[0])  # the installed plug-in, in-process
    config_file = tmp_path / "toy.yaml"
    config_file.write_text("run_id: toy-export\ntask: {name: toy-regression, hidden: 8}\n")
    config = load_config(config_file, environ={}, flags={"state_dir": str(tmp_path / "state")})
    task, model, older = trained_checkpoint(config, epoch=3)
    _, model, newest = trained_checkpoint(config, epoch=4)
    out = tmp_path / "out"

    result = run_cli(
        "export", "--state-dir", str(tmp_path / "state"), "--config", str(config_file), "--output", str(out),
        env=test_tasks_env,
    )
    assert result.returncode == 0, result.stderr
    assert f"Exported {newest.name} (task toy-regression, global epoch 4)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(["model.safetensors", CONFIG_FILE, METADATA_FILE])
    fresh = task.build_model()
    load_model(fresh, str(out / "model.safetensors"))
    x = torch.randn(5, 16)
    torch.testing.assert_close(fresh(x), model(x))
    assert json.loads((out / METADATA_FILE).read_text())["model"]["format"] == "safetensors"

    # --checkpoint picks an older one; --force replaces the previous export
    (out / "stale.txt").write_text("from before")
    result = run_cli(
        "export", "--state-dir", str(tmp_path / "state"), "--config", str(config_file), "--output", str(out),
        "--checkpoint", older.name, "--force", env=test_tasks_env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((out / METADATA_FILE).read_text())["global_epoch"] == 3
    assert not (out / "stale.txt").exists()


def _swarm_optimizer(epoch, model):
    """What the daemon's Checkpointer reads of hivemind.Optimizer (checkpoints/restore.py capture_state), and the
    worker at an epoch's end."""
    import threading
    from types import SimpleNamespace

    return SimpleNamespace(
        local_epoch=epoch, catching_up=False, state_loads_total=0, param_groups=[{"lr": 0.1}],
        state_dict=lambda: {"state": {}, "param_groups": []},
        state_averager=SimpleNamespace(
            step=lambda **_: None, lock_optimizer=threading.Lock(), offload_optimizer=False,
            main_parameters=list(model.parameters()),
        ),
    )


def test_the_state_dir_alone_exports_a_checkpoint_the_daemon_wrote_with_its_config(tmp_path):
    """A new user's first try: `swarmd export --state-dir DIR --output OUT` of an ALBERT peer of a run of their own
    naming, with no config at hand: the checkpoint recorded the one it was trained with."""
    from transformers import AlbertForPreTraining

    from swarmd.daemon.checkpointer import Checkpointer

    state, out = tmp_path / "state", tmp_path / "out"
    config = micro_config("albert", state, "run_id=my-albert", "task.model.hidden_size=32")
    task, model, _ = trained_checkpoint(config, epoch=2)  # the data, and a model to save as the daemon does
    checkpointer = Checkpointer.from_config(config)
    checkpointer.save(model, _swarm_optimizer(5, model))
    saved = CheckpointStore(state / "checkpoints", keep=3).load_latest()
    assert saved.epoch == 5 and sorted(saved.meta["config"]) == ["run_id", "swarm", "task", "training"]  # no paths

    result = run_cli("export", "--state-dir", str(state), "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert f"Exported {saved.path.name} (task albert, global epoch 5, with the config it recorded)" in result.stdout
    exported = AlbertForPreTraining.from_pretrained(str(out))
    assert exported.config.hidden_size == 32
    torch.testing.assert_close(exported.albert.pooler.weight, model.albert.pooler.weight)
    assert yaml.safe_load((out / CONFIG_FILE).read_text())["run_id"] == "my-albert"

    # a config given still wins, and one of another run is still one line
    result = run_cli("export", "--state-dir", str(state), "--config", str(CONFIGS / "albert-micro.yaml"),
                     "--output", str(tmp_path / "other"))
    one_line_error(result, 2, "belongs to run 'my-albert', the config says 'albert-micro'")
    # --set applies on top of the recorded config
    def with_recorded(recorded, source):
        return load_config(None, environ={}, flags={"state_dir": str(state)}, recorded=(recorded, source),
                           assignments=["task.model.hidden_size=64"])

    with pytest.raises(ConfigError, match="does not fit the model this config builds"):
        export_checkpoint(load_config(None, environ={}, flags={"state_dir": str(state)}), tmp_path / "third",
                          with_recorded=with_recorded)


def test_a_run_that_reaches_max_epochs_exports_its_last_checkpoint_beside_it(tmp_path):
    """checkpoint.export_on_finish, with checkpoint.dir on another disk than the state dir."""
    import timm

    from swarmd.checkpoints.store import checkpoint_epoch
    from swarmd.daemon.checkpointer import Checkpointer
    from swarmd.worker.stats import WorkerStats
    from swarmd.worker.trainer import TrainingWorker, WorkerSettings

    disk = tmp_path / "other-disk"
    config = micro_config(
        "swin", tmp_path / "state", f"checkpoint.dir={disk}", "checkpoint.export_on_finish=true",
        "training.max_epochs=3", "checkpoint.every_epochs=10",
    )
    task, model, _ = trained_checkpoint(config, epoch=1)  # written where checkpoint.dir says, as the daemon's
    checkpointer = Checkpointer.from_config(config)
    optimizer = _swarm_optimizer(2, model)
    worker = TrainingWorker(
        task=task, model=model, optimizer=optimizer, settings=WorkerSettings.from_config(config), stats=WorkerStats(),
        averaging_log=None, device=torch.device("cpu"), data_seed=0,
        save_checkpoint=lambda: checkpointer.save(model, optimizer),
        export_model=lambda: checkpointer.export_latest(config),
    )
    optimizer.local_epoch = 3
    worker._on_new_epoch(2)  # the global step to epoch 3 = training.max_epochs (not a checkpoint epoch)
    assert worker.reached_max_epochs

    assert [checkpoint_epoch(p) for p in CheckpointStore(disk, keep=3).list()] == [3, 1]
    assert not (tmp_path / "state" / "checkpoints").exists()
    export = disk / "export-epoch-00000003"
    from_dir = timm.create_model(f"local-dir:{export}", pretrained=True).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(from_dir(images), model.eval()(images))
    metadata = json.loads((export / METADATA_FILE).read_text())
    assert metadata["global_epoch"] == 3 and metadata["checkpoint"] == CheckpointStore(disk, keep=3).list()[0].name
    # pruning leaves it alone, and `swarmd export` finds the checkpoints there as well
    CheckpointStore(disk, keep=1)._prune()
    assert export.is_dir() and [checkpoint_epoch(p) for p in CheckpointStore(disk, keep=1).list()] == [3]
    assert export_checkpoint(config, tmp_path / "again").epoch == 3


def one_line_error(result, code, text):
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert text in result.stderr, result.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path, test_tasks_env):
    state, out = tmp_path / "state", tmp_path / "out"
    config_file = tmp_path / "toy.yaml"
    config_file.write_text("run_id: toy-export\ntask: {name: toy-regression, hidden: 8}\n")

    def export(*args):
        return run_cli("export", "--state-dir", str(state), "--config", str(config_file), *args, env=test_tasks_env)

    one_line_error(export("--output", str(out)), 2, f"--state-dir: {state} does not exist")
    state.mkdir()
    one_line_error(export("--output", str(out)), 2, "holds no checkpoint")

    out.mkdir()
    (out / "keep.txt").write_text("mine")
    one_line_error(export("--output", str(out)), 2, "is not empty; pick another directory, or pass --force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    checkpoints = state / "checkpoints"
    for inside in (state, checkpoints, checkpoints / "epoch-00000001-20260101T000000.000Z" / "x",
                   checkpoints / ".partial-00000002-abc"):  # --force must never replace the checkpoints
        one_line_error(export("--output", str(inside), "--force"), 2, "overlaps the state dir's checkpoints")
    assert list(state.iterdir()) == []


def test_a_config_of_another_task_run_or_model_is_refused(tmp_path, test_tasks_env, monkeypatch):
    monkeypatch.syspath_prepend(test_tasks_env["PYTHONPATH"].split(":")[0])
    config_file = tmp_path / "toy.yaml"
    config_file.write_text("run_id: toy-export\ntask: {name: toy-regression, hidden: 8}\n")
    state = tmp_path / "state"
    config = load_config(config_file, environ={}, flags={"state_dir": str(state)})
    _, _, checkpoint = trained_checkpoint(config)

    def refused(*assignments):
        other = load_config(config_file, environ={}, flags={"state_dir": str(state)}, assignments=list(assignments))
        with pytest.raises(ConfigError) as error:
            export_checkpoint(other, tmp_path / "out")
        assert "\n" not in str(error.value)
        return str(error.value)

    assert refused("task.hidden=16").startswith(
        f"task.model: checkpoint {checkpoint.name} does not fit the model this config builds (3 tensors differ in "
        "shape, e.g. 0.weight is [8, 16] in the checkpoint, [16, 16] in the model"
    )
    assert "run 'toy-export', the config says 'other-run'" in refused("run_id=other-run")
    assert refused("task={name: swin}").startswith(
        f"task.name: checkpoint {checkpoint.name} was trained by task 'toy-regression', the config names 'swin'"
    )
    with pytest.raises(ConfigError, match=r"--checkpoint: no checkpoint 'epoch-9' in .*; available: epoch-00000007-"):
        export_checkpoint(config, tmp_path / "out", checkpoint="epoch-9")
    assert not (tmp_path / "out").exists()

    # run_cli: the same refusal from the command line is one line and exit 2
    result = run_cli(
        "export", "--state-dir", str(state), "--config", str(config_file), "--set", "task.hidden=16",
        "--output", str(tmp_path / "out"), env=test_tasks_env,
    )
    one_line_error(result, 2, "does not fit the model this config builds")


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, test_tasks_env, monkeypatch):
    monkeypatch.syspath_prepend(test_tasks_env["PYTHONPATH"].split(":")[0])
    config_file = tmp_path / "toy.yaml"
    config_file.write_text("run_id: toy-export\ntask: {name: toy-regression, hidden: 8}\n")
    config = load_config(config_file, environ={}, flags={"state_dir": str(tmp_path / "state")})
    _, _, good = trained_checkpoint(config, epoch=1)
    _, _, damaged = trained_checkpoint(config, epoch=2)
    (damaged / "model.safetensors").write_bytes(b"not a model")
    result = export_checkpoint(config, tmp_path / "out")
    assert result.checkpoint == good.name and "corrupt" in result.skipped[0]
    with pytest.raises(ConfigError, match=r"^--checkpoint: checkpoint .* is corrupt"):
        export_checkpoint(config, tmp_path / "other", checkpoint=damaged.name)


def test_a_failed_export_leaves_the_output_as_it_was(tmp_path, test_tasks_env, monkeypatch):
    monkeypatch.syspath_prepend(test_tasks_env["PYTHONPATH"].split(":")[0])
    config_file = tmp_path / "toy.yaml"
    config_file.write_text("run_id: toy-export\ntask: {name: toy-regression, hidden: 8}\n")
    config = load_config(config_file, environ={}, flags={"state_dir": str(tmp_path / "state")})
    task, _, _ = trained_checkpoint(config)

    def disk_full(self, model, directory):
        (directory / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(task), "export_model", disk_full)
    out = tmp_path / "exports" / "out"
    out.mkdir(parents=True)
    (out / "previous.txt").write_text("the previous export")
    with pytest.raises(SwarmdError, match=r"^could not write the export to .*out: \[Errno 28\] No space left on dev"):
        export_checkpoint(config, out, force=True)
    assert [p.name for p in (tmp_path / "exports").iterdir()] == ["out"]  # no staging folder left behind
    assert [p.name for p in out.iterdir()] == ["previous.txt"]


def test_export_help_imports_no_torch(tmp_path):
    result = run_cli("export", "--help", env=blocked_imports_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "--output" in result.stdout and "--checkpoint" in result.stdout
