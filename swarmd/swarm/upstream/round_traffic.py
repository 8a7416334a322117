"""The bytes of one all-reduce, as this peer's averager process sent and received them: the flight recorder's
`sent_bytes` / `received_bytes` of a round (swarm/averaging_log.py RoundTimeline).

hivemind's AllReduceRunner moves a round's tensors as protobuf messages on libp2p streams, in both of a peer's
roles: as a SENDER it streams its parts to each reducer (`_generate_input_for_peer`) and reads the averaged parts
back (the reducer's `rpc_aggregate_part` answer); as a REDUCER of its own share it reads the other senders' parts
and answers each with its averaged part (`_accumulate_parts_streaming`). `CountsRoundBytes` counts each message's
serialized size (`ByteSize()`, what goes on the stream before libp2p's framing) at those four places, without
touching upstream's loops. The parts this peer reduces for itself never leave the process and are not counted.
"""

from __future__ import annotations

from typing import AsyncIterator

from hivemind.averaging.allreduce import AllReduceRunner

__all__ = ["CountsRoundBytes"]


class CountsRoundBytes(AllReduceRunner):
    """An all-reduce runner that counts the bytes of the messages it sends (`sent_bytes`) and receives
    (`received_bytes`) over the network in its round; as it is, upstream's plain weighted mean, counted
    (`swarm.aggregation.method: mean`)."""

    sent_bytes = 0
    received_bytes = 0

    async def _generate_input_for_peer(self, peer_index: int):
        async for message in super()._generate_input_for_peer(peer_index):
            self.sent_bytes += message.ByteSize()
            yield message

    async def _accumulate_parts_streaming(self, stream: AsyncIterator, sender_index: int):
        async for message in super()._accumulate_parts_streaming(self._counted(stream), sender_index):
            self.sent_bytes += message.ByteSize()
            yield message

    def _get_peer_stub(self, peer):
        return _CountingStub(super()._get_peer_stub(peer), self)

    async def _counted(self, stream: AsyncIterator) -> AsyncIterator:
        async for message in stream:
            self.received_bytes += message.ByteSize()
            yield message


class _CountingStub:
    """A reducer's stub whose `rpc_aggregate_part` answers (the averaged parts this peer gets back) are counted;
    the only call upstream's runner makes on it."""

    def __init__(self, stub, runner: CountsRoundBytes):
        self._stub, self._runner = stub, runner

    async def rpc_aggregate_part(self, inputs, *args, **kwargs):
        answers = await self._stub.rpc_aggregate_part(inputs, *args, **kwargs)
        return self._runner._counted(answers)
