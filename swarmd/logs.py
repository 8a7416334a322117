"""Logging for a daemon: rich on a terminal, single-line plain records for journald, or JSON for log shippers.

Plain and JSON records are one line each (a traceback is folded onto it) and carry no terminal escape codes, even
when a library put some in a message. When stderr is the journal ($JOURNAL_STREAM names it, as systemd sets it),
each line starts with its syslog priority (`<3>` error ... `<7>` debug), so `journalctl -p warning` filters by
level, and the plain format leaves the timestamp to journald. Uncaught exceptions, in any thread, are logged as
one record too. On a terminal rich wraps records to its width, except a record logged with `extra=UNWRAPPED` (a
command to paste, such as the `To join:` line): that one is written as one line whatever the width, and the
terminal folds it only on screen.

hivemind's loggers are routed through the same handler, at their own level (`logging.hivemind_level`). What
hivemind reports as warnings and errors whenever peers come and go or the daemon stops (connection errors in its
processes, "could not find a group", "did not shut down within the grace period", asyncio's "Task was destroyed
but it is pending" for the tasks hivemind leaves behind at exit) is demoted to DEBUG, and partial averaging rounds
("Averaging: received 94.1% results", a peer left mid-round) to INFO: swarmd says what matters in its own words
(the averaging log, "Averaging gradients failed ...", leftover processes).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time

__all__ = ["UNWRAPPED", "configure_logging", "route_hivemind_logs"]

# `extra=` of a record that must stay one line on a terminal too (a command a user copies and pastes)
UNWRAPPED = {"swarmd_unwrapped": True}

_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_JOURNAL_FORMAT = "%(levelname)s %(name)s: %(message)s"  # journald stamps each line itself
_SHUTDOWN_NOISE = (FileNotFoundError, ConnectionResetError, BrokenPipeError, EOFError)
_CHURN_NOISE = (  # peers leaving, or this peer stopping: nothing to act on
    "could not find a group",
    "did not shut down within the grace period",
    "Task was destroyed but it is pending",  # asyncio, at exit: tasks hivemind's progress tracker leaves behind
    # a peer that has just stopped still appears in the DHT for a while; trying it fails like this. The download
    # goes on with the next peer, and SwarmOptimizer warns if every attempt fails.
    "protocols not supported",
)
_PARTIAL_ROUND = ("Reducer: received", "Averaging: received")  # a peer left mid-round: a partial average, as INFO
_NOISY_LOGGERS = ("hivemind", "asyncio")  # asyncio: hivemind's unretrieved futures failing with the errors above
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_SYSLOG_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def _one_line(text: str) -> str:
    return _ESCAPES.sub("", text).replace("\r", "").replace("\n", " | ")


def _priority(levelno: int) -> int:
    """syslog priority of a level (sd-daemon(3)): the nearest standard level at or below it."""
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return _SYSLOG_PRIORITY[level]
    return _SYSLOG_PRIORITY[logging.DEBUG]


class _SingleLineFormatter(logging.Formatter):
    """One record per line, as journald and grep expect: a traceback is folded onto the same line."""

    def __init__(self, journal: bool = False):
        super().__init__(_JOURNAL_FORMAT if journal else _PLAIN_FORMAT)
        self.journal = journal

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's API
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"

    def format(self, record: logging.LogRecord) -> str:
        line = _one_line(super().format(record))
        return f"<{_priority(record.levelno)}>{line}" if self.journal else line


class _JsonFormatter(logging.Formatter):
    def __init__(self, journal: bool = False):
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _ESCAPES.sub("", record.getMessage()),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exception"] = _ESCAPES.sub("", self.formatException(record.exc_info))
        line = json.dumps(entry, default=str)
        return f"<{_priority(record.levelno)}>{line}" if self.journal else line


class _DemoteShutdownNoise(logging.Filter):
    """hivemind reports peers leaving and its own stop as warnings and errors; not operator news (see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and record.name.startswith(_NOISY_LOGGERS):
            error = record.exc_info[1] if record.exc_info else None
            text = record.getMessage()
            if (
                isinstance(error, _SHUTDOWN_NOISE)
                or any(n.__name__ in text for n in _SHUTDOWN_NOISE)
                or any(n in text for n in _CHURN_NOISE)
            ):
                return _demote(record, logging.DEBUG)
            if text.startswith(_PARTIAL_ROUND):
                return _demote(record, logging.INFO)
        return True


def _demote(record: logging.LogRecord, level: int) -> bool:
    """Lower the record's level; keep it only if its logger would have logged it at that level."""
    record.levelno, record.levelname = level, _LEVEL_NAMES[level]
    return logging.getLogger(record.name).isEnabledFor(level)


# Our own level names: importing hivemind renames WARNING to "WARN" process-wide (logging.addLevelName).
_LEVEL_NAMES = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}


