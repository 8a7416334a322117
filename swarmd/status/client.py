"""Read the local daemon's status over its Unix socket. Standard library only: `swarmd status` starts fast."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from swarmd.errors import DaemonNotRunning

__all__ = ["SOCKET_NAME", "read_status", "socket_path"]

SOCKET_NAME = "swarmd.sock"


def socket_path(state_dir: str | Path) -> Path:
    return Path(state_dir).expanduser() / SOCKET_NAME


def read_status(state_dir: str | Path, *, timeout: float = 5.0) -> dict[str, Any]:
    path = socket_path(state_dir)
    if not path.exists():
        raise DaemonNotRunning(
            f"no swarmd daemon is running with state dir {path.parent} (no socket at {path}); "
            "start one with `swarmd join`, or pass the daemon's --state-dir"
        )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        sock.sendall(b"status\n")
        chunks = []
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except (ConnectionRefusedError, FileNotFoundError):
        raise DaemonNotRunning(
            f"no swarmd daemon answers on {path} (a stale socket: the daemon is not running); start it with `swarmd join`"
        ) from None
    except PermissionError:
        raise DaemonNotRunning(f"cannot open {path}: permission denied (run as the daemon's user)") from None
    except socket.timeout:
        raise DaemonNotRunning(f"the daemon on {path} did not answer within {timeout:.0f} s") from None
    finally:
        sock.close()
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        raise DaemonNotRunning(f"the daemon on {path} sent an unreadable answer") from None
    if "error" in answer:
        raise DaemonNotRunning(f"the daemon on {path} answered: {answer['error']}")
    return answer
