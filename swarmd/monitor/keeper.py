"""Keep the swarm's model: download the state the peers share, write it as a checkpoint and as an export.

So a run whose peers all leave still has its model (hivemind's ALBERT example runs such a monitor peer). The
download is hivemind's own (`rpc_download_state` of the peers' state averagers), made by a client-mode averager
that shares and averages nothing. It returns the state as a flat list: the parameters in the order of the
task's parameter groups, then extra tensors and optimizer statistics. The parameters are copied into a model the
task builds, which is saved with the checkpoint writer the daemon uses (model only: the monitor keeps a model, not
a resumable optimizer) and exported like `swarmd export` would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from swarmd import __version__
from swarmd.errors import SwarmdError

__all__ = ["StateKeeper", "KeptState"]

logger = logging.getLogger("swarmd.monitor")

EXPORT_DIR = "model"


class KeptState:
    def __init__(self, epoch: int, checkpoint: Path, export: Path):
        self.epoch, self.checkpoint, self.export = epoch, checkpoint, export


class StateKeeper:
    """Owns a model of the run's task and a client-mode averager to download into it; `close()` stops it."""

    def __init__(self, config, dht, *, timeout: float = 120.0):
        import torch
        from hivemind.averaging import DecentralizedAverager
        from hivemind.optim.state_averager import TrainingStateAverager

        from swarmd.checkpoints.store import CheckpointStore
        from swarmd.swarm.averager_keys import averager_prefix
        from swarmd.swarm.upstream.rpc_names import UpstreamRpcNames
        from swarmd.swarm.upstream.state_forward import ForwardsState
        from swarmd.swarm.strategies import strategy_of
        from swarmd.tasks.registry import build_task_for_the_model

        class _Downloader(UpstreamRpcNames, ForwardsState, DecentralizedAverager):
            _upstream = TrainingStateAverager  # the name the peers' state averagers serve downloads under
            # (and ForwardsState: by the peers' state stream, swarm/upstream/state_stream.py, where they serve it,
            # and through a forwarder from peers behind NAT, state_forward.py)

        self.config, self.timeout = config, timeout
        self.task = build_task_for_the_model(config)
        self.model = self.task.build_model()
        self.parameters = [p for group in self.task.parameter_groups(self.model) for p in group["params"]]
        prefix = averager_prefix(config.run_id, strategy_of(config).state_suffix)
        self.downloader = _Downloader(averaged_tensors=[torch.zeros(1)], dht=dht, prefix=prefix, client_mode=True,
                                      start=True, serves_as_client=False)  # it holds no state to offer
        self.store = CheckpointStore(config.checkpoint_path, keep=config.checkpoint.keep)
        self.kept: Optional[KeptState] = None

    def keep(self) -> Optional[KeptState]:
        """Download, save and export once; None when no peer shared its state (or the download failed)."""
        import torch

        from swarmd.export import export_checkpoint

        loaded = self.downloader.load_state_from_peers(timeout=self.timeout)
        if loaded is None:
            logger.info("No peer shared its state this time; the last kept model stays")
            return None
        metadata, tensors = loaded
        epoch = int(metadata.get("epoch", 0)) if isinstance(metadata, dict) else 0
        self._check_fits(tensors)
        with torch.no_grad():
            for parameter, tensor in zip(self.parameters, tensors):
                parameter.copy_(tensor)
        model_state = {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()}
        info = {"run_id": self.config.run_id, "task": self.config.task.name, "peer_id": str(self.downloader.peer_id),
                "swarmd_version": __version__, "kept_by": "swarmd monitor", "config": self.config.run_record()}
        checkpoint = self.store.save(
            model_state=model_state, optimizer_state={"state": {}, "param_groups": []}, epoch=epoch, info=info
        )
        exported = export_checkpoint(
            self.config, self.config.state_path / EXPORT_DIR, checkpoint=checkpoint.name, force=True
        )
        self.kept = KeptState(epoch, checkpoint, exported.output)
        logger.info("Kept the swarm's model at global epoch %d: %s (exported to %s)", epoch, checkpoint, exported.output)
        return self.kept

    def _check_fits(self, tensors) -> None:
        if len(tensors) < len(self.parameters):
            raise SwarmdError(
                f"the swarm's state has {len(tensors)} tensors, the task's model {len(self.parameters)} parameters: "
                "pass the --config the run trains with"
            )
        for parameter, tensor in zip(self.parameters, tensors):
            if tuple(parameter.shape) != tuple(tensor.shape):
                raise SwarmdError(
                    f"the swarm's state has a tensor of shape {tuple(tensor.shape)} where the task's model has "
                    f"{tuple(parameter.shape)}: pass the --config the run trains with"
                )

    def close(self) -> None:
        try:
            self.downloader.shutdown()
        except Exception:  # noqa: BLE001 - on the way out
            pass
