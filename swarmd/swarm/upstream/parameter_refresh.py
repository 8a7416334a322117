"""A joiner that the swarm outran during its state download takes the swarm's parameters again, not its whole state.

Why: hivemind lets a peer train only within one epoch of the swarm. When the swarm's epoch is shorter than a state
download (the parameters and Adam's two statistics: three times the parameters' bytes), every download ends two or
more epochs behind and upstream sends the peer back for another whole one, which ends behind as well: the join
"chases" the swarm (docs/PERFORMANCE.md section 5: up to 13 downloads in one join on loopback). The parameters alone
are a third of the bytes and of the CPU, so they arrive within an epoch where the whole state did not.

What the peer then holds: the swarm's parameters of that epoch, with the optimizer statistics of its first
download, a few epochs older. Its updates then differ from the swarm's (its first moment points where the swarm's
gradients went a few steps ago, and its step count is behind), so its parameters drift from the swarm's until the
next state averaging (every `average_state_every` epochs) evens them out: 5 % of their norm in the test of this
(tests/swarm/test_sync_catch_up.py), 16-17 % for a 20M-parameter joiner on loopback. So it weighs next to nothing
in that round (SwarmOptimizer.inexact_state): the round gives it the swarm's parameters without pulling the
swarm's toward its own.

The protocol: the state stream's `parameters` request (swarm/upstream/state_stream.py), or `rpc_download_parameters` from a
swarmd peer without the stream; both sit beside hivemind's `rpc_download_state` (the same gate of a private swarm,
the same refusal while state sharing is off). A peer that serves neither (plain hivemind) answers with an error, and
the joiner downloads the whole state as upstream does.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.streaming import split_for_streaming

from swarmd.swarm.upstream.averager_gate import admits
from swarmd.swarm.upstream.state_forward import ForwardsState
from swarmd.swarm.upstream.state_stream import served_tensors

__all__ = ["ServesParameters"]

logger = logging.getLogger(__name__)


class ServesParameters(ForwardsState):
    """For hivemind's TrainingStateAverager: serve and download the parameters (and extra tensors) without the
    optimizer's statistics. Sits before TrainingStateAverager in the MRO."""

    # hivemind collects a servicer's RPC handlers once per class and caches them on it; without these, a class whose
    # parent collected first (a plain TrainingStateAverager built earlier in the process) would inherit the parent's
    # handlers and stub, without the one below
    _rpc_handlers = None
    _stub_type = None

    # --- serving (the averager's process) --------------------------------------------------------------------

    async def rpc_download_parameters(
        self, request: averaging_pb2.DownloadRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.DownloadData]:
        if not self.allow_state_sharing or not admits(self._allow_list, context, "download_state"):
            return  # as hivemind refuses a state download: no data, the caller asks the next peer
        # the host process hands over the whole state (a copy in shared memory); only the parameters go out
        metadata, tensors, infos = await self._get_current_state_from_host_process()
        for tensor, info in served_tensors("parameters", tensors, infos):
            for part in split_for_streaming(self.state_compression.compress(tensor, info, allow_inplace=False)):
                yield averaging_pb2.DownloadData(tensor_part=part, metadata=metadata)
                metadata = None

    # --- downloading (the averager's process): by swarm/upstream/state_stream.py's stream, or this RPC where a peer lacks it

    async def _load_parameters_from_peers(self, future: MPFuture, timeout: Optional[float] = None) -> None:
        await self._download_from_peers("parameters", future, timeout)

    # --- applying (the host process) -------------------------------------------------------------------------

    def load_parameters_from_peers(self, timeout: Optional[float] = None) -> bool:
        """Download the parameters (and extra tensors) of a peer whose epoch is not behind this one's, and take
        them with its epoch; keep this peer's optimizer statistics. False when no peer sent a usable set."""
        import torch

        future = MPFuture()
        self._outer_pipe.send(("_load_parameters_from_peers", [], dict(timeout=timeout, future=future)))
        loaded = future.result(timeout=timeout)
        if loaded is None:
            return False
        metadata, tensors = loaded
        parameters = [param for group in self.optimizer.param_groups for param in group["params"]]
        targets = [*parameters, *self.extra_tensors]
        epoch = metadata.get("epoch")
        if not isinstance(epoch, int) or epoch < self.local_epoch:
            logger.warning("Not taking a peer's parameters: its epoch (%r) is behind this peer's", epoch)
            return False
        if [tuple(t.shape) for t in tensors] != [tuple(t.shape) for t in targets]:
            logger.warning("Not taking a peer's parameters: %d tensors of other shapes than this model's", len(tensors))
            return False
        with torch.no_grad(), self.lock_averaged_tensors:
            for target, tensor in zip(targets, tensors):
                target.copy_(tensor, non_blocking=True)
        if self.offload_optimizer:
            self._apply_optimizer_parameters_()  # the offloaded copies above, into the model's own parameters
        if not self.reuse_tensors:
            self._load_local_tensors_into_averager_()
        self.local_epoch = epoch
        self._update_scheduler()
        self.parameters_version += 1  # the data-parallel ranks take them too (swarmd.ranks)
        return True
