"""The state dir: made usable, and locked so that one daemon at a time uses it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Optional

from swarmd.errors import StartupError

__all__ = ["StateDirLock", "LOCK_NAME"]

LOCK_NAME = "swarmd.lock"


class StateDirLock:
    """`acquire()` creates the dir (0700), checks it is writable and takes an exclusive lock holding our pid."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file: Optional[IO[str]] = None

    def acquire(self) -> None:
        self._check_writable()
        lock = open(self.path / LOCK_NAME, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise StartupError(
                f"another swarmd (pid {holder}) is running with state dir {self.path}; "
                "stop it or give this peer its own --state-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._file = lock

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _check_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.path / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise StartupError(
                f"the state dir {self.path} is not usable ({e.strerror}); pass a writable --state-dir"
            ) from None
