"""An averager that shuts down cleanly while one of its rounds runs.

hivemind 1.1.12's `DecentralizedAverager._shutdown` calls `.finalize(cancel=True)` on every value of
`_running_groups`, but those values are the asyncio.Futures that the all-reduce runner is set into
(averager.py l.505 and l.553), not runners: a peer stopped during a round logged "AttributeError: '_asyncio.Future'
object has no attribute 'finalize'" with a traceback from the averager's thread (seen in CI:
tests/swarm/test_service.py::test_two_peers_stop_without_errors_in_their_logs), and the round was not finalized.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from hivemind.averaging import DecentralizedAverager

__all__ = ["FinalizesRunningRoundsAtShutdown"]


class FinalizesRunningRoundsAtShutdown(DecentralizedAverager):
    async def _shutdown(self, timeout: Optional[float]) -> None:
        if not self.client_mode:
            await self.remove_p2p_handlers(self._p2p, namespace=self.prefix)
        remaining = set()
        for group in list(self._running_groups.values()):
            if isinstance(group, asyncio.Future):
                if not group.done():
                    group.cancel()  # its runner never came: nothing to finalize, and nobody should wait for it
                    continue
                if group.cancelled() or group.exception() is not None:
                    continue
                group = group.result()
            remaining.update(group.finalize(cancel=True))
        await asyncio.wait_for(asyncio.gather(*remaining), timeout)
