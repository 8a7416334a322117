"""Checkpoints of model, optimizer and epoch: safetensors files plus a small JSON manifest, written atomically.

Layout: <checkpoint.dir, default state_dir/checkpoints>/epoch-00000012-20261129T170501Z/{model.safetensors,
optimizer.safetensors, resume.safetensors, meta.json}; resume.safetensors and the manifest's "resume" hold where
training stood besides the weights (random generators, loss scale, data position: worker/resume.py), the
manifest's "config" the run's config (SwarmdConfig.run_record); checkpoints written before have neither. The store
touches only `epoch-*` and `.partial-*` names in its folder (an export-epoch-<N> beside them stays). A checkpoint is assembled in a hidden `.partial-*` folder, every file is fsynced, and only then the
folder is renamed into place, so a crash or a full disk mid-save never replaces the last good checkpoint. The
manifest holds a SHA-256 of every file; a checkpoint whose files do not match is reported and skipped on load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "CheckpointStore", "Checkpoint", "CheckpointError", "FORMAT_VERSION", "storage_key", "fsync_path", "checkpoint_epoch",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^epoch-(\d{8})-(\d{8}T\d{6}(?:\.\d+)?Z)$")
_MODEL_FILE, _OPTIMIZER_FILE, _META_FILE = "model.safetensors", "optimizer.safetensors", "meta.json"
_RESUME_FILE = "resume.safetensors"  # optional: absent from checkpoints of older versions
_GROUP_PREFIX = "param_groups/"  # optimizer.safetensors keys of tensors kept in param groups (not per-parameter state)


def checkpoint_epoch(path: Path) -> int:
    """The epoch a checkpoint folder's name says (its manifest says it too, but reading that means opening it)."""
    match = _NAME.match(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a checkpoint folder's name")
    return int(match.group(1))


class CheckpointError(Exception):
    """A checkpoint could not be written or read; the message says which and why."""


@dataclass
class Checkpoint:
    path: Path
    epoch: int
    meta: dict[str, Any]
    model_state: dict[str, Any]  # name -> tensor
    optimizer_state: dict[str, Any]  # a torch optimizer state_dict (hivemind's, with local_epoch)
    resume_tensors: dict[str, Any] = field(default_factory=dict)  # worker/resume.py ResumePoint.to_checkpoint()
    resume_meta: dict[str, Any] = field(default_factory=dict)  # {} for a checkpoint that has none


class CheckpointStore:
    def __init__(self, directory: Path, keep: int):
        self.directory = Path(directory)
        self.keep = keep

    # --- writing -------------------------------------------------------------------------------------------

    def save(
        self,
        *,
        model_state: dict[str, Any],
        optimizer_state: dict[str, Any],
        epoch: int,
        info: dict[str, Any],
        resume: Optional[tuple[dict[str, Any], dict[str, Any]]] = None,
    ) -> Path:
        """Write one checkpoint atomically and prune old ones; raise CheckpointError (old ones stay intact).

        `resume`: (tensors, JSON meta) of where training stood (worker/resume.py), in the same atomic write."""
        from safetensors.torch import save as to_safetensors_bytes

        started = time.monotonic()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
        final = self.directory / f"epoch-{epoch:08d}-{stamp}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(prefix=f".partial-{epoch:08d}-", dir=self.directory))
        except OSError as e:
            raise CheckpointError(f"could not write checkpoint for epoch {epoch} in {self.directory}: {e}") from e
        try:
            optimizer_tensors, optimizer_meta = _flatten_optimizer_state(optimizer_state)
            files = {
                _MODEL_FILE: to_safetensors_bytes(_unique_contiguous(model_state)),
                _OPTIMIZER_FILE: to_safetensors_bytes(optimizer_tensors),
            }
            resume_meta = {}
            if resume is not None:
                resume_tensors, resume_meta = resume
                files[_RESUME_FILE] = to_safetensors_bytes(_unique_contiguous(resume_tensors))
                json.dumps(resume_meta)  # fail before anything is written
            manifest = {
                "format": FORMAT_VERSION,
                "epoch": epoch,
                "created_at": time.time(),
                **info,
                "optimizer": optimizer_meta,
                **({"resume": resume_meta} if resume is not None else {}),
                "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()},
            }
            for name, data in files.items():
                _write_synced(partial / name, data)
            _write_synced(partial / _META_FILE, json.dumps(manifest, indent=1, sort_keys=True).encode())
            fsync_path(partial)
            os.rename(partial, final)
            fsync_path(self.directory)
        except BaseException as e:
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(e, (OSError, ValueError, TypeError)):
                raise CheckpointError(f"could not write checkpoint for epoch {epoch} in {self.directory}: {e}") from e
            raise
        logger.info("Saved checkpoint %s (%.2f s)", final.name, time.monotonic() - started)
        self._prune()
        return final

    def _prune(self) -> None:
        for old in self.list()[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)

    def remove_partials(self) -> None:
        """Delete leftovers of saves that were interrupted (a crash or a kill mid-save)."""
        if self.directory.is_dir():
            for leftover in self.directory.glob(".partial-*"):
                logger.info("Removing an interrupted checkpoint save: %s", leftover.name)
                shutil.rmtree(leftover, ignore_errors=True)

    # --- reading -------------------------------------------------------------------------------------------

    def list(self) -> list[Path]:
        """Checkpoint folders, newest first (by epoch, then time)."""
        if not self.directory.is_dir():
            return []
        found = [(m.group(1), m.group(2), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
        return [p for *_, p in sorted(found, reverse=True)]

    def load_latest(self) -> Optional[Checkpoint]:
        """The newest checkpoint that verifies; corrupt ones are reported and skipped. None if there is none."""
        for path in self.list():
            try:
                return self.load(path)
            except CheckpointError as e:
                logger.warning("%s; falling back to an older checkpoint", e)
        return None

    def load(self, path: Path) -> Checkpoint:
        from safetensors.torch import load as from_safetensors_bytes

        try:
            meta = json.loads((path / _META_FILE).read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {path.name} is unreadable ({_META_FILE}: {e})") from None
        if meta.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {path.name} has format {meta.get('format')!r}, expected {FORMAT_VERSION}")
        contents = {}
        optional = [_RESUME_FILE] if _RESUME_FILE in meta.get("files", {}) else []
        for name in (_MODEL_FILE, _OPTIMIZER_FILE, *optional):
            expected = meta.get("files", {}).get(name, {})
            try:
                data = (path / name).read_bytes()
            except OSError as e:
                raise CheckpointError(f"checkpoint {path.name} is incomplete ({name}: {e.strerror})") from None
            if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
                raise CheckpointError(
                    f"checkpoint {path.name} is corrupt ({name} does not match its SHA-256: "
                    f"{len(data)} bytes, {expected.get('bytes')} expected)"
                )
            try:
                contents[name] = from_safetensors_bytes(data)
            except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
                raise CheckpointError(f"checkpoint {path.name} is corrupt ({name}: {e})") from None
        return Checkpoint(
            path=path,
            epoch=int(meta["epoch"]),
            meta=meta,
            model_state=contents[_MODEL_FILE],
            optimizer_state=_unflatten_optimizer_state(contents[_OPTIMIZER_FILE], meta["optimizer"]),
            resume_tensors=contents.get(_RESUME_FILE, {}),
            resume_meta=meta.get("resume") or {},
        )


def storage_key(tensor) -> tuple:
    """Tensors with the same key are one tensor under several names (tied weights). The rule of both the writer
    (`_unique_contiguous`) and the reader (restore.py `load_model_state`)."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype)


def _unique_contiguous(state: dict[str, Any]) -> dict[str, Any]:
    """safetensors refuses shared tensors (e.g. tied embeddings): keep the first name of each storage.

    restore.py `load_model_state` puts the dropped names back onto the model's tied parameters.
    """
    unique, seen = {}, set()
    for name, tensor in state.items():
        key = storage_key(tensor)
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        unique[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return unique


def _flatten_optimizer_state(state_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors of a torch optimizer state_dict -> a flat dict for safetensors; the rest -> JSON."""
    import torch

    tensors, scalars = {}, {}
    for index, per_param in state_dict["state"].items():
        if not isinstance(per_param, dict):  # hivemind adds state["local_epoch"] = int
            scalars[str(index)] = per_param
            continue
        for name, value in per_param.items():
            key = f"{index}/{name}"
            if isinstance(value, torch.Tensor):
                tensors[key] = value.detach().to("cpu", copy=True).contiguous()
            else:
                scalars[key] = value
    groups = []
    for index, group in enumerate(state_dict["param_groups"]):
        plain = {}
        for name, value in group.items():
            if isinstance(value, torch.Tensor):  # e.g. timm's LAMB keeps its step count in the group
                tensors[f"{_GROUP_PREFIX}{index}/{name}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                plain[name] = value
        groups.append(plain)
    meta = {"param_groups": groups, "scalars": scalars}
    json.dumps(meta)  # fail here, before anything is written, if a value cannot be stored
    return tensors, meta


def _unflatten_optimizer_state(tensors: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[Any, Any] = {}
    groups = [dict(group) for group in meta["param_groups"]]
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        if key.startswith(_GROUP_PREFIX):
            index, _, name = key[len(_GROUP_PREFIX) :].partition("/")
            groups[int(index)][name] = value
            continue
        index, _, name = key.partition("/")
        if not name:
            state[index] = value  # e.g. local_epoch
            continue
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": groups}


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: its entries, e.g. a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
