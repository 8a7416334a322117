"""TensorBoard: event files under the configured log dir, one sub-directory (a TensorBoard "run") per daemon start.

A directory per start, because a restarted daemon counts its local steps from 0 again, and TensorBoard drops the
points of a run whose step goes backwards. Uses torch's SummaryWriter (the daemon has torch loaded anyway),
which needs the `tensorboard` package: `pip install 'swarmd[tensorboard]'`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional

from swarmd.tracking.base import BaseLogger

__all__ = ["TensorBoardLogger"]

logger = logging.getLogger("swarmd.tracking")


class TensorBoardLogger(BaseLogger):
    name = "tensorboard"

    def __init__(self, root: Path, run_name: str):
        self.log_dir = Path(root) / run_name  # e.g. <state dir>/tracking/tensorboard/<host>-20260101-120000
        self._writer = None

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(str(self.log_dir), max_queue=1000, flush_secs=30)
        logger.info("TensorBoard logs in %s (tensorboard --logdir %s)", self.log_dir, self.log_dir.parent)

    def log(self, scalars: Mapping[str, float], step: int, axis: str = "epoch") -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        # Records come once per epoch (or every few steps): flushing each keeps the curves live at no real cost.
        self._writer.flush()

    def close(self) -> None:
        writer: Optional[object] = self._writer
        self._writer = None
        if writer is not None:
            writer.close()
