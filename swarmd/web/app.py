"""The WSGI app of a peer's metrics port: the page, its data, its static files, and /metrics. `swarmd monitor`
serves the same app on its own port, with the swarm's page at `/` (monitor/page.py).

    /             the peer's own page (render.py), server-rendered from the latest snapshot
    /api/status   the snapshot as JSON: what the status socket serves (`swarmd status --json`), with NaN and
                  infinities as null so that a browser's JSON.parse takes it
    /static/NAME  the files of static/ (the page's script and style, vendored uPlot)
    /metrics      prometheus_client's app over the daemon's registry

It runs on the HTTP server's threads (server.py): it reads the snapshot the loop built, never waits on the loop.
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from swarmd.web.render import render_peer_page

__all__ = ["PeerApp", "STATIC", "STATIC_FILES", "SECURITY_HEADERS", "status_json"]

logger = logging.getLogger("swarmd.web")

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = ("swarmd-page.js", "swarmd-page.css", "uPlot.iife.min.js", "uPlot.min.css")  # what /static/ serves

# Scripts only from this origin, none inline: an escaping mistake would still run no one's script.
SECURITY_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]


class PeerApp:
    """`snapshot()` returns the latest Snapshot (status/snapshot.py; anything with `to_dict()`, or a dict).
    `render`: its dict -> the HTML of `/` (a peer's own page; the monitor's passes render_monitor_page)."""

    def __init__(self, snapshot: Callable[[], Any], *, metrics_app: Optional[Callable] = None,
                 render: Callable[[dict], str] = render_peer_page):
        self.snapshot = snapshot
        self.metrics_app = metrics_app
        self.render = render
        self._failed = False  # a failure was logged with its traceback; the next ones go to debug

    def __call__(self, environ, start_response) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics" and self.metrics_app is not None:
            return self.metrics_app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _respond(start_response, "405 Method Not Allowed", "text/plain", b"use GET\n",
                            [("Allow", "GET, HEAD")], method)
        try:
            status, content_type, body, headers = self._route(path)
        except Exception:  # noqa: BLE001 - a page must not take the metrics down; a browser polls: log it once
            logger.log(logging.DEBUG if self._failed else logging.ERROR, "web: %s failed", path, exc_info=True)
            self._failed = True
            status, content_type, body, headers = "500 Internal Server Error", "text/plain", b"see the log\n", []
        return _respond(start_response, status, content_type, body, headers, method)

    def _route(self, path: str) -> tuple[str, str, bytes, list]:
        if path == "/":
            html = self.render(_as_dict(self.snapshot()))
            return "200 OK", "text/html; charset=utf-8", html.encode(), [("Cache-Control", "no-store")]
        if path == "/api/status":
            return "200 OK", "application/json", status_json(_as_dict(self.snapshot())), [("Cache-Control", "no-store")]
        if path.startswith("/static/") and path[len("/static/"):] in STATIC_FILES:
            file = STATIC / path[len("/static/"):]
            content_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            if content_type.startswith("text/") or content_type.endswith("javascript"):
                content_type += "; charset=utf-8"
            return "200 OK", content_type, file.read_bytes(), [("Cache-Control", "max-age=3600")]
        return "404 Not Found", "text/plain", b"not found: try / (the page), /api/status or /metrics\n", []


def status_json(snapshot: dict) -> bytes:
    """The snapshot as the status socket encodes it (`default=str`), non-finite numbers as null."""
    return json.dumps(_finite(snapshot), default=str, allow_nan=False).encode()


def _as_dict(snapshot) -> dict:
    return snapshot.to_dict() if hasattr(snapshot, "to_dict") else dict(snapshot)


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _respond(start_response, status: str, content_type: str, body: bytes, headers: list, method: str):
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), *SECURITY_HEADERS, *headers]
    start_response(status, headers)
    return [b"" if method == "HEAD" else body]
