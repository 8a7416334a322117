"""Weights & Biases: one wandb run per daemon start, grouped by the swarm's run_id.

wandb is imported only when the backend opens (`pip install 'swarmd[wandb]'`). Every setting follows the same
order: the `tracking.wandb` config, then wandb's own WANDB_* variable (WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME,
WANDB_MODE, WANDB_DIR, WANDB_RUN_GROUP, ...), then swarmd's default (project and group: the run_id; name: the
peer's public name; dir: the state dir). `mode: offline` needs no account: the run stays in the dir until
`wandb sync`.

Records come on two axes (`epoch`, `local_step`); wandb wants one increasing step per run, so each key is
declared (`define_metric`) against the axis it is logged on and the axis value travels in the record.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from swarmd.tracking.base import BaseLogger

__all__ = ["WandBLogger", "wandb_init_arguments"]

logger = logging.getLogger("swarmd.tracking")


def wandb_init_arguments(
    settings, *, default_project: str, default_name: str, default_dir: Path, environ: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments for wandb.init: a key is left out where a WANDB_* variable should decide."""

    def pick(configured, variable: str, default):
        if configured is not None:
            return configured
        return None if environ.get(variable) else default

    arguments = {
        "project": pick(settings.project, "WANDB_PROJECT", default_project),
        "entity": settings.entity,
        "name": pick(settings.name, "WANDB_NAME", default_name),
        "group": None if environ.get("WANDB_RUN_GROUP") else default_project,
        "mode": settings.mode,
        "dir": pick(os.path.expanduser(settings.dir) if settings.dir else None, "WANDB_DIR", str(default_dir)),
    }
    return {key: value for key, value in arguments.items() if value is not None}


class WandBLogger(BaseLogger):
    name = "wandb"

    def __init__(self, init_arguments: Mapping[str, Any], run_config: Optional[dict] = None):
        self.init_arguments = dict(init_arguments)
        self.run_config = run_config or {}
        self._run = None
        self._declared: set[str] = set()

    def open(self) -> None:
        import wandb

        if "dir" in self.init_arguments:
            os.makedirs(self.init_arguments["dir"], exist_ok=True)
        mode = self.init_arguments.get("mode") or os.environ.get("WANDB_MODE") or "online"
        disabled = os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes")
        # Without credentials wandb would prompt on the terminal, from this thread, in a daemon: fail instead.
        if mode in ("online", "run") and not disabled and not wandb.login(prompt=False, verify=False):
            raise RuntimeError(
                "no W&B credentials: set WANDB_API_KEY or run `wandb login`, or set tracking.wandb.mode: offline"
            )
        self._run = wandb.init(
            **self.init_arguments,
            config=self.run_config,
            # a daemon: no stdout capture (it would wrap journald's stream), no banners (we log the run's name),
            # never another run's state
            settings=wandb.Settings(console="off", silent=True, reinit="create_new"),
        )
        logger.info("Weights & Biases run %s (%s)", self._run.name, self._run.settings.mode)

    def log(self, scalars: Mapping[str, float], step: int, axis: str = "epoch") -> None:
        if axis not in self._declared:
            self._run.define_metric(axis)
            self._declared.add(axis)
        for key in scalars:
            if key not in self._declared:
                self._run.define_metric(key, step_metric=axis)
                self._declared.add(key)
        self._run.log({**scalars, axis: step})

    def close(self) -> None:
        import wandb

        run, self._run = self._run, None
        if run is not None:
            run.finish()
        # Stop wandb's service process now, while the daemon is still tidy, rather than in wandb's atexit hook
        # (after the daemon has reaped its leftover children: that hook would then fail on a dead socket).
        wandb.teardown()
