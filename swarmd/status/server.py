"""The local status API: a Unix socket in the state dir (mode 0600) answering JSON snapshots.

Protocol (one request per connection): the client sends one line, `status` (or a JSON object with a "method"),
and reads one line of JSON back. Errors come back as {"error": "..."}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Callable

from swarmd.errors import StartupError
from swarmd.status.client import SOCKET_NAME

__all__ = ["SOCKET_NAME", "StatusServer"]

logger = logging.getLogger(__name__)
_REQUEST_LIMIT = 4096


class StatusServer:
    def __init__(self, path: Path, snapshot: Callable[[], dict[str, Any]]):
        self.path = Path(path)
        self._snapshot = snapshot
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._remove_stale_socket()
        old_umask = os.umask(0o177)  # the socket is created 0600: only the daemon's user may read the status
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), limit=_REQUEST_LIMIT)
        except OSError as e:
            raise StartupError(f"cannot create the status socket {self.path}: {e.strerror}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _remove_stale_socket(self) -> None:
        """A socket left by a daemon that was killed: nothing answers on it, so it can go."""
        if not self.path.exists():
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink(missing_ok=True)
            return
        finally:
            probe.close()
        raise StartupError(f"another swarmd answers on {self.path}; stop it first or use another --state-dir")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5.0)
            response = self._respond(line.decode("utf-8", errors="replace").strip())
            writer.write(json.dumps(response, default=str).encode() + b"\n")
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
            logger.debug("status client dropped: %r", e)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _respond(self, request: str) -> dict[str, Any]:
        method = request
        if request.startswith("{"):
            try:
                method = json.loads(request).get("method", "")
            except (ValueError, AttributeError):
                return {"error": "the request is not valid JSON"}
        if method in ("", "status"):
            return self._snapshot()
        return {"error": f"unknown method {method!r}; known: status"}
