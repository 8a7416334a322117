"""Logging for a daemon: rich on a terminal, single-line plain records for journald, or JSON for log shippers.

hivemind's loggers are routed through the same handler, at their own level (`logging.hivemind_level`), and the
spurious connection errors its processes log while shutting down are demoted to DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["configure_logging", "route_hivemind_logs"]

_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_SHUTDOWN_NOISE = (FileNotFoundError, ConnectionResetError, BrokenPipeError, EOFError)


class _SingleLineFormatter(logging.Formatter):
    """One record per line, as journald and grep expect: a traceback is folded onto the same line."""

    def __init__(self):
        super().__init__(_PLAIN_FORMAT)

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's API
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "").replace("\n", " | ")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _DemoteShutdownNoise(logging.Filter):
    """hivemind's DHT and averager processes log connection errors when their peers close; not operator news."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("hivemind") and record.levelno >= logging.WARNING:
            error = record.exc_info[1] if record.exc_info else None
            text = record.getMessage()
            if isinstance(error, _SHUTDOWN_NOISE) or any(n.__name__ in text for n in _SHUTDOWN_NOISE):
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
                return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def configure_logging(level: str = "info", fmt: str = "auto", stream=None) -> None:
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "rich" if stream.isatty() else "plain"
    if fmt == "rich":
        from rich.console import Console
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=Console(file=stream), show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(_JsonFormatter() if fmt == "json" else _SingleLineFormatter())
    handler.addFilter(_DemoteShutdownNoise())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.ERROR)


def route_hivemind_logs(level: str) -> None:
    """Send hivemind's records through our handler (call after hivemind is imported)."""
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")
    logging.getLogger("hivemind").setLevel(level.upper())
