"""`swarmd export`: one checkpoint of a state dir -> a model directory that loads without swarmd.

    OUT/<the task's own files>   what Task.export_model writes: for ALBERT the Hugging Face layout (config.json,
                                 model.safetensors, the tokenizer), for Swin timm's (config.json with the
                                 architecture and its arguments, model.safetensors); by default model.safetensors
    OUT/swarmd-config.yaml       the effective swarmd config the model was rebuilt with
    OUT/swarmd-export.json       what it is: run, task, global epoch, checkpoint, versions, how to load it

The checkpoint holds the weights and the config it was trained with (`SwarmdConfig.run_record`: run_id, task,
swarm, training; older checkpoints have none), so the model is rebuilt from that config, or from the one given
(the task's `build_model`), checked against the checkpoint (task, run, tensor names and shapes: a config that
describes another model is one line, not a traceback) and filled with its weights; then the task writes it out.
Everything is written into a hidden folder beside OUT that is renamed into place at the end, so an export that
fails half-way leaves OUT as it was; its files are 0644 and its folders 0755 whatever wrote them (safetensors
writes 0600, the staging folder is 0700), so the export can be shared as it is.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from swarmd.checkpoints.store import fsync_path
from swarmd.errors import ConfigError, SwarmdError

__all__ = ["CONFIG_FILE", "METADATA_FILE", "FORMAT", "FORMAT_VERSION", "ExportResult", "export_checkpoint"]

CONFIG_FILE = "swarmd-config.yaml"
METADATA_FILE = "swarmd-export.json"
FORMAT, FORMAT_VERSION = "swarmd-export", 1


@dataclass(frozen=True)
class ExportResult:
    output: Path
    checkpoint: str  # the checkpoint folder's name
    epoch: int
    task: str
    load: str  # how to load it, with DIR standing for the output directory
    skipped: tuple[str, ...] = ()  # why newer checkpoints were passed over (damaged)
    recorded_config: bool = False  # rebuilt with the config the checkpoint recorded (no config was given)


def export_checkpoint(
    config,
    output: Path,
    *,
    checkpoint: Optional[str] = None,
    force: bool = False,
    with_recorded: Optional[Callable[[dict, str], Any]] = None,
) -> ExportResult:
    """Export `checkpoint` (default: the newest that verifies) of `config.checkpoint_path` into `output`.

    `config` is a loaded SwarmdConfig: the one the run was trained with, or, with `with_recorded`, the one that
    says where the checkpoints are. `with_recorded(recorded, source)`, for a caller given no config of the run:
    returns the config to export with from the one the checkpoint recorded (`source` names the checkpoint), e.g.
    loaded as a layer under the command line's settings; a checkpoint that recorded none is exported with `config`.
    Raises ConfigError for bad input (no checkpoint, a config of another task, run or model, an output in the
    way), SwarmdError when writing fails.
    """
    output = Path(output).expanduser().absolute()
    _check_output(output, force, config)  # before the slow part
    found, skipped = _load_checkpoint(config, checkpoint)
    recorded = found.meta.get("config")
    if with_recorded is not None and recorded is not None:
        config = with_recorded(recorded, f"the config recorded in checkpoint {found.path.name}")
    _check_identity(found, config)
    task, model = _rebuild(config, found)
    with _staging(output, force) as staging:
        model_section = dict(task.export_model(model, staging) or {})
        for reserved in (CONFIG_FILE, METADATA_FILE):
            if (staging / reserved).exists():
                raise SwarmdError(f"task {config.task.name!r} wrote {reserved}, a name swarmd export keeps for itself")
        _write_config(staging / CONFIG_FILE, config)
        metadata = _metadata(config, found, model, model_section)
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
    return ExportResult(
        output=output,
        checkpoint=found.path.name,
        epoch=found.epoch,
        task=config.task.name,
        load=str(model_section.get("load", "")),
        skipped=tuple(skipped),
        recorded_config=with_recorded is not None and recorded is not None,
    )


# --- the checkpoint and the model --------------------------------------------------------------------------------


def _load_checkpoint(config, name: Optional[str]):
    from swarmd.checkpoints.store import CheckpointError, CheckpointStore

    state_dir, directory = config.state_path, config.checkpoint_path
    elsewhere = state_dir not in directory.parents  # checkpoint.dir on another disk
    if not state_dir.is_dir() and not elsewhere:
        raise ConfigError(f"--state-dir: {state_dir} does not exist; pass the state dir of the peer to export")
    store = CheckpointStore(directory, keep=1)  # keep: unused, this store never saves
    paths = store.list()
    if not paths:
        raise ConfigError(
            f"{'checkpoint.dir' if elsewhere else '--state-dir'}: {store.directory} holds no checkpoint; a peer "
            "writes one every checkpoint.every_epochs global epochs and when it stops"
            + ("" if elsewhere else "; for a peer whose checkpoint.dir is elsewhere, add --set checkpoint.dir=DIR")
        )
    available = ", ".join(p.name for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
    if name is not None:
        chosen = [p for p in paths if p.name == name.rstrip("/")]
        if not chosen:
            raise ConfigError(f"--checkpoint: no checkpoint {name!r} in {store.directory}; available: {available}")
        try:
            return store.load(chosen[0]), []
        except CheckpointError as e:
            raise ConfigError(f"--checkpoint: {e}; export another one (available: {available})") from None
    skipped = []
    for path in paths:
        try:
            return store.load(path), skipped
        except CheckpointError as e:
            skipped.append(str(e))
    raise ConfigError(f"--state-dir: every checkpoint in {store.directory} is damaged ({skipped[0]})")


def _check_identity(checkpoint, config) -> None:
    name = checkpoint.path.name
    advice = "pass the --config the run was trained with"
    trained_by = checkpoint.meta.get("task")
    if trained_by is not None and trained_by != config.task.name:
        raise ConfigError(
            f"task.name: checkpoint {name} was trained by task {trained_by!r}, the config names "
            f"{config.task.name!r}; {advice}"
        )
    run_id = checkpoint.meta.get("run_id")
    if run_id is not None and run_id != config.run_id:
        raise ConfigError(
            f"run_id: checkpoint {name} belongs to run {run_id!r}, the config says {config.run_id!r}; {advice} "
            f"(or add --set run_id={run_id})"
        )


def _rebuild(config, checkpoint):
    """The task and its model, on the CPU, with the checkpoint's weights."""
    import torch

    from swarmd.checkpoints.restore import load_model_state
    from swarmd.tasks.registry import build_task_for_the_model

    task = build_task_for_the_model(config)
    torch.manual_seed(0)
    model = task.build_model()
    _check_fits(model, checkpoint)
    load_model_state(model, checkpoint)
    model.eval()
    return task, model


