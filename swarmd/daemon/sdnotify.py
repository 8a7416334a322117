"""The sd_notify protocol: newline-separated KEY=VALUE lines in one datagram to the socket in $NOTIFY_SOCKET.

Written out (about 40 lines) rather than taken from a library: the protocol is small and stable (sd_notify(3)),
`systemd-python` needs libsystemd headers and a C build on every volunteer's box, and the pure-Python `sdnotify`
package has had no release since 2017 and hides every send error. What this needs that they would have to be
checked for: abstract-namespace sockets (`@name`), the $WATCHDOG_PID check, and a bounded send.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Optional

__all__ = ["Notifier", "WatchdogSettings", "watchdog_settings"]

logger = logging.getLogger(__name__)

_SEND_TIMEOUT_SECONDS = 1.0  # systemd reads at once; a test receiver that stopped reading must not hang the loop


class Notifier:
    """Sends notifications to the service manager. `from_environment` gives None outside a Type=notify service."""

    def __init__(self, address: str):
        if address.startswith("@"):
            self.address = "\0" + address[1:]  # abstract namespace (Linux): no file on disk
        elif address.startswith("/"):
            self.address = address
        else:  # e.g. systemd 253's vsock: addresses, for virtual machines
            raise ValueError(f"NOTIFY_SOCKET={address!r} is not a Unix socket path or @abstract name")
        self._socket: Optional[socket.socket] = None
        self._warned = False

    @classmethod
    def from_environment(cls, environ: Optional[MutableMapping[str, str]] = None) -> Optional["Notifier"]:
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET", "")
        if not address:
            return None
        try:
            return cls(address)
        except ValueError as e:
            logger.warning("Not notifying systemd: %s", e)
            return None

    def send(self, *lines: str) -> bool:
        """One datagram, e.g. send("READY=1", "STATUS=training"); False (logged once) if it could not be sent."""
        message = "\n".join(lines).encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.settimeout(_SEND_TIMEOUT_SECONDS)
            self._socket.sendto(message, self.address)
            return True
        except OSError as e:
            if not self._warned:
                self._warned = True
                logger.warning("Could not notify systemd through %r: %s", self.address.replace("\0", "@"), e)
            return False

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


@dataclass(frozen=True)
class WatchdogSettings:
    timeout: float  # seconds: systemd acts when no WATCHDOG=1 arrived for this long

    @property
    def interval(self) -> float:
        """How often to ping: half the timeout, as sd_watchdog_enabled(3) recommends."""
        return self.timeout / 2


def watchdog_settings(environ: Optional[MutableMapping[str, str]] = None) -> Optional[WatchdogSettings]:
    """The watchdog systemd expects from this process ($WATCHDOG_USEC, $WATCHDOG_PID), or None."""
    environ = os.environ if environ is None else environ
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec:
        return None
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (e.g. a wrapper that started us)
    try:
        timeout = int(usec) / 1e6
    except ValueError:
        logger.warning("Ignoring WATCHDOG_USEC=%r: not a number of microseconds", usec)
        return None
    return WatchdogSettings(timeout) if timeout > 0 else None
