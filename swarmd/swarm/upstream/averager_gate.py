"""The averagers' RPC handlers refuse callers outside `network.allowed_peers`.

A peer acts on another's averager through three RPCs: asking to join its matchmaking group, sending it parts of an
all-reduce, and downloading its state. hivemind answers anyone; `AdmitsAllowedPeers` sits just above
DecentralizedAverager in each swarmd averager's MRO and checks the caller's peer id first - the one libp2p
authenticated for the stream (`P2PContext.remote_id`), not anything the caller says. A refusal answers the way
hivemind answers a peer it will not serve (a join refused, a part for no group, a download with no state), so the
caller gives up quickly and tries elsewhere. Each averager takes the installed list (swarm/allowlist.py) when it is
built, before its process starts; with none (an open swarm) the handlers are upstream's, unchanged.

The same handlers refuse the peers this peer excluded on evidence (swarm/exclusion.py), in an open swarm too: at
join_group and aggregate_part (the exclusion list, checked after the allow list), and matchmaking does not ask an
excluded peer to lead (averager_pace.py). The evidence itself leaves here: after each round of this peer's share,
every other sender and whether robust aggregation clipped it.
"""

from __future__ import annotations

from typing import AsyncIterator

from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.p2p import P2PContext
from hivemind.proto import averaging_pb2

from swarmd.swarm import exclusion
from swarmd.swarm.allowlist import installed
from swarmd.swarm.claims import SAMPLE_SLACK
from swarmd.swarm.upstream.averager_pace import PacedAverager
from swarmd.swarm.upstream.averager_shutdown import FinalizesRunningRoundsAtShutdown
from swarmd.swarm.upstream.partial_rounds import ReportsPartialRounds
from swarmd.swarm.upstream.robust_aggregation import AggregatesRobustly

__all__ = ["AdmitsAllowedPeers", "admits", "admits_peer", "not_excluded"]

# robust aggregation tells a liar apart from three senders on, and from two when this peer is one of them (its own
# part is the reference: robust_aggregation.py PAIR_OUTLIER_RATIO)
MIN_SENDERS_TO_JUDGE = 3


def admits(allow_list, context: P2PContext, where: str) -> bool:
    return admits_peer(allow_list, context.remote_id, where)


def not_excluded(exclusions, peer_id, where: str) -> bool:
    """`peer_id` (a hivemind PeerID) is not excluded on evidence (`exclusions`: swarm/exclusion.py ExclusionList,
    None when off); a refusal is counted at `where`."""
    return exclusions is None or exclusions.admit(peer_id.to_base58(), where)


def admitted_to_rounds(averager, context, where: str) -> bool:
    """The caller may take part in `averager`'s rounds: on its allow list (if any) and not excluded on evidence."""
    return admits(averager._allow_list, context, where) and not_excluded(averager._exclusions, context.remote_id, where)


def admits_peer(allow_list, peer_id, where: str) -> bool:
    """`peer_id`: the caller libp2p authenticated (a hivemind PeerID)."""
    return allow_list is None or allow_list.admit(peer_id.to_base58(), where)


class AdmitsAllowedPeers(PacedAverager, FinalizesRunningRoundsAtShutdown, ReportsPartialRounds, AggregatesRobustly):
    # (every swarmd averager has this class just above hivemind's, so it also carries the fewer DHT requests of
    # swarm/upstream/averager_pace.py, the shutdown fix, the report of a partial round, swarm/upstream/partial_rounds.py, and the
    # robust reduction of its share, swarm/upstream/robust_aggregation.py)
    _allow_list = None
    _exclusions = None
    # True where this peer does not average in a group of two with a suspect (swarm/upstream/state_averager.py)
    avoids_pairs_with_suspects = False

    def __init__(self, *args, **kwargs):
        # taken before the averager's process starts (inside upstream's __init__) and carried as an attribute, so the
        # list reaches that process whichever way multiprocessing starts it (fork copies the installed one anyway)
        self._allow_list = installed()
        self._exclusions = exclusion.installed()
        super().__init__(*args, **kwargs)

    async def _aggregate_with_group(self, group_info, min_vector_size, **kwargs):
        other = [peer for peer in group_info.peer_ids if peer != self.peer_id]
        if self.avoids_pairs_with_suspects and len(other) == 1 and self._exclusions is not None:
            if self._exclusions.suspected(other[0].to_base58()):
                # a pair's result is the mean of the two (neither can be told the liar): with a peer that has
                # evidence against it, this peer keeps its own values; cancelling the round's future ends the
                # other's wait for this peer's parts at once
                running = self._running_groups.get(group_info.group_id)
                if running is not None:
                    running.cancel()
                raise MatchmakingException(f"not averaging in a group of two with suspect {other[0]} (evidence "
                                           "against it in the exclusion window; a pair cannot outvote a liar)")
        return await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)

    def pair_word_counts(self, peer_id: str) -> bool:
        # a pair's direction confirms evidence this peer holds from elsewhere (rounds of three or more, a refused
        # average, a capped claim), it never starts it: a flipper that other honest peers excluded, and that meets
        # this one in pairs, had been seen in their groups by this one too
        return self._exclusions is None or self._exclusions.suspected(peer_id)

    def _count_outliers(self, runner, epochs=None) -> None:
        super()._count_outliers(runner, epochs)
        if self._exclusions is None:
            return
        reducer = runner.tensor_part_reducer
        clipped = set(reducer.far_senders() if self.judges_whole_share else reducer.clipped_senders())
        clipped |= set(self.opposed_senders(runner, epochs))  # an update pulling against the round: an outlier too
        # a weight (the samples a sender claims) far above the round's median: the claim was capped, a lie there too
        clipped |= set(reducer.overweight_senders(self._exclusions.policy.claim_rate_ratio * SAMPLE_SLACK))
        total = len(runner.sender_peer_ids)
        judged = total >= MIN_SENDERS_TO_JUDGE or (total == 2 and self.peer_id in runner.sender_peer_ids)
        senders = [(peer.to_base58(), index in clipped) for index, peer in enumerate(runner.sender_peer_ids)
                   if peer != self.peer_id and (judged or index in clipped) and reducer.values_sent[index]]
        if senders:
            self._exclusions.report_round(senders)
        refused = [runner.ordered_peer_ids[index].to_base58() for index in getattr(runner, "refused_reducers", ())]
        if refused:
            self._exclusions.report_returned(refused)

    async def rpc_join_group(
        self, request: averaging_pb2.JoinRequest, context: P2PContext
    ) -> AsyncIterator[averaging_pb2.MessageFromLeader]:
        if not admitted_to_rounds(self, context, "join_group"):
            yield averaging_pb2.MessageFromLeader(code=averaging_pb2.NOT_LOOKING_FOR_GROUP)
            return
        async for response in super().rpc_join_group(request, context):
            yield response

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context: P2PContext
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        if not admitted_to_rounds(self, context, "aggregate_part"):
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