def _check_fits(model, checkpoint) -> None:
    """Names and shapes of the checkpoint against the model the config builds: one line naming the first misfits."""
    from swarmd.checkpoints.restore import tied_names

    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    saved = {name: tuple(tensor.shape) for name, tensor in checkpoint.model_state.items()}
    # the checkpoint keeps one name of each set of tied tensors (checkpoints/store.py)
    aliases = {alias for names in tied_names(model).values() for alias in names}
    missing = [name for name in expected if name not in saved and name not in aliases]
    unexpected = [name for name in saved if name not in expected]
    reshaped = [
        f"{name} is {list(saved[name])} in the checkpoint, {list(expected[name])} in the model"
        for name in expected  # in the model's order: the first misfit is near the input
        if name in saved and saved[name] != expected[name]
    ]
    problems = []
    if reshaped:
        problems.append(f"{len(reshaped)} tensors differ in shape, e.g. {reshaped[0]}")
    if missing:
        problems.append(f"{len(missing)} model tensors are not in it, e.g. {missing[0]}")
    if unexpected:
        problems.append(f"{len(unexpected)} of its tensors are not in the model, e.g. {unexpected[0]}")
    if problems:
        raise ConfigError(
            f"task.model: checkpoint {checkpoint.path.name} does not fit the model this config builds "
            f"({'; '.join(problems)}); pass the --config the run was trained with"
        )


# --- what goes next to the model -----------------------------------------------------------------------------


