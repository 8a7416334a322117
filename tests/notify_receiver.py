"""A fake systemd for tests: binds a notification socket and records each datagram with the kernel's send time.

The kernel's timestamp (SO_TIMESTAMPNS, wall clock) is when the daemon sent the message, however late this busy
test process gets to read it, so intervals between watchdog pings are measured honestly on a loaded machine.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python does not export it


class NotifyReceiver:
    def __init__(self, address: str):
        """`address`: a path, or "@name" for the abstract namespace (as in $NOTIFY_SOCKET)."""
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []  # (time.time() when sent, text)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="notify-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            self._receive_one()
        # what was sent before close() but not read yet (a CI run lost a STOPPING=1 so): read it now
        self.sock.settimeout(0)
        while self._receive_one():
            pass

    def _receive_one(self) -> bool:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(65536, 1024)
        except (socket.timeout, BlockingIOError):
            return False
        sent = time.time()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                sent = seconds + nanoseconds / 1e9
        self.messages.append((sent, data.decode()))
        return True

    def with_field(self, field: str, start: float = 0.0, end: float = float("inf")) -> list[tuple[float, str]]:
        """Messages with a line starting with `field` (e.g. "WATCHDOG=1", "STATUS="), sent in [start, end]."""
        return [(t, m) for t, m in list(self.messages) if start <= t <= end and any(l.startswith(field) for l in m.split("\n"))]

    def pings(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        return [t for t, _ in self.with_field("WATCHDOG=1", start, end)]

    def wait_for(self, field: str, timeout: float, start: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.with_field(field, start)
            if found:
                return found[0][0]
            time.sleep(0.05)
        raise AssertionError(f"no {field} within {timeout:.0f} s; received: {[m for _, m in self.messages][-10:]}")

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
