import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemons import DaemonProcess  # noqa: E402

# Keep child processes from fighting over the two cores of a CI box.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory) -> Path:
    """One generated image folder for every daemon of the session (each would otherwise draw its own)."""
    return tmp_path_factory.mktemp("shared-data")


@pytest.fixture
def daemons(tmp_path):
    """Factory of DaemonProcess objects; every process they started is killed at teardown."""
    started: list[DaemonProcess] = []

    def start(name: str, config: dict, *, extra_args=(), env=None, state_dir=None) -> DaemonProcess:
        daemon = DaemonProcess(state_dir or tmp_path / name, config, extra_args=extra_args, env=env, name=name)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.close()


@pytest.fixture(scope="session")
def testtasks_env(tmp_path_factory) -> dict:
    """Environment for daemons that can run the test-only `faulty` task, installed like a third-party plug-in."""
    target = tmp_path_factory.mktemp("testtasks")
    package = Path(__file__).resolve().parent / "fixtures" / "testtasks"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(package)],
        check=True,
        timeout=300,
    )
    path = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}
