"""The tracking backends swarmd knows: their package, the extra that installs it, and how to build one.

`missing_package` (swarmd/config/optional_packages.py, re-exported here) is what the config schema calls at
validation (so `swarmd join` with a backend that is not installed stops at once with exit 2, not at the first
log); it looks the package up without importing it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from swarmd.config.optional_packages import BACKENDS, missing_package  # re-exported

__all__ = ["BACKENDS", "missing_package", "build_backends"]


def build_backends(config) -> list:
    """The backends `config.tracking` asks for (nothing opened yet: that happens on the fan-out's thread)."""
    from swarmd.tracking.base import BaseLogger

    tracking = config.tracking
    public_name = config.daemon.public_name or socket.gethostname()
    started = time.strftime("%Y%m%d-%H%M%S")
    root = config.state_path / "tracking"
    backends: list[BaseLogger] = []
    for name in tracking.backends:
        if name == "tensorboard":
            from swarmd.tracking.tensorboard import TensorBoardLogger

            log_dir = Path(tracking.tensorboard.log_dir).expanduser() if tracking.tensorboard.log_dir else root / "tensorboard"
            backends.append(TensorBoardLogger(log_dir, f"{public_name}-{started}"))
        elif name == "wandb":
            from swarmd.tracking.wandb import WandBLogger, wandb_init_arguments

            arguments = wandb_init_arguments(
                tracking.wandb,
                default_project=config.run_id,
                default_name=public_name,
                default_dir=root,
                environ=os.environ,
            )
            backends.append(WandBLogger(arguments, run_config=config.to_dict()))
    return backends
