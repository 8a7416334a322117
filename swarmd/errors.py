"""Typed user-facing errors and the exit codes they map to.

Library code raises these; only the CLI edge turns them into one line on stderr and an exit code, so no user
error ever ends in a traceback.
"""

from __future__ import annotations

import enum

__all__ = [
    "ExitCode",
    "SwarmdError",
    "ConfigError",
    "StartupError",
    "DaemonNotRunning",
    "TrainingFailed",
]


class ExitCode(enum.IntEnum):
    """Exit codes of every swarmd command (documented in the README; systemd's unit keys on 2)."""

    OK = 0  # clean stop
    FAILURE = 1  # failed while running (or: no daemon to talk to)
    USAGE = 2  # bad command line or configuration: restarting will not help
    START_FAILED = 3  # could not start: no initial peer reachable, port taken, state dir unusable


class SwarmdError(Exception):
    """An error with a one-line message meant for the operator."""

    exit_code: ExitCode = ExitCode.FAILURE


class ConfigError(SwarmdError):
    exit_code = ExitCode.USAGE


class StartupError(SwarmdError):
    exit_code = ExitCode.START_FAILED


class DaemonNotRunning(SwarmdError):
    exit_code = ExitCode.FAILURE


class TrainingFailed(SwarmdError):
    exit_code = ExitCode.FAILURE
