"""hivemind's DHT process, minus a shutdown race of hivemind 1.1.12 (`hivemind/dht/dht.py`, `DHT.run`).

A request to the DHT process carries its caller's reply pipe, which the DHT process fetches from the caller's
process while it unpickles the request. An averager process that exits (at the optimizer's shutdown) right after
sending a matchmaking request leaves nothing to fetch it from. Upstream then logs a ConnectionRefusedError with
its traceback, or, when the caller died mid-transfer, the DHT process dies of an EOFError it does not catch.
Nobody waits for the answer to such a request, so it is dropped here, quietly.
"""

from __future__ import annotations

import logging
from multiprocessing.reduction import ForkingPickler

import hivemind

__all__ = ["ToleratesExitedCallers"]

logger = logging.getLogger(__name__)

_DROP = "_drop_request"


class ToleratesExitedCallers(hivemind.DHT):
    def run(self) -> None:
        self._inner_pipe = _RequestPipe(self._inner_pipe)  # runs in the DHT process: upstream's loop reads this
        super().run()

    async def _drop_request(self) -> None:
        pass


class _RequestPipe:
    """The DHT process's end of its request pipe; a request whose caller has exited reads as `_drop_request`."""

    def __init__(self, connection):
        self._connection = connection

    def fileno(self) -> int:
        return self._connection.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._connection.poll(timeout)

    def recv(self):
        message = self._connection.recv_bytes()  # a broken pipe still raises here, as upstream expects
        try:
            return ForkingPickler.loads(message)
        except (EOFError, OSError) as e:  # the caller's resource sharer is gone: refused, not found, reset or EOF
            logger.debug("Dropped a DHT request from a process that has exited (%r)", e)
            return _DROP, [], {}

    def close(self) -> None:
        self._connection.close()
