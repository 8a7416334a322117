"""Start real `swarmd join` processes for tests, wait on them with bounds, and leave nothing running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import yaml

from swarmd.status.client import read_status
from swarmd.swarm.children import SHM_MANAGER, descendant_pids, process_name

REPO = Path(__file__).resolve().parents[1]
JOIN_LINE = re.compile(r"To join: (swarmd join .*)$", re.M)
# util-linux's setpriv: the daemon gets SIGTERM when the process that started it dies (a test run or benchmark killed:
# SIGTERM, SIGKILL, a CI timeout), and stops as on `systemctl stop`, its p2pd with it, instead of training on as an
# orphan (seen: an attack benchmark stopped with SIGTERM left its four daemons running). Kept across taskset's and
# `ip netns exec`'s exec; where setpriv is missing, close() alone stops them.
DIE_WITH_STARTER = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


def peer_config(**sections) -> dict:
    """A config for fast local swarms: loopback, random port, small batches, short matchmaking."""
    config = {
        "run_id": "test-run",
        "network": {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "bootstrap_attempts": 1},
        "swarm": {
            "target_batch_size": 128,
            "matchmaking_time": 2.0,
            # hivemind's default is matchmaking_time, so 2 s here: on a busy 2-core machine a part came later than
            # that and rounds returned part of the average; 5 s is what the product's default matchmaking gives
            "next_chunk_timeout": 5.0,
            "averaging_timeout": 15.0,
            "load_state_timeout": 30.0,
        },
        "training": {"batch_size": 16, "threads": 1, "seed": 0},
        "checkpoint": {"every_epochs": 2, "keep": 3},
        "daemon": {"shutdown_timeout": 40.0, "tick_interval": 0.5},
        "metrics": {"listen": "127.0.0.1:0"},
        "logging": {"level": "info", "format": "plain"},
    }
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    return config


class DaemonProcess:
    """One `python -m swarmd join` in its own session; `close()` kills it and every descendant."""

    def __init__(self, state_dir: Path, config: dict, *, extra_args=(), env: Optional[dict] = None, name="peer"):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.config_path = self.state_dir.parent / f"{self.state_dir.name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}.log"
        self.args = [
            sys.executable, "-m", "swarmd", "join",
            "--config", str(self.config_path),
            "--state-dir", str(self.state_dir),
            *extra_args,
        ]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: Optional[subprocess.Popen] = None
        self.started_at = 0.0  # unix time of start()
        self._known_descendants: set[int] = set()

    def start(self) -> "DaemonProcess":
        self._log = open(self.log_path, "ab")
        self.started_at = time.time()  # leftover_shared_memory: files older than this are another process's
        self.proc = subprocess.Popen(
            [*DIE_WITH_STARTER, *self.args], stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
            start_new_session=True,
        )
        return self

    # --- observation ---------------------------------------------------------------------------------------

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def status(self) -> dict:
        return read_status(self.state_dir, timeout=5)

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
        """Poll `predicate` until it returns something truthy; fail with the log tail after `timeout`."""
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            self._remember_descendants()
            try:
                value = predicate()
                if value:
                    return value
            except Exception as e:  # noqa: BLE001 - the daemon may not answer yet
                last_error = e
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} while waiting for {what}:\n{self.tail()}")
            time.sleep(interval)
        raise AssertionError(f"{self.name}: timed out after {timeout:.0f} s waiting for {what} ({last_error!r}):\n{self.tail()}")

    def wait_status(self, predicate: Callable[[dict], object], timeout: float, what: str) -> dict:
        holder = {}

        def check():
            holder["status"] = self.status()
            return predicate(holder["status"])

        self.wait_for(check, timeout, what)
        return holder["status"]

    def join_line(self, timeout: float = 90) -> list[str]:
        """The ready-to-paste `swarmd join ...` line, split into arguments."""
        match = self.wait_for(lambda: JOIN_LINE.search(self.log), timeout, "the join line")
        return match.group(1).split()

    def initial_peers(self, timeout: float = 90) -> list[str]:
        words = self.join_line(timeout)
        return [words[i + 1] for i, word in enumerate(words) if word == "--initial-peers"]

    def joining_args(self, timeout: float = 90) -> list[str]:
        """`--initial-peers ADDR ...` for a peer that joins this one."""
        return [arg for addr in self.initial_peers(timeout) for arg in ("--initial-peers", addr)]

    def tail(self, lines: int = 40) -> str:
        """The log's last lines; after a native crash, the crashing thread's stack from faulthandler's dump first
        (it comes before every other thread's, which would fill the tail)."""
        log = self.log.splitlines()
        crash = next((i for i, line in enumerate(log) if line.startswith("Fatal Python error")), None)
        if crash is None:
            return "\n".join(log[-lines:])
        current = next((i for i in range(crash, len(log)) if log[i].startswith("Current thread")), crash)
        end = next((i for i in range(current + 1, len(log)) if not log[i].strip()), len(log))  # that thread's block
        crashed = log[crash: min(end, current + 60)]
        return "\n".join(log[max(0, crash - 10): crash] + crashed + ["..."] + log[-lines // 2:])

    def _remember_descendants(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._known_descendants.update(descendant_pids(self.proc.pid))

    def descendants(self) -> list[int]:
        return descendant_pids(self.proc.pid) if self.proc is not None else []

    # --- stopping ------------------------------------------------------------------------------------------

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM the daemon (its main process only, as systemd's KillMode=mixed does) and wait for the exit."""
        self._remember_descendants()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self._remember_descendants()
        self.proc.kill()
        self.proc.wait(10)

    def leftover_processes(self, grace: float = 5.0) -> list[int]:
        """Processes this daemon ever started that are still alive after `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            alive = [pid for pid in self._known_descendants if _alive(pid)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)

    def leftover_shared_memory(self, grace: float = 15.0) -> list[str]:
        """torch's shared-memory files of this daemon's processes (/dev/shm/torch_<pid>_...) still there after
        `grace` seconds: hivemind shares tensors with torch's file_system strategy, whose manager process removes
        them once all its clients are gone, which may be a moment after the daemon's exit (seen in CI: five files of
        a cleanly stopped peer, an instant after its exit; and one file 5 s after, on a loaded 2-core run). Pids are
        reused (pid_max 32768 here), and a process killed earlier leaves its files by design (daemon/shared_memory.py):
        a file older than this daemon's start was another process's (seen in CI: a file of 07:28 named after the pid
        a peer started at 09:01 had)."""
        pids = {str(pid) for pid in self._known_descendants | {self.proc.pid}}
        deadline = time.monotonic() + grace
        while True:
            left = sorted(
                name for name in os.listdir("/dev/shm") if name.startswith("torch_") and name.split("_")[1] in pids
                and _changed_since(Path("/dev/shm") / name, self.started_at - 1.0)
            )
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc is not None:
            self._remember_descendants()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            for pid in self._known_descendants:
                # torch's shared-memory manager removes the daemon's /dev/shm files once its processes are gone
                # (swarmd/swarm/children.py): killed, it would leave them to fill the machine's memory
                if _alive(pid) and process_name(pid) != SHM_MANAGER:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if getattr(self, "_log", None):
            self._log.close()


def _changed_since(path: Path, moment: float) -> bool:
    """Whether the file at `path` was made (or changed) at or after unix time `moment`; False once it is gone."""
    try:
        return path.stat().st_ctime >= moment
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll `condition` (in this process: an in-process peer's state) until it is truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def run_cli(*args, env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarmd", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def last_json(text: str) -> dict:
    return json.loads(text)


def blocked_imports_env(root: Path, names=("torch", "hivemind", "timm", "transformers")) -> dict:
    """Environment for run_cli where importing `names` fails loudly: proves a command does not import them."""
    for name in names:
        package = Path(root) / "blocked" / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return {"PYTHONPATH": os.pathsep.join([str(Path(root) / "blocked"), str(REPO)])}


def scrape(address: str, timeout: float = 10) -> str:
    """The text of http://ADDRESS/metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
        return response.read().decode()


def promtool(*args: str, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run promtool. Skips where it is missing, but fails under SWARMD_REQUIRE_TOOLS=1 (as CI runs)."""
    import shutil

    import pytest

    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("SWARMD_REQUIRE_TOOLS") == "1":
            pytest.fail("promtool is required (SWARMD_REQUIRE_TOOLS=1) but missing: apt-get install prometheus")
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return subprocess.run([path, *args], input=input, capture_output=True, text=True, timeout=60)


def promtool_check(text: str) -> subprocess.CompletedProcess:
    """`promtool check metrics` on the text of a scrape."""
    return promtool("check", "metrics", input=text)
