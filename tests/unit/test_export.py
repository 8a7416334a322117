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
    path = CheckpointStore(config.state_path / "checkpoints", keep=3).save(
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
    for inside in (state, state / "checkpoints" / "x"):  # --force must never replace the checkpoints
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