class _StableLevelNames(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.levelname = _LEVEL_NAMES.get(record.levelno, record.levelname)
        return True


def _rich_handler(stream) -> logging.Handler:
    """rich's handler, but a record marked UNWRAPPED is printed as one line (rich's soft wrap: no newline inserted,
    the terminal folds it on screen only), so that a pasted command keeps every argument with its value."""
    from rich.console import Console
    from rich.logging import RichHandler
    from rich.text import Text

    class _Handler(RichHandler):
        def emit(self, record: logging.LogRecord) -> None:
            if not getattr(record, "swarmd_unwrapped", False):
                super().emit(record)
                return
            try:
                stamp = time.strftime("[%x %X]", time.localtime(record.created))
                line = Text.assemble((stamp, "log.time"), " ", self.get_level_text(record), " ", self.format(record))
                self.console.print(line, soft_wrap=True)
            except Exception:  # noqa: BLE001 - logging's own contract
                self.handleError(record)

    return _Handler(console=Console(file=stream), show_path=False, rich_tracebacks=False)


def _is_journal(stream) -> bool:
    """Whether `stream` is the journal: $JOURNAL_STREAM is "device:inode" of the stream systemd connected."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        stat = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not backed by a file descriptor
        return False
    return (stat.st_dev, stat.st_ino) == (int(device), int(inode))


def _log_uncaught_exceptions() -> None:
    """Uncaught exceptions become one ERROR record (a raw multi-line traceback would be many journal entries)."""
    logger = logging.getLogger("swarmd")

    def main_thread_hook(kind, value, traceback):
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, traceback)
            return
        logger.critical("Uncaught exception: %s", value, exc_info=(kind, value, traceback))

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "a thread"
        logger.error(
            "Uncaught exception in %s: %s", name, args.exc_value, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
        )

    sys.excepthook = main_thread_hook
    threading.excepthook = thread_hook


def configure_logging(level: str = "info", fmt: str = "auto", stream=None) -> None:
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "rich" if stream.isatty() else "plain"
    if fmt == "rich":
        handler: logging.Handler = _rich_handler(stream)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        journal = _is_journal(stream)
        handler = logging.StreamHandler(stream)
        handler.setFormatter(_JsonFormatter(journal) if fmt == "json" else _SingleLineFormatter(journal))
        _log_uncaught_exceptions()
    handler.addFilter(_StableLevelNames())
    handler.addFilter(_DemoteShutdownNoise())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    if "hivemind.utils.logging" in sys.modules:  # already imported: its own handler would bypass ours
        _take_over_hivemind_records()
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.ERROR)


def route_hivemind_logs(level: str) -> None:
    """Send hivemind's records through our handler (call after hivemind is imported)."""
    _take_over_hivemind_records()
    logging.getLogger("hivemind").setLevel(level.upper())


def _take_over_hivemind_records() -> None:
    """hivemind gives its loggers their own handler and stops propagation; undo that."""
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("nowhere")
