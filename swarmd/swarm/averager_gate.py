"""The averagers' RPC handlers refuse callers outside `network.allowed_peers`.

A peer acts on another's averager through three RPCs: asking to join its matchmaking group, sending it parts of an
all-reduce, and downloading its state. hivemind answers anyone; `AdmitsAllowedPeers` sits just above
DecentralizedAverager in each swarmd averager's MRO and checks the caller's peer id first - the one libp2p
authenticated for the stream (`P2PContext.remote_id`), not anything the caller says. A refusal answers the way
hivemind answers a peer it will not serve (a join refused, a part for no group, a download with no state), so the
caller gives up quickly and tries elsewhere. Each averager takes the installed list (swarm/allowlist.py) when it is
built, before its process starts; with none (an open swarm) the handlers are upstream's, unchanged.
"""

from __future__ import annotations

from typing import AsyncIterator

from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2

from swarmd.swarm.allowlist import installed
from swarmd.swarm.averager_pace import PacedAverager
from swarmd.swarm.averager_shutdown import FinalizesRunningRoundsAtShutdown
from swarmd.swarm.partial_rounds import ReportsPartialRounds
from swarmd.swarm.robust_aggregation import AggregatesRobustly

__all__ = ["AdmitsAllowedPeers", "admits", "admits_peer"]


def admits(allow_list, context: P2PContext, where: str) -> bool:
    return admits_peer(allow_list, context.remote_id, where)


def admits_peer(allow_list, peer_id, where: str) -> bool:
    """`peer_id`: the caller libp2p authenticated (a hivemind PeerID)."""
    return allow_list is None or allow_list.admit(peer_id.to_base58(), where)


class AdmitsAllowedPeers(PacedAverager, FinalizesRunningRoundsAtShutdown, ReportsPartialRounds, AggregatesRobustly):
    # (every swarmd averager has this class just above hivemind's, so it also carries the fewer DHT requests of
    # swarm/averager_pace.py, the shutdown fix, the report of a partial round, swarm/partial_rounds.py, and the
    # robust reduction of its share, swarm/robust_aggregation.py)
    _allow_list = None

    def __init__(self, *args, **kwargs):
        # taken before the averager's process starts (inside upstream's __init__) and carried as an attribute, so the
        # list reaches that process whichever way multiprocessing starts it (fork copies the installed one anyway)
        self._allow_list = installed()
        super().__init__(*args, **kwargs)

    async def rpc_join_group(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        if not admits(self._allow_list, context, "join_group"):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
            return
        async for response in super().rpc_join_group(request, context):
            yield response

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        if not admits(self._allow_list, context, "aggregate_part"):
            yield averaging_pb2.AveragingData(code=averaging_pb2.BAD_GROUP_ID)
            return
        async for message in super().rpc_aggregate_part(stream, context):
            yield message

    async def rpc_download_state(
        self, request: averaging_pb2.DownloadRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.DownloadData]:
        if not admits(self._allow_list, context, "download_state"):
            return  # hivemind's own refusal (state sharing off): no state, the caller asks the next peer
        async for message in super().rpc_download_state(request, context):
            yield message
