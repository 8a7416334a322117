"""The HTTP server of a metrics port: a thread per request, in a daemon thread of its own (standard library only).

What prometheus_client's `start_http_server` does, with any WSGI app (app.py's, which hands /metrics to
prometheus_client's own app). A slow browser never holds up a scrape: each request has its thread.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["serve"]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # nothing gathers the request threads: a stuck client cannot block close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - a line per request would flood the daemon's log
        pass


def serve(app: Callable, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Listen on host:port (IPv6 too; port 0: any free port) and serve `app`. Raises OSError when it cannot bind."""
    family, address = _family(host, port)
    server_class = type("_BoundServer", (_Server,), {"address_family": family})
    server = make_server(address, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="swarmd-http", daemon=True)
    thread.start()
    return server, thread


def _family(host: str, port: int) -> tuple[int, str]:
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, sockaddr[0]