def _write_config(path: Path, config) -> None:
    import yaml

    from swarmd import __version__

    header = f"# The swarmd config this model was rebuilt with (swarmd export, swarmd {__version__}).\n"
    path.write_text(header + yaml.safe_dump(config.to_dict(), sort_keys=False))


def _metadata(config, checkpoint, model, model_section: dict[str, Any]) -> dict[str, Any]:
    from swarmd import __version__

    meta = checkpoint.meta
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "task": config.task.name,
        "run_id": config.run_id,
        # hivemind's local_epoch when the checkpoint was taken: the swarm's global epoch this peer had reached
        "global_epoch": checkpoint.epoch,
        # recorded only by checkpoints that carry them; null otherwise
        "samples_seen": meta.get("samples_seen"),
        "last_evaluation": meta.get("last_evaluation"),
        "checkpoint": checkpoint.path.name,
        "checkpoint_created_at": _utc(meta.get("created_at")),
        "peer_id": meta.get("peer_id"),
        "swarmd_version": meta.get("swarmd_version"),  # the swarmd that trained and saved it
        "exported_by": f"swarmd {__version__}",
        "exported_at": _utc(time.time()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "model": model_section,
        "config": CONFIG_FILE,
    }


def _utc(timestamp: Optional[float]) -> Optional[str]:
    if timestamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(timestamp)))


# --- writing it atomically -----------------------------------------------------------------------------------


def _check_output(output: Path, force: bool, config) -> None:
    checkpoints, state, target = config.checkpoint_path.resolve(), config.state_path.resolve(), output.resolve()
    if target == checkpoints or target in checkpoints.parents or _inside_a_checkpoint(target, checkpoints):
        # --force would replace the checkpoints (or the whole state dir, identity included) with the export
        raise ConfigError(f"--output: {output} overlaps the state dir's checkpoints ({checkpoints}); pick another path")
    if target == state or target in state.parents:
        raise ConfigError(f"--output: {output} holds the state dir ({state}); pick another path")
    if not (output.exists() or output.is_symlink()):
        return
    if not output.is_dir():
        raise ConfigError(f"--output: {output} is a file, not a directory; pick another path")
    if not force and any(output.iterdir()):
        raise ConfigError(f"--output: {output} is not empty; pick another directory, or pass --force to replace it")


def _inside_a_checkpoint(target: Path, checkpoints: Path) -> bool:
    """Whether `target` is (or is in) a checkpoint folder or an unfinished save's: what the store writes and prunes.
    Other names in the checkpoint dir are free (checkpoint.export_on_finish writes export-epoch-<N> there)."""
    from swarmd.checkpoints.store import checkpoint_epoch

    if checkpoints not in target.parents:
        return False
    entry = target.relative_to(checkpoints).parts[0]
    try:
        checkpoint_epoch(Path(entry))
    except ValueError:
        return entry.startswith(".partial-")
    return True


@contextmanager
def _staging(output: Path, force: bool):
    """A hidden folder beside `output` to write into; renamed onto `output` when the block succeeds."""
    parent = output.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=parent))
    except OSError as e:
        raise ConfigError(f"--output: cannot write in {parent} ({e.strerror}); pick a writable directory") from None
    try:
        yield staging
        _set_modes(staging)
        _fsync_tree(staging)
        _move_into_place(staging, output, force)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise SwarmdError(f"could not write the export to {output}: {e}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _move_into_place(staging: Path, output: Path, force: bool) -> None:
    try:
        os.rename(staging, output)  # output absent, or an empty directory (rename replaces those)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not force:  # filled while we were exporting
            raise ConfigError(f"--output: {output} is not empty; pick another directory, or pass --force") from None
        # a non-empty directory cannot be renamed over: move it aside first, and back if the swap fails
        aside = Path(tempfile.mkdtemp(prefix=f".{output.name}.replaced-", dir=output.parent))
        os.rename(output, aside)
        try:
            os.rename(staging, output)
        except OSError:
            os.rename(aside, output)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    fsync_path(output.parent)


def _set_modes(root: Path) -> None:
    """One mode for everything the export holds, whichever library wrote it: files 0644, folders 0755."""
    for directory, _, files in os.walk(root):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(Path(directory) / name, 0o644)


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))
