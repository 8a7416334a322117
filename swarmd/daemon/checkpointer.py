"""The daemon's checkpoints: the store in the state dir, what goes into one, and how it comes back.

- at start, `load_into_model` (before the optimizer exists) and `load_into_optimizer` (after) resume a run;
- `save` captures model, optimizer and epoch consistently (restore.py), with the worker's resume point (random
  generators, loss scale, data position: worker/resume.py), and writes them atomically (checkpoint.py); called by the worker thread between steps, or by the daemon after the worker stopped;
- `info()` is what the status reports about them (under a lock: written by the worker, read by the tick);
- `export_latest` writes the last one as `swarmd export` does, when the run reaches training.max_epochs.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Optional

from swarmd import __version__
from swarmd.status.snapshot import CheckpointInfo

__all__ = ["Checkpointer", "checkpoint_details"]

logger = logging.getLogger("swarmd.daemon")


class Checkpointer:
    def __init__(
        self, state_dir: Path, *, run_id: str, task: str, keep: int, directory: Optional[Path] = None,
        config: Optional[dict] = None,
    ):
        from swarmd.checkpoints.store import CheckpointStore

        self.store = CheckpointStore(directory if directory is not None else Path(state_dir) / "checkpoints", keep=keep)
        self.run_id, self.task = run_id, task
        self.config = config  # SwarmdConfig.run_record(): recorded in each manifest, for `swarmd export`
        self.peer_id: Optional[str] = None  # written into each checkpoint's manifest once known
        self._info = CheckpointInfo()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config) -> "Checkpointer":
        return cls(
            config.state_path, run_id=config.run_id, task=config.task.name, keep=config.checkpoint.keep,
            directory=config.checkpoint_path, config=config.run_record(),
        )

    def info(self) -> CheckpointInfo:
        with self._lock:
            return self._info

    # --- resuming ------------------------------------------------------------------------------------------

    def load_into_model(self, model):
        """The newest good checkpoint of this run into `model`; returns it (for the optimizer) or None."""
        from swarmd.checkpoints.restore import load_model_state

        self.store.remove_partials()
        checkpoint = self.store.load_latest()
        if checkpoint is None:
            return None
        if checkpoint.meta.get("run_id") not in (None, self.run_id):
            logger.warning(
                "Checkpoint %s belongs to run %r, not %r: ignoring it",
                checkpoint.path.name, checkpoint.meta.get("run_id"), self.run_id,
            )
            return None
        load_model_state(model, checkpoint)
        logger.info("Resuming from checkpoint %s (epoch %d)", checkpoint.path.name, checkpoint.epoch)
        return checkpoint

    @staticmethod
    def load_into_optimizer(optimizer, checkpoint, model) -> None:
        """The model's parameters again (hivemind's set-up step moved them), then the optimizer's state.

        In this order: the optimizer's state may hold parameters of its own that the model's must not overwrite.
        Under DiLoCo the host copies are the outer parameters, and a checkpoint taken mid-round holds inner
        parameters in the model: loaded last, the optimizer state puts the checkpoint's outer ones back."""
        from swarmd.checkpoints.restore import load_optimizer_state, reload_parameters

        reload_parameters(model, optimizer, checkpoint)
        load_optimizer_state(optimizer, checkpoint)

    @staticmethod
    def resume_point(checkpoint):
        """Where the checkpoint's training stood besides its weights (worker/resume.py), or None (older format)."""
        from swarmd.worker.resume import ResumePoint

        return ResumePoint.from_checkpoint(checkpoint.resume_tensors, checkpoint.resume_meta)

    # --- saving --------------------------------------------------------------------------------------------

    def save(self, model, optimizer, *, details: Optional[dict] = None, resume=None) -> None:
        """Capture and write a checkpoint; a failure is logged and counted, the previous checkpoint stays.

        `details`: more for the manifest (e.g. the last evaluation, which `swarmd export` reports);
        `resume`: the worker's ResumePoint (worker/resume.py), captured at the same moment as the model."""
        from swarmd.checkpoints.store import CheckpointError
        from swarmd.checkpoints.restore import capture_state

        model_state, optimizer_state, epoch = capture_state(model, optimizer)
        info = {"run_id": self.run_id, "task": self.task, "peer_id": self.peer_id, "swarmd_version": __version__}
        if self.config is not None:
            info["config"] = self.config
        info.update(details or {})
        try:
            path = self.store.save(
                model_state=model_state, optimizer_state=optimizer_state, epoch=epoch, info=info,
                resume=resume.to_checkpoint() if resume is not None else None,
            )
        except CheckpointError as e:
            with self._lock:
                self._info = CheckpointInfo(
                    self._info.epoch, self._info.path, self._info.time, self._info.failures_total + 1
                )
            logger.error("%s; the previous checkpoint is kept and training goes on", e)
            return
        with self._lock:
            self._info = CheckpointInfo(epoch, str(path), time.time(), self._info.failures_total)

    # --- exporting ----------------------------------------------------------------------------------------------

    def export_latest(self, config) -> Optional[Path]:
        """checkpoint.export_on_finish: the newest checkpoint as `swarmd export` writes it, into export-epoch-<N>
        beside it (replacing one of the same epoch). A failure is logged: the training itself has finished."""
        from swarmd.checkpoints.store import checkpoint_epoch
        from swarmd.errors import SwarmdError
        from swarmd.export import export_checkpoint

        latest = next(iter(self.store.list()), None)
        if latest is None:
            logger.error("No checkpoint to export (checkpoint.export_on_finish)")
            return None
        output = self.store.directory / f"export-epoch-{checkpoint_epoch(latest):08d}"
        try:
            result = export_checkpoint(config, output, checkpoint=latest.name, force=True)
        except SwarmdError as e:
            logger.error("Could not export %s (checkpoint.export_on_finish): %s", latest.name, e)
            return None
        except Exception:  # noqa: BLE001 - a bug of the task's export_model: the run still ended well
            logger.exception("Could not export %s (checkpoint.export_on_finish)", latest.name)
            return None
        logger.info("Exported %s to %s; load it with: %s", latest.name, output,
                    result.load.replace("DIR", repr(str(output))))
        return output


def checkpoint_details(report) -> dict:
    """What `swarmd export` reads from a checkpoint's manifest besides the weights (worker/stats.py's report)."""
    if report.evaluation is None:
        return {}
    epoch, metrics = report.evaluation
    return {"last_evaluation": {"epoch": epoch, **metrics}}
